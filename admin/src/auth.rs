//! Bearer tokens: who is calling and what they may see.
//!
//! Tokens are configured as SHA-256 hashes (`[[admin.tokens]]`); a request's token is hashed and
//! compared with every configured hash in constant time. A token carries a scope: `admin` (every
//! tenant) or `tenant:<id>` (only that tenant's endpoints, events and dead letters — another
//! tenant's resource is a 404, never its data). The dev token exists only on loopback, generated
//! at start and printed once.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rand::RngCore;
use sha2::{Digest, Sha256};

use hookline_common::config::admin::{AdminConfig, TokenScope};
use hookline_ingest::http::TenantScope;

use crate::error::ApiError;

/// The authenticated caller, put in the request's extensions by [`require`].
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's configured name (for logs; never the token).
    pub name: String,
    pub scope: TokenScope,
}

impl Caller {
    /// The tenant this caller is limited to; `None` for an admin.
    pub fn tenant(&self) -> Option<&str> {
        self.scope.tenant()
    }

    /// Whether this caller may see a resource of `tenant` (`None`: a resource of no tenant,
    /// which only admins see).
    pub fn sees(&self, tenant: Option<&str>) -> bool {
        match self.tenant() {
            None => true,
            Some(mine) => tenant == Some(mine),
        }
    }
}

struct Entry {
    hash: [u8; 32],
    name: String,
    scope: TokenScope,
}

/// The accepted tokens.
pub struct Tokens {
    entries: Vec<Entry>,
}

pub fn sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if s.len() != 64 {
        return None;
    }
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// A fresh random token: `hlk_` + 64 hex digits (256 random bits).
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!("hlk_{}", hex(&bytes))
}

impl Tokens {
    /// The configured tokens (validated at config load: hashes are 64 hex, scopes parse).
    pub fn from_config(config: &AdminConfig) -> Tokens {
        let entries = config
            .tokens
            .iter()
            .filter_map(|t| {
                Some(Entry {
                    hash: unhex(&t.sha256)?,
                    name: t.name.clone(),
                    scope: TokenScope::parse(&t.scope)?,
                })
            })
            .collect();
        Tokens { entries }
    }

    /// Adds a token given in clear (the dev token, tests).
    pub fn with(mut self, name: &str, token: &str, scope: TokenScope) -> Tokens {
        self.entries.push(Entry {
            hash: sha256(token),
            name: name.to_string(),
            scope,
        });
        self
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller a token belongs to. Every entry is compared, each in constant time, so the
    /// answer's timing says nothing about which hash came close.
    pub fn check(&self, token: &str) -> Option<Caller> {
        let hash = sha256(token);
        let mut found = None;
        for e in &self.entries {
            let diff = e
                .hash
                .iter()
                .zip(hash.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 && found.is_none() {
                found = Some(Caller {
                    name: e.name.clone(),
                    scope: e.scope.clone(),
                });
            }
        }
        found
    }
}

/// The bearer token of a request, if it has a well-formed `Authorization: Bearer …`.
pub fn bearer(request: &Request) -> Option<&str> {
    let value = request.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Middleware of every `/v1/…` route: 401 without a valid token; otherwise the [`Caller`] (and
/// the ingest route's [`TenantScope`]) go into the request's extensions.
pub async fn require(
    State(tokens): State<Arc<Tokens>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(token) = bearer(&request) else {
        return unauthorized("send `Authorization: Bearer <token>`");
    };
    let Some(caller) = tokens.check(token) else {
        return unauthorized("the token is not valid");
    };
    request
        .extensions_mut()
        .insert(TenantScope(caller.tenant().map(str::to_string)));
    request.extensions_mut().insert(caller);
    next.run(request).await
}

fn unauthorized(message: &str) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    r.headers_mut().insert(
        WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer realm=\"hookline\""),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_common::config::admin::TokenConfig;

    #[test]
    fn configured_hashes_authenticate_their_tokens_only() {
        let config = AdminConfig {
            tokens: vec![
                TokenConfig {
                    name: "ops".into(),
                    sha256: hex(&sha256("secret-a")),
                    scope: "admin".into(),
                },
                TokenConfig {
                    name: "acme".into(),
                    sha256: hex(&sha256("secret-b")),
                    scope: "tenant:acme".into(),
                },
            ],
            ..AdminConfig::default()
        };
        let tokens = Tokens::from_config(&config);
        assert_eq!(tokens.check("secret-a").unwrap().scope, TokenScope::Admin);
        let acme = tokens.check("secret-b").unwrap();
        assert_eq!(acme.tenant(), Some("acme"));
        assert!(acme.sees(Some("acme")));
        assert!(!acme.sees(Some("globex")));
        assert!(!acme.sees(None));
        assert!(tokens.check("secret-c").is_none());
        assert!(tokens.check("").is_none());
    }

    #[test]
    fn generated_tokens_differ_and_hex_round_trips() {
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        assert!(a.starts_with("hlk_") && a.len() == 68);
        assert_eq!(unhex(&hex(&sha256(&a))), Some(sha256(&a)));
    }
}
