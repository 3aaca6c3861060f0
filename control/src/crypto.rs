//! Endpoint secrets at rest: every `whsec_…` secret on `<p>.endpoints` is sealed with
//! XChaCha20-Poly1305 under a 32-byte key from the environment, the endpoint id as associated
//! data (a sealed secret copied into another endpoint's record does not open), a fresh random
//! 24-byte nonce per seal, and the key's id beside the ciphertext.
//!
//! Keys: `HOOKLINE_SECRETS_KEY` (current: seals and opens) and `HOOKLINE_SECRETS_OLD_KEYS`
//! (comma-separated, open only), each base64 of 32 random bytes. A key's id is derived from the
//! key itself (the first 8 hex digits of SHA-256 over a label and the key), so nothing else has
//! to be configured and a record names the key it needs. Rotation: make the new key current and
//! move the old one to the old keys on every process; new writes use the new key;
//! `hookline endpoints reencrypt` rewrites the endpoints still sealed with an old key; then the
//! old key can be dropped.

use std::fmt;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use hookline_common::config::control::{SECRETS_KEY_ENV, SECRETS_OLD_KEYS_ENV};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A secret as stored on the topic.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    /// Id of the key that sealed it.
    pub kid: String,
    /// base64 of the 24-byte nonce.
    pub nonce: String,
    /// base64 of ciphertext + tag.
    pub ciphertext: String,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sealed {{ kid: {} }}", self.kid)
    }
}

/// Why a secret could not be sealed or opened. Never carries key or secret material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error(
        "{SECRETS_KEY_ENV} is not set: endpoint secrets are encrypted at rest with it \
         (base64 of 32 random bytes, e.g. `openssl rand -base64 32`)"
    )]
    NoKey,
    #[error("`{var}`: {reason}")]
    BadKey { var: String, reason: String },
    #[error(
        "sealed with key {kid}, which is neither {SECRETS_KEY_ENV} nor in {SECRETS_OLD_KEYS_ENV}"
    )]
    UnknownKey { kid: String },
    #[error("cannot open a secret sealed with key {kid}: altered, or sealed for another endpoint")]
    Open { kid: String },
}

struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
}

/// The secret sources of this process: the current key (seals) and older ones (open only),
/// and the config file's endpoint secrets and custom headers — a file-managed endpoint's
/// secrets and headers never leave the file (its record on `<p>.endpoints` carries none), so a
/// file-only installation needs no key.
#[derive(Default)]
pub struct Keyring {
    current: Option<Key>,
    old: Vec<Key>,
    /// `[[endpoints]]` id → its `secrets` and `headers`, as this process's config file has them.
    file: std::collections::HashMap<String, FileEndpoint>,
}

/// A file-managed endpoint's secrets and custom headers, as this process's config file has them.
#[derive(Clone, Default)]
pub struct FileEndpoint {
    pub secrets: Vec<String>,
    pub headers: Vec<hookline_common::config::CustomHeader>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("current", &self.current.as_ref().map(|k| &k.id))
            .field("old", &self.old.iter().map(|k| &k.id).collect::<Vec<_>>())
            .finish()
    }
}

fn key_id(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"hookline endpoint secrets key id\0");
    h.update(bytes);
    h.finalize()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_key(var: &str, text: &str) -> Result<Key, CryptoError> {
    let bad = |reason: String| CryptoError::BadKey {
        var: var.to_string(),
        reason,
    };
    let bytes = B64
        .decode(text.trim())
        .map_err(|_| bad("not valid base64".into()))?;
    if bytes.len() != 32 {
        return Err(bad(format!("must decode to 32 bytes, got {}", bytes.len())));
    }
    let cipher =
        XChaCha20Poly1305::new_from_slice(&bytes).map_err(|_| bad("not a valid key".into()))?;
    Ok(Key {
        id: key_id(&bytes),
        cipher,
    })
}

impl Keyring {
    /// The same keys, with the config file's endpoint secrets and headers (see [`Keyring`]).
    pub fn with_file_endpoints(
        mut self,
        endpoints: &[hookline_common::config::EndpointConfig],
    ) -> Keyring {
        self.file = endpoints
            .iter()
            .map(|e| {
                (
                    e.id.clone(),
                    FileEndpoint {
                        secrets: e.secrets.iter().map(|s| s.to_text()).collect(),
                        headers: e.headers.clone(),
                    },
                )
            })
            .collect();
        self
    }

    /// What the config file gives endpoint `id`; `None` if the file does not list it.
    pub fn file_endpoint(&self, id: &str) -> Option<&FileEndpoint> {
        self.file.get(id)
    }

    /// No key: reading works, but secrets can neither be sealed nor opened.
    pub fn empty() -> Keyring {
        Keyring::default()
    }

    /// From `HOOKLINE_SECRETS_KEY` and `HOOKLINE_SECRETS_OLD_KEYS` (both optional).
    pub fn from_env() -> Result<Keyring, CryptoError> {
        let current = std::env::var(SECRETS_KEY_ENV).ok();
        let old = std::env::var(SECRETS_OLD_KEYS_ENV).unwrap_or_default();
        let old: Vec<&str> = old.split(',').filter(|s| !s.trim().is_empty()).collect();
        Keyring::from_base64(current.as_deref(), &old)
    }

