//! What an HTTP/1 connection has carried, so that a request lost on a pooled connection the
//! endpoint had already closed goes out again on a new one instead of counting as the
//! endpoint's failure.
//!
//! RFC 9112 §9.3.1 lets a server close an idle persistent connection at any time, and a client
//! retry a request the server never read. The race is real: an endpoint that answers and closes
//! its connection a moment later without `Connection: close` (a `302` with no body, a proxy's
//! idle cut) leaves it in the pool; the next request is written onto it, the server never reads
//! it and resets the connection. hyper-util retries only a request it had not started writing;
//! this one was written, so the attempt failed as `io` after ~1 s — and three such in a row made
//! an event dead at an endpoint that answers 200 to every request it reads.
//!
//! Each connection the client opens is wrapped in [`Tracked`], which counts the requests started
//! on it (a write after a read, the way HTTP/1 without pipelining takes turns) and the response
//! bytes read since the latest one started. The count rides on the connection's [`Connected`]
//! info, which hyper-util attaches to a failed request's error, so the engine can ask
//! [`went_stale`]: the request was not the connection's first and not one byte of a response
//! had arrived. Such a request goes out once more at once, on a new connection, within the same
//! timeout (a webhook is idempotent by its `webhook-id`). HTTP/2 connections are left alone:
//! hyper already retries streams a `GOAWAY` refused, and its frames are not one request's turn.
//!
//! The wrapper sits above TLS (it wraps the TLS connector's stream), so it counts the
//! application's bytes, not handshake records.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Extensions, Uri};
use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};

/// What one connection has carried. Only its own I/O writes it; the engine reads it after a
/// failed request, so relaxed atomics suffice.
#[derive(Debug)]
struct Uses {
    /// Requests started: the first write, then every write that follows a read.
    requests: AtomicU64,
    /// Bytes read from the connection, in all.
    read: AtomicU64,
    /// `read` when the latest request started.
    read_at_request: AtomicU64,
    /// The last I/O that moved bytes was a read (so the next write starts a request).
    after_read: AtomicBool,
}

/// The shared view of one connection's [`Uses`], carried in its [`Connected`] extras.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionUse(Arc<Uses>);

impl ConnectionUse {
    fn new() -> Self {
        ConnectionUse(Arc::new(Uses {
            requests: AtomicU64::new(0),
            read: AtomicU64::new(0),
            read_at_request: AtomicU64::new(0),
            after_read: AtomicBool::new(true),
        }))
    }

    /// The latest request was not the connection's first, and nothing was read since it began.
    fn reused_and_unanswered(&self) -> bool {
        let uses = &self.0;
        uses.requests.load(Relaxed) >= 2
            && uses.read.load(Relaxed) == uses.read_at_request.load(Relaxed)
    }

    fn wrote(&self) {
        let uses = &self.0;
        if uses.after_read.swap(false, Relaxed) {
            uses.requests.fetch_add(1, Relaxed);
            uses.read_at_request.store(uses.read.load(Relaxed), Relaxed);
        }
    }

    fn read(&self, n: usize) {
        if n > 0 {
            self.0.read.fetch_add(n as u64, Relaxed);
            self.0.after_read.store(true, Relaxed);
        }
    }
}

/// Did this failed request go out on a reused HTTP/1 connection that the endpoint closed
/// without reading it — no byte of a response arrived? Then it may be sent again on a new
/// connection. A connect error, a timeout or a TLS failure is never such a case.
pub(crate) fn went_stale(err: &hyper_util::client::legacy::Error) -> bool {
    if err.is_connect() {
        return false;
    }
    let Some(connected) = err.connect_info() else {
        return false;
    };
    if connected.is_negotiated_h2() {
        return false;
    }
    let mut extras = Extensions::new();
    connected.get_extras(&mut extras);
    extras
        .get::<ConnectionUse>()
        .is_some_and(ConnectionUse::reused_and_unanswered)
}

/// A connection counted as it carries requests.
pub(crate) struct Tracked<T> {
    inner: T,
    uses: ConnectionUse,
}

impl<T: Read + Unpin> Read for Tracked<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // SAFETY: the steps of hyper-util's `TokioIo::poll_read`: `inner` is handed the unfilled
        // part of `buf` as a fresh buffer, initialises and fills `n` bytes of it, and `buf` is
        // advanced by exactly those `n`.
        let n = unsafe {
            let mut part = ReadBuf::uninit(buf.as_mut());
            match Pin::new(&mut this.inner).poll_read(cx, part.unfilled()) {
                Poll::Ready(Ok(())) => part.filled().len(),
                other => return other,
            }
        };
        unsafe { buf.advance(n) };
        this.uses.read(n);
        Poll::Ready(Ok(()))
    }
}

impl<T: Write + Unpin> Write for Tracked<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.uses.wrote();
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.uses.wrote();
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for Tracked<T> {
    fn connected(&self) -> Connected {
        self.inner.connected().extra(self.uses.clone())
    }
}

/// A connector whose connections are [`Tracked`].
#[derive(Clone)]
pub(crate) struct Tracking<C>(pub(crate) C);

type Connecting<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<C> tower_service::Service<Uri> for Tracking<C>
where
    C: tower_service::Service<Uri>,
    C::Future: Send + 'static,
    C::Response: 'static,
{
    type Response = Tracked<C::Response>;
    type Error = C::Error;
    type Future = Connecting<Self::Response, C::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            Ok(Tracked {
                inner: connecting.await?,
                uses: ConnectionUse::new(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_request_is_never_a_stale_reuse() {
        let uses = ConnectionUse::new();
        uses.wrote();
        uses.wrote();
        assert!(!uses.reused_and_unanswered(), "one request, two writes");
    }

    #[test]
    fn a_second_request_with_nothing_read_since_is_a_stale_reuse() {
        let uses = ConnectionUse::new();
        uses.wrote();
        uses.read(38);
        uses.wrote();
        uses.wrote();
        assert!(uses.reused_and_unanswered());
        uses.read(5);
        assert!(
            !uses.reused_and_unanswered(),
            "part of a response arrived: the endpoint read the request"
        );
    }

    #[test]
    fn reads_of_nothing_do_not_end_a_turn() {
        let uses = ConnectionUse::new();
        uses.wrote();
        uses.read(0);
        uses.wrote();
        assert_eq!(uses.0.requests.load(Relaxed), 1);
    }
}
