//! A TCP fault proxy between one client and the brokers: it passes bytes, holds them (a network
//! partition), delays them (a slow link), or resets every connection, switched at any time from
//! the test thread. Each proxy runs on a tokio runtime thread of its own, so the test thread can
//! block (sleep, watch processes, read topics) while connections are served.
//!
//! `kafka-cluster` gives every node a PROXIED listener that advertises the proxy's port: a client
//! bootstrapped through [`Proxies::bootstrap`] keeps all its traffic on the proxies, while the
//! test's own producer and readers use the direct ports.
//!
//! A diverting proxy ([`Proxies::start_diverting`]) reads Kafka's framing instead of passing bytes:
//! while diverting, each request of one API is sent to *another* broker, and that broker's answer
//! is returned to the client (Kafka matches answers by correlation id). For a group's
//! `OffsetFetch` that is what a client gets from a group coordinator that has just moved away: a
//! request-level `NOT_COORDINATOR`, on demand and on every try.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::cluster;

/// What a proxy does with the bytes of its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forwarded as they come.
    Pass,
    /// A partition where packets are dropped, not refused: connections stay open, new ones are
    /// accepted (and not dialled through) but no byte moves either way. Nothing is lost: the
    /// proxy stops reading, so the bytes wait in the socket buffers (as TCP would retransmit them
    /// once a partition heals), and a chunk already read waits in the proxy.
    Blackhole,
    /// Every chunk forwarded this long after it was read, both ways (a link's added latency).
    Slow(Duration),
}

/// Kafka's API key of `OffsetFetch` (the committed offsets of a group's partitions).
pub const OFFSET_FETCH: i16 = 9;

/// Requests of one API answered by another broker (see the module doc).
struct Divert {
    api_key: i16,
    /// The port of the broker that answers instead.
    to: u16,
    on: AtomicBool,
    count: AtomicUsize,
}

struct Shared {
    mode: watch::Sender<Mode>,
    /// Bumped by [`Proxy::reset`]: every connection open then is closed with an RST.
    reset: watch::Sender<u64>,
    accepted: AtomicUsize,
    /// Set for a diverting proxy: its connections are served frame by frame.
    divert: Option<Divert>,
}

/// One proxy: 127.0.0.1:`listen` → 127.0.0.1:`backend`.
pub struct Proxy {
    shared: Arc<Shared>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Proxy {
    /// Binds 127.0.0.1:`listen` (fails the test if the port is taken) and serves it in `Pass`.
    pub fn start(listen: u16, backend: u16) -> Proxy {
        Proxy::start_with(listen, backend, None)
    }

    fn start_with(listen: u16, backend: u16, divert: Option<Divert>) -> Proxy {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("fault-proxy-{listen}"))
            .enable_all()
            .build()
            .expect("proxy runtime");
        let std_listener = std::net::TcpListener::bind(("127.0.0.1", listen))
            .unwrap_or_else(|e| panic!("fault proxy: bind 127.0.0.1:{listen}: {e}"));
        std_listener.set_nonblocking(true).expect("nonblocking");
        let listener = {
            let _rt = rt.enter();
            TcpListener::from_std(std_listener).expect("proxy listener")
        };
        let shared = Arc::new(Shared {
            mode: watch::Sender::new(Mode::Pass),
            reset: watch::Sender::new(0),
            accepted: AtomicUsize::new(0),
            divert,
        });
        rt.spawn(accept_loop(listener, backend, shared.clone()));
        Proxy {
            shared,
            rt: Some(rt),
        }
    }

