//! Keeps secrets and oversized text out of logs, error messages and the `last_error` column.
//!
//! Two kinds of secret are masked wherever they appear, in a URL on its own or in free text
//! (an error message that embeds a URL, a libpq `key=value` string):
//!
//! - **userinfo**: everything between `scheme://` and the host. A lone token
//!   (`nats://TOKEN@host`) cannot be told from a user name, and some brokers use API keys as
//!   user names, so the whole userinfo becomes `***`. The userinfo ends at the *last* `@` of the
//!   URL, so a password with an unencoded `/`, `@`, `?` or `#` is masked whole. An `@` later in
//!   a path or query then masks more than needed: safe, never less.
//! - **secret-looking parameters**: the value of any `name=value` whose name says it holds a
//!   secret (password, token, secret, key, sig, signature, credential, auth, AWS
//!   `aws_secret_access_key`, `X-Amz-Signature`, …; see [`is_secret_name`]).

/// Longest error text kept; longer text is cut (a broker may echo a whole payload back).
pub const MAX_ERROR_LEN: usize = 1000;

/// What a masked secret becomes.
const MASK: &str = "***";

/// Masks every URL userinfo and every secret-looking parameter in `text` (see the module
/// documentation), replaces control characters (a NUL would make PostgreSQL reject the
/// statement recording the error) with spaces, and cuts the text to [`MAX_ERROR_LEN`] bytes.
pub fn sanitize(text: &str) -> String {
    truncate(mask(text), MAX_ERROR_LEN)
}

/// A URL safe to print: userinfo and secret parameters replaced by `***`.
pub fn url(url: &str) -> String {
    sanitize(url)
}

/// Masks every URL userinfo and secret-looking parameter, and changes nothing else (control
/// characters, length): for whole log lines, which may carry terminal colours.
pub fn mask_secrets(text: &str) -> String {
    mask_secret_params(&mask_userinfo(text))
}

fn mask(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    mask_secrets(&cleaned)
}

/// Characters that end a URL inside free text. Anything else, `/ @ ? # : ,` included, may be
/// part of an unencoded password, so it does not end the URL.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>')
}

/// Replaces the userinfo of every `scheme://userinfo@host` in `text` with `***`.
fn mask_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (before, after) = rest.split_at(pos + 3);
        out.push_str(before);
        // This URL ends at whitespace or a quote, or where the next `scheme://` begins (a
        // comma-separated server list holds several URLs, each with its own userinfo).
        let mut end = after.find(ends_url).unwrap_or(after.len());
        if let Some(next) = after[..end].find("://") {
            end = next;
        }
        let span = &after[..end];
        match span.rfind('@') {
            Some(at) if at > 0 => {
                out.push_str(MASK);
                out.push_str(&span[at..]);
            }
            _ => out.push_str(span),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Whole words (of a name split at `_`, `-` and `.`) that mark a parameter as secret.
const SECRET_WORDS: &[&str] = &[
    "key", "sig", "pass", "pwd", "auth", "creds", "jwt", "nkey", "seed", "session",
];

/// Substrings that mark a parameter as secret wherever they appear in its name
/// (`sslpassword`, `access_token`, `aws_secret_access_key`, `X-Amz-Signature`,
/// `X-Amz-Credential`, `apikey`, `client_secret`, …).
const SECRET_PARTS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "signature",
    "credential",
    "apikey",
    "private",
];

/// Whether a parameter called `name` holds a secret. Generous on purpose: masking a harmless
/// value (`routing_key=orders`) costs a little clarity, missing a secret costs the secret.
pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_PARTS.iter().any(|p| lower.contains(p))
        || lower
            .split(['_', '-', '.'])
            .any(|word| SECRET_WORDS.contains(&word))
}

/// Characters of a parameter name.
fn name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.')
}

/// Characters that end a parameter value: the next parameter, a fragment, or the end of the
/// word in free text.
fn ends_value(c: u8) -> bool {
    c.is_ascii_whitespace() || matches!(c, b'&' | b'#' | b';' | b'"' | b'\'' | b'`' | b'<' | b'>')
}

