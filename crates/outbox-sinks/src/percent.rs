//! Percent-decoding of URL option values, shared by the sink URLs and the inbox's source URLs
//! (whatever brokers a build has).

/// Decodes `%XX` escapes (and `+` as a space, as in a form-encoded query); `None` when the
/// result is not UTF-8 or an escape is broken.
pub fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}
