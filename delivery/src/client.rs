//! The HTTP side of an attempt: the one pooled client (hyper-util's: no redirects, no proxy, the
//! guarded resolver, rustls with the bundled and the system roots), the bounded read of the kept
//! part of a response body, and the classification of transport errors into [`FailureClass`]es
//! with their text (never the URL).
//!
//! hyper-util directly rather than reqwest (which wraps it): reqwest's redirect, retry and
//! connection-logging layers and its second copy of the headers cost ~5 KiB of memory per
//! request in flight and do nothing for a client that never follows redirects
//! (docs/performance.md, "10k in flight").

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hookline_common::config::HttpConfig;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::conn::Tracking;
use crate::outcome::FailureClass;
use crate::ssrf::{BlockedAddress, GuardedResolver, SsrfGuard};

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// TCP keepalive on endpoint connections, to notice dead peers on pooled connections.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// The request body: the event's bytes, sent unchanged.
pub(crate) type Body = Full<Bytes>;
/// The client every attempt goes through (its connections [`Tracked`](crate::conn::Tracked)).
pub(crate) type HttpClient = Client<Tracking<HttpsConnector<HttpConnector<GuardedResolver>>>, Body>;

/// The engine's two clients over one connector.
pub(crate) struct Clients {
    /// Pooled: every attempt goes out on it.
    pub(crate) pooled: HttpClient,
    /// Never pools: a request that [went stale](crate::conn::went_stale) on a reused pooled
    /// connection goes out again on it, so surely on a new connection.
    pub(crate) fresh: HttpClient,
}

/// The clients for every endpoint: no redirects (hyper-util never follows one), no proxy,
/// names resolved through the SSRF guard, connect bounded by the timeout, HTTP/2 when a TLS
/// endpoint offers it (ALPN), HTTP/1.1 otherwise; `idle_per_host` idle connections pooled.
pub(crate) fn build(
    http: &HttpConfig,
    guard: Arc<SsrfGuard>,
    idle_per_host: usize,
) -> anyhow::Result<Clients> {
    let mut tcp = HttpConnector::new_with_resolver(GuardedResolver::new(guard));
    // https:// URLs go through the TLS connector wrapping this one.
    tcp.enforce_http(false);
    tcp.set_connect_timeout(Some(http.timeout));
    tcp.set_keepalive(Some(TCP_KEEPALIVE));
    tcp.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config()?)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(tcp);
    let connector = Tracking(https);
    let client = |idle: usize| {
        Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(idle)
            .build(connector.clone())
    };
    Ok(Clients {
        pooled: client(idle_per_host),
        fresh: client(0),
    })
}

/// rustls (ring) trusting two root stores: the bundled Mozilla roots and the system store
/// (`/etc/ssl/certs`, or `SSL_CERT_FILE` / `SSL_CERT_DIR`), so endpoints behind a company CA work
/// once the CA is in the container's store.
fn tls_config() -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let native = rustls_native_certs::load_native_certs();
    let mut unreadable = 0usize;
    for cert in native.certs {
        // System stores often hold a few certificates rustls cannot parse; skip those.
        if roots.add(cert).is_err() {
            unreadable += 1;
        }
    }
    if unreadable > 0 || !native.errors.is_empty() {
        tracing::debug!(
            unreadable,
            errors = native.errors.len(),
            "some system root certificates were skipped"
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Up to `max` bytes of the response body, whatever arrived within `grace`; a body that is slow,
/// endless or broken just ends the read early.
pub(crate) async fn read_kept(body: &mut Incoming, max: usize, grace: Duration) -> Vec<u8> {
    let mut kept: Vec<u8> = Vec::new();
    let read = async {
        while kept.len() < max {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(chunk) = frame.data_ref() {
                        let take = chunk.len().min(max - kept.len());
                        kept.extend_from_slice(&chunk[..take]);
                    }
                }
                Some(Err(_)) | None => break,
            }
        }
    };
    // Elapsed: what arrived so far is what is kept.
    let _ = tokio::time::timeout(grace, read).await;
    kept
}

/// The class of a transport error and its text (hyper-util's errors carry no URL); a blocked
/// address keeps the resolver's own text, the client's wrapping adds nothing.
pub(crate) fn transport_failure(err: hyper_util::client::legacy::Error) -> (FailureClass, String) {
    let class = classify(&err);
    if class == FailureClass::Blocked {
        if let Some(blocked) = find_in_chain::<BlockedAddress>(&err) {
            return (class, blocked.to_string());
        }
    }
    (class, error_text(&err))
}

fn classify(err: &hyper_util::client::legacy::Error) -> FailureClass {
    let timed_out = find_in_chain::<std::io::Error>(err)
        .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
    if timed_out {
        FailureClass::Timeout
    } else if find_in_chain::<BlockedAddress>(err).is_some() {
        FailureClass::Blocked
    } else if find_in_chain::<rustls::Error>(err).is_some() {
        FailureClass::Tls
    } else if err.is_connect() {
        FailureClass::Connect
    } else {
        FailureClass::Io
    }
}

/// Finds an error of type `T` in the `source()` chain of `err`, looking inside
/// `std::io::Error`s: their `source()` skips the error they wrap, and TLS failures arrive as a
/// `rustls::Error` inside an `io::Error` (tokio-rustls) inside another `io::Error` (the connector).
fn find_in_chain<'a, T: StdError + 'static>(err: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(wrapped) => Some(wrapped as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}

/// `outer: cause: root cause`, skipping repeats.
fn error_text(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut last = text.clone();
    let mut current = err.source();
    while let Some(e) = current {
        let part = e.to_string();
        if part != last && !last.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        last = part;
        current = e.source();
    }
    text
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
pub(crate) fn truncate_utf8(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}
