//! A string that never shows itself in `Debug` or `Display`: passwords and tokens from config.

/// A secret value; `{:?}` and `{}` print `***`. Read it with [`Secret::expose`] where it is
/// handed to a client library, nowhere else.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_itself() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "*** Secret(***)");
        assert_eq!(s.expose(), "hunter2");
    }
}
