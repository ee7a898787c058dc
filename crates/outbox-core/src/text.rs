//! Untrusted text (keys, types, errors, member ids: anything a row or a broker supplied) made
//! safe to show. The one rule, for a terminal and for a web page alike: a character that would
//! act instead of being read is shown by name, visibly, and nothing else changes.
//!
//! Such characters are the C0 and C1 controls and DEL (a terminal obeys them: `ESC[2J` clears
//! the screen, a CR rewrites the line, a BEL rings), the bidirectional formatting characters
//! (U+202E reorders the text around it, so a key `user⟨RLO⟩gnp.exe` reads "userexe.png" and a
//! sentence holding it reads backwards), the line and paragraph separators, and a few invisible
//! ones (U+200B, U+2060, U+FEFF) that make what is seen differ from what must be typed.
//!
//! Each is shown as `⟨NAME⟩` (`⟨ESC⟩`, `⟨CR⟩`, `⟨NUL⟩`) for the C0 controls and DEL, else as
//! `⟨U+202E⟩`. The opening bracket `⟨` is itself shown as `⟨U+27E8⟩`, so the rendering can be
//! read back without doubt: a literal `⟨ESC⟩` typed into a key cannot pass for an escape.
//! Text that is only *written* like an escape (`\x1b`, `\u0000`, `%00`) is ordinary text and is
//! shown as it is.
//!
//! [`terminal`] and [`Terminal`] render for a terminal (every command's text output and the text
//! log format use them); [`pieces`] splits text for renderers that mark the shown names up
//! (the console's HTML).

use std::borrow::Cow;
use std::fmt;

/// The names of the C0 controls, U+0000 to U+001F.
const C0: [&str; 32] = [
    "NUL", "SOH", "STX", "ETX", "EOT", "ENQ", "ACK", "BEL", "BS", "TAB", "LF", "VT", "FF", "CR",
    "SO", "SI", "DLE", "DC1", "DC2", "DC3", "DC4", "NAK", "SYN", "ETB", "CAN", "EM", "SUB", "ESC",
    "FS", "GS", "RS", "US",
];

/// Whether `c` must not be shown raw (see the module documentation).
pub fn is_hidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{61c}'
        | '\u{200b}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'
        | '\u{2066}'..='\u{2069}'
        | '\u{feff}'
        | '⟨'
    )
}

/// How a hidden character is shown, without the brackets: `ESC`, `DEL`, `U+202E`.
pub fn name(c: char) -> Cow<'static, str> {
    match c as u32 {
        n @ 0..=0x1f => Cow::Borrowed(C0[n as usize]),
        0x7f => Cow::Borrowed("DEL"),
        n => Cow::Owned(format!("U+{n:04X}")),
    }
}

/// A run of text as a renderer meets it: plain text to show as it is (after the renderer's own
/// escaping, e.g. HTML's), or one character to show by its [`name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Text with no hidden character.
    Text(&'a str),
    /// A character to show by name.
    Hidden(char),
}

/// `s` split into plain runs and hidden characters, in order.
pub fn pieces(s: &str) -> impl Iterator<Item = Piece<'_>> {
    let mut rest = s;
    std::iter::from_fn(move || {
        let mut chars = rest.char_indices();
        let (_, first) = chars.next()?;
        if is_hidden(first) {
            rest = &rest[first.len_utf8()..];
            return Some(Piece::Hidden(first));
        }
        let end = chars
            .find(|(_, c)| is_hidden(*c))
            .map_or(rest.len(), |(i, _)| i);
        let (text, after) = rest.split_at(end);
        rest = after;
        Some(Piece::Text(text))
    })
}

/// `s` as a terminal may show it: every hidden character as `⟨NAME⟩`; borrowed when there is
/// none.
pub fn terminal(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_hidden) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(Terminal(s).to_string())
}

/// Displays `T` as [`terminal`] renders text, without building the unsafe string first: for
/// log fields and `format!` arguments.
#[derive(Debug, Clone, Copy)]
pub struct Terminal<T>(pub T);

impl<T: fmt::Display> fmt::Display for Terminal<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        write!(Escaping(f), "{}", self.0)
    }
}

/// A writer that shows hidden characters by name on their way to `W`.
struct Escaping<W>(W);

impl<W: fmt::Write> fmt::Write for Escaping<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for piece in pieces(s) {
            match piece {
                Piece::Text(t) => self.0.write_str(t)?,
                Piece::Hidden(c) => {
                    self.0.write_char('⟨')?;
                    self.0.write_str(&name(c))?;
                    self.0.write_char('⟩')?;
                }
            }
        }
        Ok(())
    }
}

/// `s` cut to at most `max` characters on a character boundary, with `…` when it was cut: for
/// values shown in a line or a cell whose whole is shown elsewhere.
pub fn cut(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some((at, _)) => Cow::Owned(format!("{}…", &s[..at])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_overrides_are_shown_by_name() {
        assert_eq!(
            terminal("ansi\u{1b}[2J\u{1b}[31mRED\u{7}\r\0"),
            "ansi⟨ESC⟩[2J⟨ESC⟩[31mRED⟨BEL⟩⟨CR⟩⟨NUL⟩"
        );
        assert_eq!(terminal("user\u{202e}gnp.exe"), "user⟨U+202E⟩gnp.exe");
        assert_eq!(
            terminal("a\u{9b}b\u{2066}c\u{feff}"),
            "a⟨U+009B⟩b⟨U+2066⟩c⟨U+FEFF⟩"
        );
        assert_eq!(terminal("tab\there\nnext"), "tab⟨TAB⟩here⟨LF⟩next");
    }

    #[test]
    fn ordinary_text_is_left_alone_and_borrowed() {
        for s in [
            "order/placed",
            r"literal \x1b and \u0000 and %00",
            "zalgo Z̷̢a͓l̶g̸o, emoji 🙂‍↔️, 漢字",
            "",
        ] {
            assert!(matches!(terminal(s), Cow::Borrowed(_)), "{s}");
        }
    }

    #[test]
    fn the_rendering_reads_back_without_doubt() {
        // A key that types out what an escaped ESC looks like is not shown as one.
        assert_eq!(terminal("⟨ESC⟩"), "⟨U+27E8⟩ESC⟩");
        assert_ne!(terminal("⟨ESC⟩"), terminal("\u{1b}"));
    }

    #[test]
    fn pieces_split_text_around_hidden_characters() {
        let got: Vec<Piece> = pieces("a\u{1b}bc\u{202e}").collect();
        assert_eq!(
            got,
            [
                Piece::Text("a"),
                Piece::Hidden('\u{1b}'),
                Piece::Text("bc"),
                Piece::Hidden('\u{202e}')
            ]
        );
        assert_eq!(pieces("").count(), 0);
    }

    #[test]
    fn a_display_value_is_escaped_as_it_is_written() {
        let line = format!("key={}", Terminal(format_args!("{}-{}", "a\u{1b}", 7)));
        assert_eq!(line, "key=a⟨ESC⟩-7");
    }

    #[test]
    fn cut_keeps_whole_characters() {
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("漢字漢字", 2), "漢字…");
        assert_eq!(cut("abc", 3), "abc");
    }

    proptest::proptest! {
        #[test]
        fn no_hidden_character_survives(s in "\\PC*|[\\x00-\\x1f\\x7f-\\x9f\u{202a}-\u{202e}a-z]*") {
            let shown = terminal(&s);
            proptest::prop_assert!(!shown.chars().any(|c| c.is_control() || (is_hidden(c) && c != '⟨')));
        }
    }
}
