//! What one open HTTP request costs the client's memory, without hookline: N concurrent 1 KiB
//! POSTs from one reqwest client (built like the delivery engine's) to a server (another
//! process) that holds each request, with the client's RSS before and at the peak.
//!
//! ```sh
//! cargo run --release -p hookline-bench --example inflight_rss -- server 127.0.0.1:39999 5s &
//! cargo run --release -p hookline-bench --example inflight_rss -- client http://127.0.0.1:39999/ 10000
//! cargo run --release -p hookline-bench --example inflight_rss -- client-hyper http://127.0.0.1:39999/ 10000 2048
//! ```
//!
//! `client-hyper`: hyper-util's client (what reqwest wraps) with a fixed read buffer of
//! READ_BUF bytes instead of hyper's adaptive one starting at 8 KiB.

use std::time::Duration;

use axum::routing::post;
use axum::Router;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("server") => {
            let hold = humantime::parse_duration(args.get(2).map_or("5s", String::as_str))?;
            let listener = tokio::net::TcpListener::bind(
                args.get(1).map_or("127.0.0.1:39999", String::as_str),
            )
            .await?;
            let app = Router::new().route(
                "/",
                post(move || async move {
                    tokio::time::sleep(hold).await;
                    axum::http::StatusCode::NO_CONTENT
                }),
            );
            axum::serve(listener, app).await?;
        }
        Some(mode @ ("client" | "client-hyper")) => {
            let url = args
                .get(1)
                .cloned()
                .unwrap_or_else(|| "http://127.0.0.1:39999/".into());
            let n: usize = args.get(2).map_or(Ok(10_000), |s| s.parse())?;
            let read_buf: usize = args.get(3).map_or(Ok(2048), |s| s.parse())?;
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .tcp_nodelay(true)
                .timeout(Duration::from_secs(10))
                .build()?;
            let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
            connector.set_nodelay(true);
            let hyper_client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .http1_read_buf_exact_size(read_buf)
                    .build::<_, http_body_util::Full<bytes::Bytes>>(connector);
            let hyper_mode = mode == "client-hyper";
            let body = bytes::Bytes::from(vec![b'x'; 1024]);
            let before = rss_mib();
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..n {
                let (client, hyper_client, url, body) = (
                    client.clone(),
                    hyper_client.clone(),
                    url.clone(),
                    body.clone(),
                );
                tasks.spawn(async move {
                    if hyper_mode {
                        let req = hyper::Request::post(url.as_str())
                            .body(http_body_util::Full::new(body))
                            .map_err(|e| e.to_string())?;
                        let sent = tokio::time::timeout(
                            Duration::from_secs(10),
                            hyper_client.request(req),
                        );
                        let resp = sent.await.map_err(|e| e.to_string())?;
                        Ok::<u16, String>(resp.map_err(|e| e.to_string())?.status().as_u16())
                    } else {
                        let r = client.post(url).body(body).send().await;
                        Ok(r.map_err(|e| e.to_string())?.status().as_u16())
                    }
                });
            }
            let mut peak = 0.0f64;
            let sampler = async {
                loop {
                    peak = peak.max(rss_mib());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            let mut ok = 0usize;
            let drain = async {
                while let Some(r) = tasks.join_next().await {
                    if matches!(r, Ok(Ok(s)) if (200..300).contains(&s)) {
                        ok += 1;
                    }
                }
            };
            tokio::select! {
                _ = drain => {}
                _ = sampler => {}
            }
            println!(
                "{mode}: {n} requests ({ok} ok): RSS before {before:.1} MiB, peak {peak:.1} MiB, {:.1} KiB per open request",
                (peak - before) * 1024.0 / n as f64
            );
        }
        _ => anyhow::bail!(
            "usage: inflight_rss server ADDR HOLD | client URL N | client-hyper URL N [READ_BUF]"
        ),
    }
    Ok(())
}
