//! Event ids assigned by ingest.
//!
//! With an `Idempotency-Key` the id is derived from (tenant, key): every request carrying the
//! same key for the same tenant — concurrent ones, ones sent to another ingest pod, ones sent
//! after a restart — gets the same id, and the deduper's exactly-once window (keyed by the
//! envelope id, namespaced by tenant) lets only the first through for 24 h. Nothing in an ingest
//! process has to remember anything. Without a key the id is random: a retried request is a new
//! event.

use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

/// Longest accepted `Idempotency-Key`, in bytes (Stripe's limit).
pub const MAX_KEY_BYTES: usize = 255;

/// Why an `Idempotency-Key` header was refused.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("the Idempotency-Key header is empty".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "the Idempotency-Key header is {} bytes, at most {MAX_KEY_BYTES} are accepted",
            key.len()
        ));
    }
    if !key.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err("the Idempotency-Key header must be printable ASCII".into());
    }
    Ok(())
}

/// The id of the event published with `key` for `tenant` (`None`: no tenant).
pub fn from_key(tenant: Option<&str>, key: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"hookline idempotency-key v1\0");
    // Length-prefixed, so no (tenant, key) pair joins into another's input.
    match tenant {
        Some(t) => h.update(format!("{}:{t}", t.len()).as_bytes()),
        None => h.update(b"-"),
    }
    h.update(format!("|{}:{key}", key.len()).as_bytes());
    format!("evt_{}", hex(&h.finalize()[..16]))
}

/// A fresh random id (128 bits).
pub fn random() -> String {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!("evt_{}", hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_tenant_same_id_and_nothing_else_collides() {
        let a = from_key(Some("acme"), "order-42");
        assert_eq!(a, from_key(Some("acme"), "order-42"));
        assert_ne!(a, from_key(Some("globex"), "order-42"));
        assert_ne!(a, from_key(None, "order-42"));
        assert_ne!(a, from_key(Some("acme"), "order-43"));
        // Length prefixes: the split point between tenant and key matters.
        assert_ne!(from_key(Some("ab"), "c"), from_key(Some("a"), "bc"));
        assert_eq!(a.len(), 4 + 32);
        assert!(a.starts_with("evt_"));
    }

    #[test]
    fn random_ids_differ() {
        assert_ne!(random(), random());
    }

    #[test]
    fn keys_are_bounded_printable_ascii() {
        assert!(check_key("a-b_c:1 2").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key(&"k".repeat(256)).is_err());
        assert!(check_key("é").is_err());
        assert!(check_key("a\tb").is_err());
    }
}
