//! The `[admin]` section: where the admin process (API, ingest, dashboard) listens and which
//! bearer tokens it accepts.
//!
//! Tokens are configured as SHA-256 hashes, never in clear: the config file (or ConfigMap) can
//! be read by more people than should publish events. `hookline admin token` prints a fresh
//! token with the entry to paste here.
//!
//! ```toml
//! [admin]
//! listen = "0.0.0.0:8090"
//! [[admin.tokens]]
//! name = "ops"
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! scope = "admin"            # every tenant
//! [[admin.tokens]]
//! name = "acme-api"
//! sha256 = "…"
//! scope = "tenant:acme"      # only tenant `acme`'s endpoints, events and dead letters
//! ```

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;

use serde::Deserialize;

use crate::config::ConfigError;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin API, `/v1/events` and the dashboard. Loopback by default: exposing
    /// it is a decision (with tokens configured).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    /// How many `Idempotency-Key`s (per tenant) each admin process indexes for the body check
    /// (about 55 bytes each); past it the oldest lose only the "same body" check.
    #[serde(default = "default_idempotency_keys")]
    pub idempotency_keys: usize,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_listen(),
            tokens: Vec::new(),
            idempotency_keys: default_idempotency_keys(),
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8090))
}

const fn default_idempotency_keys() -> usize {
    1_000_000
}

/// One accepted bearer token.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who holds it (logged with each change it makes; never the token).
    pub name: String,
    /// Lowercase hex SHA-256 of the token.
    pub sha256: String,
    /// `admin` (every tenant) or `tenant:<id>`.
    pub scope: String,
}

impl fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenConfig")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// What a token may see and change.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TokenScope {
    Admin,
    Tenant(String),
}

impl TokenScope {
    pub fn parse(s: &str) -> Option<TokenScope> {
        match s.strip_prefix("tenant:") {
            Some(t) if !t.is_empty() && !t.chars().any(char::is_whitespace) => {
                Some(TokenScope::Tenant(t.to_string()))
            }
            Some(_) => None,
            None => (s == "admin").then_some(TokenScope::Admin),
        }
    }

    /// The tenant a scope is limited to; `None` for admin.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            TokenScope::Admin => None,
            TokenScope::Tenant(t) => Some(t),
        }
    }
}

impl AdminConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        for (i, t) in self.tokens.iter().enumerate() {
            let at = |f: &str| format!("admin.tokens[{i}].{f}");
            if t.name.trim().is_empty() {
                return Err(ConfigError::field(at("name"), "must not be empty"));
            }
            if !names.insert(t.name.as_str()) {
                return Err(ConfigError::field(
                    at("name"),
                    format!("`{}` is used by another token", t.name),
                ));
            }
            let hex = t.sha256.len() == 64
                && t.sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !hex {
                return Err(ConfigError::field(
                    at("sha256"),
                    "must be the 64 lowercase hex digits of the token's SHA-256 \
                     (`hookline admin token` prints one)",
                ));
            }
            if !hashes.insert(t.sha256.as_str()) {
                return Err(ConfigError::field(
                    at("sha256"),
                    "the same token is configured twice",
                ));
            }
            if TokenScope::parse(&t.scope).is_none() {
                return Err(ConfigError::field(
                    at("scope"),
                    format!("`{}` is neither `admin` nor `tenant:<id>`", t.scope),
                ));
            }
        }
        if self.idempotency_keys == 0 {
            return Err(ConfigError::field(
                "admin.idempotency_keys",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse() {
        assert_eq!(TokenScope::parse("admin"), Some(TokenScope::Admin));
        assert_eq!(
            TokenScope::parse("tenant:acme"),
            Some(TokenScope::Tenant("acme".into()))
        );
        assert_eq!(TokenScope::parse("tenant:"), None);
        assert_eq!(TokenScope::parse("tenant:a b"), None);
        assert_eq!(TokenScope::parse("root"), None);
    }

    fn token(name: &str, sha: &str, scope: &str) -> TokenConfig {
        TokenConfig {
            name: name.into(),
            sha256: sha.into(),
            scope: scope.into(),
        }
    }

    #[test]
    fn bad_tokens_name_the_field() {
        let good = "a".repeat(64);
        let cases = [
            (vec![token("", &good, "admin")], "admin.tokens[0].name"),
            (vec![token("x", "abc", "admin")], "admin.tokens[0].sha256"),
            (
                vec![token("x", &"A".repeat(64), "admin")],
                "admin.tokens[0].sha256",
            ),
            (vec![token("x", &good, "root")], "admin.tokens[0].scope"),
            (
                vec![
                    token("x", &good, "admin"),
                    token("x", &"b".repeat(64), "admin"),
                ],
                "admin.tokens[1].name",
            ),
            (
                vec![token("x", &good, "admin"), token("y", &good, "admin")],
                "admin.tokens[1].sha256",
            ),
        ];
        for (tokens, field) in cases {
            let c = AdminConfig {
                tokens,
                ..AdminConfig::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e} should name {field}");
        }
    }

    #[test]
    fn debug_never_shows_the_hash() {
        let t = token("ops", &"a".repeat(64), "admin");
        assert!(!format!("{t:?}").contains("aaaa"));
    }
}