    /// From base64 key texts (tests, tools).
    pub fn from_base64(current: Option<&str>, old: &[&str]) -> Result<Keyring, CryptoError> {
        let current = current
            .filter(|c| !c.trim().is_empty())
            .map(|c| parse_key(SECRETS_KEY_ENV, c))
            .transpose()?;
        let old = old
            .iter()
            .enumerate()
            .map(|(i, k)| parse_key(&format!("{SECRETS_OLD_KEYS_ENV}[{i}]"), k))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Keyring {
            current,
            old,
            file: Default::default(),
        })
    }

    /// A fresh random key, base64 (what `openssl rand -base64 32` prints).
    pub fn generate_key() -> String {
        let mut bytes = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut bytes);
        B64.encode(bytes)
    }

    /// The id of the current key.
    pub fn current_id(&self) -> Option<&str> {
        self.current.as_ref().map(|k| k.id.as_str())
    }

    /// Seals `secret` for endpoint `endpoint_id` with the current key.
    pub fn seal(&self, endpoint_id: &str, secret: &str) -> Result<Sealed, CryptoError> {
        let key = self.current.as_ref().ok_or(CryptoError::NoKey)?;
        let mut nonce = [0u8; 24];
        rand::thread_rng().fill_bytes(&mut nonce);
        let ciphertext = key
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: secret.as_bytes(),
                    aad: endpoint_id.as_bytes(),
                },
            )
            .map_err(|_| CryptoError::Open {
                kid: key.id.clone(),
            })?;
        Ok(Sealed {
            kid: key.id.clone(),
            nonce: B64.encode(nonce),
            ciphertext: B64.encode(ciphertext),
        })
    }

    /// Opens a secret sealed for `endpoint_id`, with whichever key sealed it.
    pub fn open(&self, endpoint_id: &str, sealed: &Sealed) -> Result<String, CryptoError> {
        let key = self
            .current
            .iter()
            .chain(&self.old)
            .find(|k| k.id == sealed.kid)
            .ok_or_else(|| CryptoError::UnknownKey {
                kid: sealed.kid.clone(),
            })?;
        let fail = || CryptoError::Open {
            kid: sealed.kid.clone(),
        };
        let nonce = B64.decode(&sealed.nonce).map_err(|_| fail())?;
        if nonce.len() != 24 {
            return Err(fail());
        }
        let ciphertext = B64.decode(&sealed.ciphertext).map_err(|_| fail())?;
        let plain = key
            .cipher
            .decrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &ciphertext,
                    aad: endpoint_id.as_bytes(),
                },
            )
            .map_err(|_| fail())?;
        String::from_utf8(plain).map_err(|_| fail())
    }

    /// Whether `sealed` was sealed with the current key (else it needs re-encryption).
    pub fn is_current(&self, sealed: &Sealed) -> bool {
        self.current_id() == Some(sealed.kid.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn seals_and_opens_with_the_endpoint_id_as_associated_data() {
        let k = Keyring::from_base64(Some(&Keyring::generate_key()), &[]).expect("key");
        let sealed = k.seal("crm", SECRET).expect("seal");
        assert_eq!(sealed.kid.len(), 8);
        assert!(!sealed.ciphertext.contains("MfKQ9r8"));
        assert_eq!(k.open("crm", &sealed).as_deref(), Ok(SECRET));
        // Moved into another endpoint's record: refused.
        assert_eq!(
            k.open("billing", &sealed),
            Err(CryptoError::Open {
                kid: sealed.kid.clone()
            })
        );
        let again = k.seal("crm", SECRET).expect("seal");
        assert_ne!(again.nonce, sealed.nonce, "a fresh nonce per seal");
        let mut altered = sealed.clone();
        altered.ciphertext = B64.encode(b"0123456789abcdef0123456789abcdef0123456789");
        assert!(k.open("crm", &altered).is_err());
    }

    #[test]
    fn rotation_old_keys_open_and_the_current_key_seals() {
        let (old, new) = (Keyring::generate_key(), Keyring::generate_key());
        let before = Keyring::from_base64(Some(&old), &[]).expect("old");
        let sealed_old = before.seal("crm", SECRET).expect("seal");
        let after = Keyring::from_base64(Some(&new), &[&old]).expect("rotated");
        assert_eq!(after.open("crm", &sealed_old).as_deref(), Ok(SECRET));
        assert!(!after.is_current(&sealed_old));
        let sealed_new = after.seal("crm", SECRET).expect("seal");
        assert!(after.is_current(&sealed_new));
        assert_ne!(sealed_new.kid, sealed_old.kid);
        // Without the old key, the error names the key id that is needed.
        let only_new = Keyring::from_base64(Some(&new), &[]).expect("new");
        assert_eq!(
            only_new.open("crm", &sealed_old),
            Err(CryptoError::UnknownKey {
                kid: sealed_old.kid.clone()
            })
        );
        assert_eq!(
            Keyring::empty().seal("crm", SECRET),
            Err(CryptoError::NoKey)
        );
    }

    #[test]
    fn bad_keys_name_the_variable_and_debug_shows_ids_only() {
        let err = Keyring::from_base64(Some("c2hvcnQ="), &[]).expect_err("short");
        assert!(err.to_string().contains("HOOKLINE_SECRETS_KEY"), "{err}");
        assert!(err.to_string().contains("32 bytes"), "{err}");
        let key = Keyring::generate_key();
        let err = Keyring::from_base64(Some(&key), &["!!"]).expect_err("bad old");
        assert!(
            err.to_string().contains("HOOKLINE_SECRETS_OLD_KEYS[0]"),
            "{err}"
        );
        let k = Keyring::from_base64(Some(&key), &[]).expect("key");
        let dbg = format!("{k:?} {:?}", k.seal("x", SECRET).expect("seal"));
        assert!(!dbg.contains(&key[..10]), "{dbg}");
        assert!(!dbg.contains("MfKQ9r8"), "{dbg}");
    }
}