/// Replaces the value of every secret-looking `name=value` with `***`.
fn mask_secret_params(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    // `copied` is how much of `text` is already in `out`; all cuts fall on ASCII bytes, so on
    // char boundaries.
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if !name_char(bytes[i]) || (i > 0 && name_char(bytes[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && name_char(bytes[i]) {
            i += 1;
        }
        if i < bytes.len() && bytes[i] == b'=' && is_secret_name(&text[start..i]) {
            i += 1;
            let value_start = i;
            while i < bytes.len() && !ends_value(bytes[i]) {
                i += 1;
            }
            if i > value_start && &text[value_start..i] != MASK {
                out.push_str(&text[copied..value_start]);
                out.push_str(MASK);
                copied = i;
            }
        }
    }
    out.push_str(&text[copied..]);
    out
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

    /// Asserts that `secret` is gone from the sanitized `text` and that it reads `expected`.
    fn masks(text: &str, secret: &str, expected: &str) {
        let s = sanitize(text);
        assert!(!s.contains(secret), "{secret:?} leaks from {text:?}: {s:?}");
        assert_eq!(s, expected, "for {text:?}");
    }

    #[test]
    fn user_and_password_are_masked() {
        masks(
            "cannot connect to postgres://app:hunter2@db:5432/x now",
            "hunter2",
            "cannot connect to postgres://***@db:5432/x now",
        );
        masks(
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            "guest",
            "amqp://***@127.0.0.1:5672/%2f",
        );
    }

    #[test]
    fn a_lone_token_is_masked() {
        masks(
            "nats://SECRETTOKEN@127.0.0.1:4222",
            "SECRETTOKEN",
            "nats://***@127.0.0.1:4222",
        );
        masks(
            "redis://:onlypass@cache:6379/0",
            "onlypass",
            "redis://***@cache:6379/0",
        );
        // A user name alone is masked too: it cannot be told from a token.
        masks(
            "postgres://root@127.0.0.1/test",
            "root",
            "postgres://***@127.0.0.1/test",
        );
    }

    #[test]
    fn passwords_with_unencoded_slash_at_question_or_hash_are_masked_whole() {
        masks(
            "postgres://app:pa/ss@db:5432/x",
            "pa/ss",
            "postgres://***@db:5432/x",
        );
        masks(
            "postgres://app:p@ss@word@db:5432/x",
            "ss@word",
            "postgres://***@db:5432/x",
        );
        masks(
            "postgres://app:a/b@c/d?e#f@db/x",
            "a/b@c/d?e#f",
            "postgres://***@db/x",
        );
        masks(
            "nats://tok/en+with=base64/==@h:4222",
            "en+with",
            "nats://***@h:4222",
        );
    }

    #[test]
    fn urls_in_free_text_are_masked_each_on_its_own() {
        masks(
            "error: cannot reach \"nats://u:TOPSECRET@h1:4222\" (retrying) user@example.org",
            "TOPSECRET",
            "error: cannot reach \"nats://***@h1:4222\" (retrying) user@example.org",
        );
        masks(
            "servers nats://a:S1@h1:4222,nats://b:S2@h2:4222 down",
            "S1",
            "servers nats://***@h1:4222,nats://***@h2:4222 down",
        );
        assert!(!sanitize("servers nats://a:S1@h1,nats://b:S2@h2").contains("S2"));
        masks(
            "sink `nats://TOKEN9@127.0.0.1:1`: connection refused",
            "TOKEN9",
            "sink `nats://***@127.0.0.1:1`: connection refused",
        );
    }

    #[test]
    fn secret_query_parameters_are_masked() {
        masks(
            "postgres://db/x?sslmode=require&password=hunter2&x=1",
            "hunter2",
            "postgres://db/x?sslmode=require&password=***&x=1",
        );
        masks("nats://h?token=abc", "abc", "nats://h?token=***");
        for name in [
            "password",
            "PASSWORD",
            "passwd",
            "pass",
            "pwd",
            "sslpassword",
            "token",
            "access_token",
            "secret",
            "client_secret",
            "key",
            "api_key",
            "apikey",
            "sig",
            "signature",
            "credentials",
            "credential",
            "aws_secret_access_key",
            "secret_access_key",
            "session_token",
            "aws_session_token",
            "X-Amz-Signature",
            "X-Amz-Credential",
            "X-Amz-Security-Token",
            "ssl_key",
            "auth",
            "jwt",
            "nkey",
        ] {
            let text = format!("https://q.example/x?a=1&{name}=S3CR3T%2Fv&b=2");
            let got = sanitize(&text);
            assert!(!got.contains("S3CR3T"), "{name}: {got}");
            assert!(got.ends_with(&format!("{name}=***&b=2")), "{name}: {got}");
        }
    }

    #[test]
    fn secret_parameters_in_free_text_are_masked() {
        masks(
            "host=db user=app password=hunter2 dbname=x",
            "hunter2",
            "host=db user=app password=*** dbname=x",
        );
        masks(
            "signed url (X-Amz-Signature=abcdef0123;X-Amz-Date=1) expired",
            "abcdef0123",
            "signed url (X-Amz-Signature=***;X-Amz-Date=1) expired",
        );
    }

    #[test]
    fn harmless_text_is_unchanged() {
        for s in [
            "nats://127.0.0.1:4222",
            "nats://127.0.0.1:4222?ack_timeout=5s",
            "postgres://127.0.0.1/test?sslmode=require&application_name=relay",
            "compass=north",
            "monkey=1",
            "no url here",
            "mail me at user@example.org",
            "sqlite://outbox-demo/payments.db",
            "file:events.jsonl",
            "scheme://@host",
        ] {
            assert_eq!(sanitize(s), s);
        }
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

    #[test]
    fn non_ascii_text_around_secrets_survives() {
        masks(
            "échec: postgres://ü:pässwörd@hôte/db — token=ключ …",
            "pässwörd",
            "échec: postgres://***@hôte/db — token=*** …",
        );
    }
}
