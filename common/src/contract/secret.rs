//! Standard Webhooks secrets: `whsec_` + base64 of 24..=64 random bytes; the HMAC key is the
//! decoded bytes.

use base64::Engine;

/// Decodes a `whsec_…` secret into its key bytes, or says what is wrong (never echoing it).
pub fn decode_secret(secret: &str) -> Result<Vec<u8>, String> {
    let Some(b64) = secret.strip_prefix("whsec_") else {
        return Err("must start with `whsec_` (Standard Webhooks secret format)".into());
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| "the part after `whsec_` is not valid base64".to_string())?;
    if !(24..=64).contains(&bytes.len()) {
        return Err(format!("must decode to 24..=64 bytes, got {}", bytes.len()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_valid_and_rejects_bad() {
        assert_eq!(
            decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").map(|b| b.len()),
            Ok(24)
        );
        assert!(decode_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(decode_secret("whsec_!!!").is_err());
        assert!(decode_secret("whsec_c2hvcnQ=").is_err());
    }
}