    /// Switches the mode; existing connections follow at their next chunk.
    pub fn set(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    /// Closes every connection open now (an RST to both ends); new ones are served as before.
    #[allow(dead_code)] // not used by a scenario yet
    pub fn reset(&self) {
        self.shared.reset.send_modify(|g| *g += 1);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Closes the listener and every connection before returning, so the port is free again.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

async fn accept_loop(listener: TcpListener, backend: u16, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                if shared.divert.is_some() {
                    tokio::spawn(kafka_connection(client, backend, shared.clone()));
                } else {
                    tokio::spawn(connection(client, backend, shared.clone()));
                }
            }
            Err(e) => {
                // E.g. out of file descriptors: back off rather than spin.
                eprintln!("fault proxy: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one client connection until either end closes it or a reset.
async fn connection(mut client: TcpStream, backend: u16, shared: Arc<Shared>) {
    let mut reset = shared.reset.subscribe();
    let mode = shared.mode.subscribe();
    let _ = client.set_nodelay(true);
    // A partition drops the SYN towards the broker: dial only once the link is up again.
    let mut up = mode.clone();
    let dialled = tokio::select! {
        r = up.wait_for(|m| *m != Mode::Blackhole) => r.is_ok(),
        _ = reset.changed() => false,
    };
    let mut server = match dialled {
        true => match TcpStream::connect(("127.0.0.1", backend)).await {
            Ok(s) => s,
            Err(_) => return abort(&client, None),
        },
        false => return abort(&client, None),
    };
    let _ = server.set_nodelay(true);
    let reset_now = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        tokio::select! {
            _ = async { tokio::try_join!(pump(cr, sw, mode.clone()), pump(sr, cw, mode.clone())) } => false,
            _ = reset.changed() => true,
        }
    };
    if reset_now {
        abort(&client, Some(&server));
    }
}

/// Serves one connection of a diverting proxy frame by frame (no fault modes): each request of
/// the diverted API, while diverting is on, is answered by the other broker over a connection of
/// its own; everything else passes. Frames are written whole, so an answer from the other broker
/// never lands inside one from the connection's own.
async fn kafka_connection(client: TcpStream, backend: u16, shared: Arc<Shared>) {
    let Some(divert) = shared.divert.as_ref() else {
        return;
    };
    let _ = client.set_nodelay(true);
    let Ok(server) = TcpStream::connect(("127.0.0.1", backend)).await else {
        return abort(&client, None);
    };
    let _ = server.set_nodelay(true);
    let (mut cr, cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let cw = tokio::sync::Mutex::new(cw);
    let down = async {
        while let Some(frame) = read_frame(&mut sr).await? {
            cw.lock().await.write_all(&frame).await?;
        }
        cw.lock().await.shutdown().await
    };
    let up = async {
        while let Some(frame) = read_frame(&mut cr).await? {
            let key = frame.get(4..6).map(|k| i16::from_be_bytes([k[0], k[1]]));
            if divert.on.load(Ordering::Relaxed) && key == Some(divert.api_key) {
                let answer = ask(divert.to, &frame).await?;
                divert.count.fetch_add(1, Ordering::Relaxed);
                cw.lock().await.write_all(&answer).await?;
            } else {
                sw.write_all(&frame).await?;
            }
        }
        sw.shutdown().await
    };
    let _ = tokio::try_join!(up, down);
}

/// One Kafka frame (its 4-byte size included); `None` at a clean end of the stream.
async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut size = [0u8; 4];
    match rd.read_exact(&mut size).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = i32::from_be_bytes(size);
    let n = usize::try_from(n)
        .ok()
        .filter(|n| *n <= 256 << 20)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("frame size {n}")))?;
    let mut frame = vec![0u8; 4 + n];
    frame[..4].copy_from_slice(&size);
    rd.read_exact(&mut frame[4..]).await?;
    Ok(Some(frame))
}

/// Sends one request frame to the broker on `port` and returns its answer.
async fn ask(port: u16, request: &[u8]) -> io::Result<Vec<u8>> {
    let mut broker = TcpStream::connect(("127.0.0.1", port)).await?;
    broker.write_all(request).await?;
    read_frame(&mut broker)
        .await?
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "no answer"))
}

/// Makes the drop of the sockets an RST instead of a FIN.
fn abort(client: &TcpStream, server: Option<&TcpStream>) {
    let _ = client.set_zero_linger();
    if let Some(s) = server {
        let _ = s.set_zero_linger();
    }
}

