//! Pooled connections an endpoint's server closes while idle (RFC 9112 §9.3.1): several
//! endpoints on one host:port share the dispatcher's pool; the server reads one request per
//! connection, answers, and closes a second later without `Connection: close`. A request written
//! onto such a connection is never read: it must go out again at once on a new connection, not
//! count as the endpoint's failure (issue 39, defect 1).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use hookline_common::contract::headers as h;

use crate::harness::*;

/// One request the server read: its path and the `webhook-*` headers that identify it.
#[derive(Clone, Debug)]
struct Read {
    path: String,
    id: String,
    attempt: String,
}

/// Reads one HTTP/1 request (head + `content-length` body); `None` at EOF or error first.
async fn read_request(socket: &mut TcpStream) -> Option<Read> {
    let mut data = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_string();
            let mut lines = head.lines();
            let path = lines.next()?.split(' ').nth(1)?.to_string();
            let mut fields = BTreeMap::new();
            for line in lines {
                if let Some((k, v)) = line.split_once(':') {
                    fields.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                }
            }
            let length: usize = fields
                .get("content-length")
                .map_or(0, |v| v.parse().unwrap_or(0));
            if data.len() >= end + 4 + length {
                return Some(Read {
                    path,
                    id: fields.get("webhook-id").cloned().unwrap_or_default(),
                    attempt: fields.get("webhook-attempt").cloned().unwrap_or_default(),
                });
            }
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => data.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The server of the defect report: one request per connection; `/moved` answers `302` with
/// `Content-Length: 0`, every other path `200`; the connection stays open `linger` unread,
/// then closes (a request written meanwhile is reset). Returns every request it read.
async fn close_late_server(linger: Duration) -> (SocketAddr, Arc<Mutex<Vec<Read>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let Some(read) = read_request(&mut socket).await else {
                    return;
                };
                let answer: &[u8] = if read.path == "/moved" {
                    b"HTTP/1.1 302 Found\r\nlocation: /elsewhere\r\ncontent-length: 0\r\n\r\n"
                } else {
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
                };
                log.lock().expect("log").push(read);
                let _ = socket.write_all(answer).await;
                tokio::time::sleep(linger).await;
            });
        }
    });
    (addr, seen)
}

fn stale_retries(running: &Running) -> f64 {
    counter(
        &running.registry,
        "hookline_delivery_stale_connection_retries_total",
        None,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_lost_on_connections_the_endpoint_closed_idle_go_out_again_on_attempt_1() {
    require_kafka();
    let (addr, seen) = close_late_server(Duration::from_secs(1)).await;
    let prefix = unique_prefix("conn-stale");
    let url = |path: &str| format!("http://{addr}/{path}");
    let mut extra = String::from("[retry]\nschedule = [\"0s\", \"1s\", \"2s\"]\n");
    for id in ["a", "b", "moved"] {
        extra.push_str(&format!(
            "[[endpoints]]\nid = \"{id}\"\nurl = \"{}\"\n",
            url(id)
        ));
    }
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let running = start_dispatcher(&config);

    // Waves of events, so connections come back to the pool and are picked up again while the
    // server lingers on them.
    let p = producer();
    let ids: Vec<String> = (0..120).map(|i| format!("evt-{i:03}")).collect();
    for wave in ids.chunks(20) {
        futures::future::join_all(wave.iter().map(|id| {
            let value = format!(r#"{{"id":"{id}","type":"thing.happened","data":{{}}}}"#);
            let dedupe_key = format!("dk-{id}");
            let p = &p;
            let topic = format!("{prefix}.dispatch");
            async move {
                produce(
                    p,
                    &topic,
                    None,
                    Some(id.as_bytes()),
                    Some(value.as_bytes()),
                    &[
                        (h::EVENT_ID, id.as_str()),
                        (h::EVENT_TYPE, "thing.happened"),
                        (h::DEDUPE_KEY, dedupe_key.as_str()),
                    ],
                )
                .await
            }
        }))
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let at = |path: &str| -> Vec<Read> {
        let path = format!("/{path}");
        seen.lock()
            .expect("log")
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    };
    while (at("a").len() < ids.len() || at("b").len() < ids.len()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    for path in ["a", "b"] {
        let reads = at(path);
        let mut by_id: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for r in &reads {
            by_id.entry(&r.id).or_default().push(&r.attempt);
        }
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| !by_id.contains_key(id.as_str()))
            .collect();
        assert!(missing.is_empty(), "/{path} never read {missing:?}");
        let not_once: Vec<_> = by_id
            .iter()
            .filter(|(_, a)| a.as_slice() != ["1"])
            .collect();
        assert!(
            not_once.is_empty(),
            "/{path}: every event read once, on attempt 1: {not_once:?}"
        );
    }
    let again = stale_retries(&running);
    println!(
        "requests sent again on a new connection: {again} (of {} requests)",
        3 * ids.len()
    );
    assert!(
        again >= 1.0,
        "the test must reuse connections the server closed: {again}"
    );

    // Only the 302 endpoint's deliveries went to the first retry tier.
    let tier = read_until(
        &format!("{prefix}.retry.1s"),
        Duration::from_secs(10),
        |r| r.len() >= ids.len(),
    );
    let mut endpoints: BTreeMap<String, usize> = BTreeMap::new();
    for m in &tier {
        let ep = header(m, hookline_common::contract::delivery::ENDPOINT_ID).unwrap_or("?");
        *endpoints.entry(ep.to_string()).or_default() += 1;
    }
    assert_eq!(
        endpoints,
        BTreeMap::from([("moved".to_string(), ids.len())]),
        "only the 302 endpoint retries"
    );
    running.stop().await.expect("clean stop");
}
