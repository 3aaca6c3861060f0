//! What one open HTTP request costs the client's memory, without hookline: N concurrent 1 KiB
//! POSTs from one reqwest client (built like the delivery engine's) to a server (another
//! process) that holds each request, with the client's RSS before and at the peak.
//!
//! ```sh
//! cargo run --release -p hookline-bench --example inflight_rss -- server 127.0.0.1:39999 5s &
//! cargo run --release -p hookline-bench --example inflight_rss -- client http://127.0.0.1:39999/ 10000
//! ```

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
        Some("client") => {
            let url = args
                .get(1)
                .cloned()
                .unwrap_or_else(|| "http://127.0.0.1:39999/".into());
            let n: usize = args.get(2).map_or(Ok(10_000), |s| s.parse())?;
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .tcp_nodelay(true)
                .timeout(Duration::from_secs(10))
                .build()?;
            let body = bytes::Bytes::from(vec![b'x'; 1024]);
            let before = rss_mib();
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..n {
                let (client, url, body) = (client.clone(), url.clone(), body.clone());
                tasks.spawn(
                    async move { client.post(url).body(body).send().await.map(|r| r.status()) },
                );
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
                    if matches!(r, Ok(Ok(s)) if s.is_success()) {
                        ok += 1;
                    }
                }
            };
            tokio::select! {
                _ = drain => {}
                _ = sampler => {}
            }
            println!(
                "{n} requests ({ok} ok): RSS before {before:.1} MiB, peak {peak:.1} MiB, {:.1} KiB per open request",
                (peak - before) * 1024.0 / n as f64
            );
        }
        _ => anyhow::bail!("usage: inflight_rss server ADDR HOLD | client URL N"),
    }
    Ok(())
}
