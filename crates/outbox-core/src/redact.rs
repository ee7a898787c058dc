//! Keeps secrets and oversized text out of logs, error messages and the `last_error` column.

/// Longest error text kept; longer text is cut (a broker may echo a whole payload back).
pub const MAX_ERROR_LEN: usize = 1000;

/// Removes passwords from any URL in `text` (`scheme://user:secret@host` becomes
/// `scheme://user:***@host`), replaces control characters (a NUL would make PostgreSQL reject
/// the statement recording the error) with spaces, and cuts the text to [`MAX_ERROR_LEN`] bytes.
pub fn sanitize(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = cleaned.as_str();
    let mut out = String::with_capacity(text.len().min(MAX_ERROR_LEN + 3));
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (before, after) = rest.split_at(pos + 3);
        out.push_str(before);
        // The authority ends at the first '/', whitespace or quote; the userinfo at its last '@'.
        let end = after
            .find(|c: char| c == '/' || c.is_whitespace() || c == '"' || c == '\'' || c == '?')
            .unwrap_or(after.len());
        let authority = &after[..end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..colon]);
                out.push_str(":***");
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    truncate(mask_secret_params(&out), MAX_ERROR_LEN)
}

/// Query parameters whose values are secrets (`postgres://h/db?password=…` is valid for sqlx).
const SECRET_PARAMS: &[&str] = &[
    "password=",
    "passwd=",
    "pass=",
    "token=",
    "secret=",
    "sslpassword=",
];

/// Replaces the value of every secret-looking `name=value` with `***`.
fn mask_secret_params(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let hit = SECRET_PARAMS.iter().find(|p| {
            lower[i..].starts_with(**p)
                && (i == 0 || matches!(text.as_bytes()[i - 1], b'?' | b'&' | b' ' | b';'))
        });
        match hit {
            Some(p) => {
                out.push_str(&text[i..i + p.len()]);
                out.push_str("***");
                i += p.len();
                while i < text.len()
                    && !matches!(text.as_bytes()[i], b'&' | b' ' | b'"' | b'\'' | b';')
                {
                    i += 1;
                }
            }
            None => {
                let ch = text[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&text[i..i + ch]);
                i += ch;
            }
        }
    }
    out
}

/// A URL safe to print: its password replaced by `***`.
pub fn url(url: &str) -> String {
    sanitize(url)
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_masked() {
        assert_eq!(
            sanitize("cannot connect to postgres://app:hunter2@db:5432/x now"),
            "cannot connect to postgres://app:***@db:5432/x now"
        );
        assert_eq!(
            sanitize("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
    }

    #[test]
    fn secret_query_parameters_are_masked() {
        assert_eq!(
            sanitize("postgres://app@db/x?sslmode=require&password=hunter2&x=1"),
            "postgres://app@db/x?sslmode=require&password=***&x=1"
        );
        assert_eq!(sanitize("nats://h?token=abc"), "nats://h?token=***");
        assert_eq!(sanitize("compass=north"), "compass=north");
    }

    #[test]
    fn urls_without_passwords_are_unchanged() {
        assert_eq!(sanitize("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(
            sanitize("postgres://root@127.0.0.1/test"),
            "postgres://root@127.0.0.1/test"
        );
        assert_eq!(sanitize("no url here"), "no url here");
    }

    #[test]
    fn control_characters_become_spaces() {
        assert_eq!(sanitize("bad\0byte\r\nnext"), "bad byte  next");
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary() {
        let long = "é".repeat(2000);
        let s = sanitize(&long);
        assert!(s.len() <= MAX_ERROR_LEN + '…'.len_utf8());
        assert!(s.ends_with('…'));
    }
}
