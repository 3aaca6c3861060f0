//! Standard Webhooks v1 signatures.
//!
//! The signed content is `{msg_id}.{timestamp}.{body}` over the exact body bytes; the signature is
//! `v1,` + base64 (standard alphabet, padded) of HMAC-SHA256 keyed with the decoded secret bytes.
//! While a secret is being rotated every active key signs, and the values are space-separated.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The `webhook-signature` header value: one `v1,<base64>` per key, space-separated.
///
/// Keys are the decoded secret bytes (see `hookline_common::contract::secret::decode_secret`). An empty
/// `keys` gives an empty string; callers omit the header then.
pub fn sign(keys: &[impl AsRef<[u8]>], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    let mut out = String::with_capacity(keys.len() * 48);
    for key in keys {
        let Some(mac) = mac_of(key.as_ref(), msg_id, &timestamp, body) else {
            continue;
        };
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str("v1,");
        STANDARD.encode_string(mac.finalize().into_bytes(), &mut out);
    }
    out
}

/// Whether `header_value` (a `webhook-signature` value, possibly several space-separated
/// signatures) holds a valid `v1` signature of this message under `key`.
///
/// The comparison is constant-time (`Mac::verify_slice`). Checking the timestamp against a
/// tolerance is the receiver's business, not this function's.
pub fn verify(key: &[u8], msg_id: &str, timestamp: i64, body: &[u8], header_value: &str) -> bool {
    let timestamp = timestamp.to_string();
    header_value.split(' ').any(|candidate| {
        let Some(b64) = candidate.strip_prefix("v1,") else {
            return false;
        };
        let Ok(expected) = STANDARD.decode(b64) else {
            return false;
        };
        mac_of(key, msg_id, &timestamp, body).is_some_and(|mac| mac.verify_slice(&expected).is_ok())
    })
}

fn mac_of(key: &[u8], msg_id: &str, timestamp: &str, body: &[u8]) -> Option<HmacSha256> {
    // HMAC accepts keys of any length, so this never fails; no panic path either way.
    let mut mac = HmacSha256::new_from_slice(key).ok()?;
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_common::contract::secret::decode_secret;

    // The published Standard Webhooks reference vector.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn key() -> Vec<u8> {
        decode_secret(SECRET).expect("reference secret decodes")
    }

    #[test]
    fn matches_the_reference_vector() {
        assert_eq!(sign(&[key()], MSG_ID, TIMESTAMP, BODY), SIGNATURE);
        assert!(verify(&key(), MSG_ID, TIMESTAMP, BODY, SIGNATURE));
    }

    #[test]
    fn one_signature_per_key_space_separated() {
        let other = vec![7u8; 32];
        let header = sign(&[key(), other.clone()], MSG_ID, TIMESTAMP, BODY);
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], SIGNATURE);
        assert!(parts[1].starts_with("v1,"));
        assert!(verify(&key(), MSG_ID, TIMESTAMP, BODY, &header));
        assert!(verify(&other, MSG_ID, TIMESTAMP, BODY, &header));
        assert_eq!(sign(&[] as &[Vec<u8>], MSG_ID, TIMESTAMP, BODY), "");
    }

    #[test]
    fn verify_rejects_any_change() {
        let k = key();
        assert!(!verify(&k, MSG_ID, TIMESTAMP + 1, BODY, SIGNATURE));
        assert!(!verify(&k, "msg_other", TIMESTAMP, BODY, SIGNATURE));
        assert!(!verify(
            &k,
            MSG_ID,
            TIMESTAMP,
            br#"{"test": 2432232315}"#,
            SIGNATURE
        ));
        assert!(!verify(&[1u8; 24], MSG_ID, TIMESTAMP, BODY, SIGNATURE));
        assert!(!verify(
            &k,
            MSG_ID,
            TIMESTAMP,
            BODY,
            "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        ));
        assert!(!verify(&k, MSG_ID, TIMESTAMP, BODY, "v1,not-base64!"));
        assert!(!verify(&k, MSG_ID, TIMESTAMP, BODY, ""));
    }
}
