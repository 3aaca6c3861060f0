//! The HTTP side of an attempt: the one pooled client (no redirects, no proxy, the guarded
//! resolver), the bounded read of the kept part of a response body, and the classification of
//! transport errors into [`FailureClass`]es with their text (never the URL).

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use hookline_common::config::HttpConfig;

use crate::outcome::FailureClass;
use crate::ssrf::{BlockedAddress, GuardedResolver, SsrfGuard};

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// TCP keepalive on endpoint connections, to notice dead peers on pooled connections.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// One pooled client for every endpoint: no redirects, no proxy, names resolved through the
/// SSRF guard, connect bounded by the timeout.
pub(crate) fn build(
    http: &HttpConfig,
    guard: Arc<SsrfGuard>,
    idle_per_host: usize,
) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .use_rustls_tls()
        .redirect(reqwest::redirect::Policy::none())
        // A proxy from the environment would make the resolver check the proxy, not the
        // endpoint, and route deliveries somewhere the operator did not configure.
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver::new(guard)))
        .user_agent(http.user_agent.as_str())
        .connect_timeout(http.timeout)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(idle_per_host)
        .tcp_keepalive(TCP_KEEPALIVE)
        .tcp_nodelay(true)
        .referer(false)
        .build()
}

/// Up to `max` bytes of the response body, whatever arrived within `grace`; a body that is slow,
/// endless or broken just ends the read early.
pub(crate) async fn read_kept(
    response: &mut reqwest::Response,
    max: usize,
    grace: Duration,
) -> Vec<u8> {
    let mut kept: Vec<u8> = Vec::new();
    let read = async {
        while kept.len() < max {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let take = chunk.len().min(max - kept.len());
                    kept.extend_from_slice(&chunk[..take]);
                }
                Ok(None) | Err(_) => break,
            }
        }
    };
    // Elapsed: what arrived so far is what is kept.
    let _ = tokio::time::timeout(grace, read).await;
    kept
}

/// The class of a transport error and its text (without the URL, which may carry tokens); a
/// blocked address keeps the resolver's own text, reqwest's wrapping adds nothing.
pub(crate) fn transport_failure(err: reqwest::Error) -> (FailureClass, String) {
    let err = err.without_url();
    let class = classify(&err);
    if class == FailureClass::Blocked {
        if let Some(blocked) = find_in_chain::<BlockedAddress>(&err) {
            return (class, blocked.to_string());
        }
    }
    (class, error_text(&err))
}

fn classify(err: &reqwest::Error) -> FailureClass {
    if err.is_timeout() {
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