/// One direction of a connection: a reader that stops reading while blackholed, and a writer
/// that forwards each chunk when the mode lets it. On EOF the write side is shut down (a FIN
/// passed on) once everything read has been written.
async fn pump<R, W>(rd: R, mut wr: W, mode: watch::Receiver<Mode>) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(16);
    let writer = async {
        let mut mode = mode.clone();
        while let Some((read_at, chunk)) = rx.recv().await {
            hold(&mut mode, read_at).await;
            wr.write_all(&chunk).await?;
        }
        // The FIN is a packet too: not through a partition.
        hold(&mut mode, Instant::now()).await;
        wr.shutdown().await
    };
    tokio::try_join!(read_side(rd, tx, mode.clone()), writer).map(|_| ())
}

async fn read_side<R: AsyncRead + Unpin>(
    mut rd: R,
    tx: mpsc::Sender<(Instant, Vec<u8>)>,
    mut mode: watch::Receiver<Mode>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if mode.wait_for(|m| *m != Mode::Blackhole).await.is_err() {
            return Ok(());
        }
        let n = rd.read(&mut buf).await?;
        if n == 0 || tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
            // `tx` dropped here: the writer drains what was read, then passes the FIN on.
            return Ok(());
        }
    }
}

/// Waits until a chunk read at `read_at` may be written: at once in `Pass`, `d` after it was read
/// in `Slow(d)`, not while `Blackhole` (re-checked whenever the mode changes).
async fn hold(mode: &mut watch::Receiver<Mode>, read_at: Instant) {
    loop {
        let current = *mode.borrow_and_update();
        match current {
            Mode::Pass => return,
            Mode::Blackhole => {
                if mode.changed().await.is_err() {
                    return;
                }
            }
            Mode::Slow(d) => {
                let due = read_at + d;
                if Instant::now() >= due {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => return,
                    r = mode.changed() => if r.is_err() { return },
                }
            }
        }
    }
}

/// One proxy per node of the cluster (`kafka-cluster proxy-map`), switched together.
pub struct Proxies {
    proxies: Vec<Proxy>,
}

impl Proxies {
    /// Starts a proxy for every node, all in `Pass`.
    pub fn start_all() -> Proxies {
        let map = cluster::proxy_map();
        assert!(!map.is_empty(), "kafka-cluster proxy-map printed no node");
        Proxies {
            proxies: map
                .into_iter()
                .map(|(listen, backend)| Proxy::start(listen, backend))
                .collect(),
        }
    }

    /// Starts a diverting proxy for every node (see the module doc), not diverting yet: each
    /// node's `api_key` requests go to the next node's broker.
    pub fn start_diverting(api_key: i16) -> Proxies {
        let map = cluster::proxy_map();
        assert!(
            map.len() > 1,
            "kafka-cluster proxy-map printed fewer than two nodes"
        );
        let proxies = (0..map.len())
            .map(|i| {
                let (listen, backend) = map[i];
                let divert = Divert {
                    api_key,
                    to: map[(i + 1) % map.len()].1,
                    on: AtomicBool::new(false),
                    count: AtomicUsize::new(0),
                };
                Proxy::start_with(listen, backend, Some(divert))
            })
            .collect();
        Proxies { proxies }
    }

    /// Turns diverting on or off on every diverting proxy.
    pub fn divert(&self, on: bool) {
        for p in &self.proxies {
            if let Some(d) = &p.shared.divert {
                d.on.store(on, Ordering::Relaxed);
            }
        }
    }

    /// Requests answered by another broker so far.
    pub fn diverted(&self) -> usize {
        self.proxies
            .iter()
            .filter_map(|p| p.shared.divert.as_ref())
            .map(|d| d.count.load(Ordering::Relaxed))
            .sum()
    }

    /// The bootstrap servers through the proxies.
    pub fn bootstrap(&self) -> String {
        cluster::proxy_bootstrap()
    }

    /// Sets `mode` on every proxy.
    pub fn set(&self, mode: Mode) {
        for p in &self.proxies {
            p.set(mode);
        }
    }

    /// Resets every connection of every proxy.
    #[allow(dead_code)] // not used by a scenario yet
    pub fn reset(&self) {
        for p in &self.proxies {
            p.reset();
        }
    }

    /// Connections accepted by all proxies so far.
    pub fn accepted(&self) -> usize {
        self.proxies.iter().map(Proxy::accepted).sum()
    }
}
