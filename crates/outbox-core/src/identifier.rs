//! Plain SQL identifiers: the only names of a user's choosing ever spliced into SQL (schemas,
//! databases, table prefixes), so every backend checks them the same way.

/// Whether `name` is a plain lower-case identifier, `[a-z_][a-z0-9_]*`, of at most `max`
/// characters: safe to write into SQL unquoted on every backend, with no case folding.
pub fn is_plain(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lower_case_letters_digits_and_underscores_within_the_length_pass() {
        for ok in ["a", "_x", "app_outbox2"] {
            assert!(is_plain(ok, 63), "{ok}");
        }
        for bad in ["", "App", "1a", "a-b", "a b", "a;drop", "a\"b", "é"] {
            assert!(!is_plain(bad, 63), "{bad}");
        }
        assert!(is_plain(&"a".repeat(40), 40));
        assert!(!is_plain(&"a".repeat(41), 40));
    }
}
