//! Standard Webhooks signatures (<https://www.standardwebhooks.com>): `webhook-id`,
//! `webhook-timestamp` and `webhook-signature: v1,<base64 HMAC-SHA256>` over
//! `"{id}.{timestamp}.{body}"`, so receivers can use any Standard Webhooks library.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the message (or batch) id.
pub const HEADER_ID: &str = "webhook-id";
/// The header carrying the signing time, in seconds since the Unix epoch.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// The header carrying the signature(s).
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// The MAC over `"{id}.{timestamp}.{body}"`, before finalisation.
fn mac(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `webhook-signature` value for `body` sent as `id` at `timestamp`, with `key` (raw bytes).
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mac = mac(key, id, timestamp, body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// Whether one of the space-separated signatures of `header` is a valid `v1` signature of
/// `body` sent as `id` at `timestamp` (compared in constant time).
pub fn verify(key: &[u8], id: &str, timestamp: i64, body: &[u8], header: &str) -> bool {
    header.split(' ').any(|sig| {
        let Some(b64) = sig.strip_prefix("v1,") else {
            return false;
        };
        let Ok(given) = base64::engine::general_purpose::STANDARD.decode(b64) else {
            return false;
        };
        mac(key, id, timestamp, body).verify_slice(&given).is_ok()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The example of the Standard Webhooks specification's reference libraries.
    #[test]
    fn matches_the_specifications_example() {
        let key = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        let body = br#"{"test": 2432232314}"#;
        let sig = signature(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(verify(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
            &format!("v1,bogus {sig}")
        ));
        assert!(!verify(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265331,
            body,
            &sig
        ));
        assert!(!verify(&key, "other", 1614265330, body, &sig));
    }
}
