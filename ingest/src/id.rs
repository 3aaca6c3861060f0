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

    /// Property tests ("fuzzing on stable") of the ids derived from idempotency keys, for
    /// `HOOKLINE_TEST_FUZZ_MS` ms (default 1500); a failure prints arbtest's seed and how to
    /// replay it (`HOOKLINE_TEST_FUZZ_SEED`).
    mod fuzz {
        use std::collections::HashMap;

        use hookline_common::config::InputConfig;
        use hookline_common::contract::envelope::Validator;
        use hookline_fuzzing::{arbitrary, Unstructured};

        use super::super::*;

        fn fuzz(size_max: u32, properties: &[(&str, hookline_fuzzing::Property)]) {
            hookline_fuzzing::fuzz("cargo test -p hookline-ingest --lib", size_max, properties);
        }

        #[test]
        fn fuzz_idempotency_key_ids() {
            fuzz(
                4096,
                &[
                    ("the key rule", key_rule),
                    ("one id per (tenant, key)", ids),
                    ("distinct inputs, distinct ids", distinct),
                ],
            );
        }

        /// The `Idempotency-Key` rule, written independently: 1..=255 bytes of printable ASCII
        /// (space included).
        fn key_obeys_rule(key: &str) -> bool {
            (1..=255).contains(&key.len()) && key.bytes().all(|b| (0x20..=0x7e).contains(&b))
        }

        /// Keys around the rule's edges (lengths 0, 1, 254..=256; tab, DEL, NUL, non-ASCII) are
        /// accepted exactly when they obey it.
        fn key_rule(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
            let len = if u.arbitrary()? {
                *u.choose(&[0usize, 1, 2, 254, 255, 256])?
            } else {
                u.int_in_range(0..=300)?
            };
            let mut key = String::new();
            while key.len() < len {
                key.push(if u.ratio(1, 60)? {
                    *u.choose(&['\t', '\n', '\0', '\x7f', 'é', '\u{a0}', '\u{10ffff}'])?
                } else {
                    char::from(u.int_in_range(0x20u8..=0x7e)?)
                });
            }
            assert_eq!(
                check_key(&key).is_ok(),
                key_obeys_rule(&key),
                "{key:?}: {:?}",
                check_key(&key)
            );
            Ok(())
        }

        fn tenant_and_key(u: &mut Unstructured<'_>) -> arbitrary::Result<(Option<String>, String)> {
            // Small pools full of the input's separators, so that a plain join would collide.
            let small = |u: &mut Unstructured<'_>, min: usize| -> arbitrary::Result<String> {
                let mut s = String::new();
                for _ in 0..u.int_in_range(min..=5)? {
                    s.push(*u.choose(&['a', 'b', '1', '2', ':', '|', '-', ' '])?);
                }
                Ok(s)
            };
            let tenant = match u.int_in_range(0..=3)? {
                0 => None,
                1 => Some(u.arbitrary()?),
                _ => Some(small(u, 0)?),
            };
            let key = if u.arbitrary()? {
                u.arbitrary()?
            } else {
                small(u, 1)?
            };
            Ok((tenant, key))
        }

        fn validator() -> Validator {
            let input = InputConfig {
                max_payload_bytes: 1 << 16,
                max_key_bytes: 1024,
            };
            Validator::new(&input, &[])
        }

        /// An id is `evt_` and 32 lowercase hex digits, the same for the same (tenant, key), and
        /// an envelope id the validator accepts as it is; so is a random id.
        fn ids(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
            let (tenant, key) = tenant_and_key(u)?;
            let id = from_key(tenant.as_deref(), &key);
            assert_eq!(id, from_key(tenant.as_deref(), &key), "not deterministic");
            for id in [id, random()] {
                let hex = id.strip_prefix("evt_").unwrap_or_else(|| panic!("{id}"));
                assert!(
                    hex.len() == 32
                        && hex
                            .bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                    "{id}"
                );
                let event = format!(r#"{{"id":"{id}","type":"t"}}"#);
                let valid = validator()
                    .validate(Some(event.as_bytes()))
                    .unwrap_or_else(|e| panic!("{id}: {e:?}"));
                assert_eq!(valid.id, id);
            }
            Ok(())
        }

        /// A batch of (tenant, key) pairs: two ids are equal exactly when the pairs are.
        fn distinct(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
            let mut seen: HashMap<String, (Option<String>, String)> = HashMap::new();
            for _ in 0..u.int_in_range(2..=64)? {
                let pair = tenant_and_key(u)?;
                let id = from_key(pair.0.as_deref(), &pair.1);
                if let Some(earlier) = seen.get(&id) {
                    assert_eq!(earlier, &pair, "{id} for two inputs");
                }
                seen.insert(id, pair);
            }
            Ok(())
        }
    }
}
