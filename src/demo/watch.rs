//! The demo's live progress view (`hookline demo produce --watch`): what the producer sent, and
//! what the pipeline did with it, read from the pipeline's own `/metrics` page (the same numbers
//! an operator's dashboard shows), until every event is delivered or dead; then a summary with
//! the `dead list` / `replay` commands to try.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use hookline_common::config::Config;

use super::Produced;

const POLL: Duration = Duration::from_millis(500);
/// Consecutive settled polls before the demo is called finished (metrics of different stages
/// are updated at different moments).
const SETTLED_POLLS: u32 = 4;

/// The metrics page of a pipeline listening on `listen` (a wildcard address is read locally).
pub fn metrics_url(listen: SocketAddr) -> String {
    let host = if listen.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        listen.ip().to_string()
    };
    format!("http://{host}:{}/metrics", listen.port())
}

/// The progress lines. Cloning shares them (the producer task updates the first one).
#[derive(Clone)]
pub struct View {
    multi: MultiProgress,
    produced: ProgressBar,
    deduplicated: ProgressBar,
    delivered: ProgressBar,
    dead: ProgressBar,
    tiers: std::sync::Arc<std::sync::Mutex<BTreeMap<String, ProgressBar>>>,
}

fn line(multi: &MultiProgress, label: &str, template: &str) -> ProgressBar {
    let bar = multi.add(ProgressBar::new(0));
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

impl View {
    pub fn new(count: u64) -> View {
        let multi = MultiProgress::new();
        let counter = "{prefix:>14} {pos:>6}  {msg}";
        let produced = line(
            &multi,
            "produced",
            "{prefix:>14} {pos:>6}/{len} [{bar:30.cyan/blue}] {msg}",
        );
        produced.set_length(count);
        View {
            deduplicated: line(&multi, "deduplicated", counter),
            delivered: line(&multi, "delivered", counter),
            dead: line(&multi, "dead", counter),
            produced,
            multi,
            tiers: Default::default(),
        }
    }

    /// Called by the producer after each record.
    pub fn produced(&self, distinct: u64, resent: u64) {
        self.produced.set_position(distinct);
        self.produced
            .set_message(format!("+{resent} re-sent ids (the deduper drops them)"));
    }

    fn tier(&self, tier: &str) -> Option<ProgressBar> {
        let mut tiers = self.tiers.lock().ok()?;
        if let Some(bar) = tiers.get(tier) {
            return Some(bar.clone());
        }
        // Tiers sorted by name would put 15s before 5s: insert before `dead` in arrival order.
        let bar = self.multi.insert_before(&self.dead, ProgressBar::new(0));
        bar.set_style(
            ProgressStyle::with_template("{prefix:>14} {pos:>6}  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(format!("retrying {tier}"));
        tiers.insert(tier.to_string(), bar.clone());
        Some(bar)
    }

    fn show(&self, m: &Snapshot) {
        self.deduplicated.set_position(m.duplicates as u64);
        self.deduplicated.set_message(format!(
            "{} events forwarded, {} invalid",
            m.forwarded, m.invalid
        ));
        self.delivered.set_position(m.delivered as u64);
        self.delivered.set_message(format!(
            "attempts that got a 2xx ({} on a retry)",
            m.delivered_on_retry
        ));
        // In schedule order (5s before 15s), not name order.
        let mut tiers: Vec<_> = m.tiers.iter().collect();
        tiers.sort_by_key(|(tier, _)| tier_millis(tier));
        for (tier, (waiting, inflight)) in tiers {
            if let Some(bar) = self.tier(tier) {
                bar.set_position((waiting + inflight) as u64);
                bar.set_message("waiting until due or being attempted".to_string());
            }
        }
        self.dead.set_position(m.dead as u64);
        self.dead
            .set_message("deliveries in the dead-letter topic (this run)".to_string());
    }

    fn finish(&self) {
        for bar in [
            &self.produced,
            &self.deduplicated,
            &self.delivered,
            &self.dead,
        ] {
            bar.abandon();
        }
        if let Ok(tiers) = self.tiers.lock() {
            tiers.values().for_each(ProgressBar::abandon);
        }
    }
}

/// A tier name's delay in milliseconds (`1500ms`, `5s`, `30m`, `2h`, `1d`), for ordering only.
fn tier_millis(tier: &str) -> u64 {
    let split = tier
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(tier.len());
    let n: u64 = tier[..split].parse().unwrap_or(u64::MAX / 100_000_000);
    let unit = match &tier[split..] {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => 1,
    };
    n.saturating_mul(unit)
}

/// The pipeline's counters that the view shows; relative to the start of the demo.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub records_in: f64,
    pub invalid: f64,
    pub forwarded: f64,
    pub duplicates: f64,
    pub dispatched: f64,
    pub dispatcher_inflight: f64,
    pub delivered: f64,
    pub delivered_on_retry: f64,
    pub dead: f64,
    /// tier → (waiting, in flight)
    pub tiers: BTreeMap<String, (f64, f64)>,
}

/// One sample of the Prometheus text format: name, labels, value.
type Sample<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);

fn parse_line(line: &str) -> Option<Sample<'_>> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match head.split_once('{') {
        Some((name, rest)) => {
            let inner = rest.strip_suffix('}')?;
            let labels = inner
                .split("\",")
                .filter_map(|pair| {
                    let (k, v) = pair.split_once("=\"")?;
                    Some((k, v.trim_end_matches('"')))
                })
                .collect();
            (name, labels)
        }
        None => (head, Vec::new()),
    };
    Some((name, labels, value))
}

impl Snapshot {
    pub fn parse(page: &str) -> Snapshot {
        let mut s = Snapshot::default();
        for (name, labels, v) in page.lines().filter_map(parse_line) {
            let label = |k: &str| labels.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
            match name {
                "hookline_deduper_valid_events_total" => s.records_in += v,
                "hookline_deduper_invalid_events_total" => {
                    s.records_in += v;
                    s.invalid += v;
                }
                "hookline_deduper_forwarded_total" => s.forwarded += v,
                "hookline_deduper_duplicates_total" => s.duplicates += v,
                "hookline_dispatcher_events_total" => s.dispatched += v,
                "hookline_dispatcher_inflight_events" => s.dispatcher_inflight += v,
                "hookline_delivery_attempts_total" if label("result") == Some("delivered") => {
                    match label("stage") {
                        Some("dispatcher") => s.delivered += v,
                        Some(stage) if stage.starts_with("retry.") => {
                            s.delivered += v;
                            s.delivered_on_retry += v;
                        }
                        _ => {}
                    }
                }
                "hookline_dispatcher_handoffs_total" if label("target") == Some("dlq") => {
                    s.dead += v
                }
                "hookline_retry_records_total"
                    if label("outcome").is_some_and(|o| o.starts_with("dead_")) =>
                {
                    s.dead += v
                }
                "hookline_retry_waiting_records" | "hookline_retry_inflight_records" => {
                    if let Some(tier) = label("tier") {
                        let entry = s.tiers.entry(tier.to_string()).or_default();
                        if name.ends_with("waiting_records") {
                            entry.0 += v;
                        } else {
                            entry.1 += v;
                        }
                    }
                }
                _ => {}
            }
        }
        s
    }

    /// Counters since `base` (gauges stay absolute): the pipeline may have run before the demo.
    pub fn since(&self, base: &Snapshot) -> Snapshot {
        Snapshot {
            records_in: self.records_in - base.records_in,
            invalid: self.invalid - base.invalid,
            forwarded: self.forwarded - base.forwarded,
            duplicates: self.duplicates - base.duplicates,
            dispatched: self.dispatched - base.dispatched,
            dispatcher_inflight: self.dispatcher_inflight,
            delivered: self.delivered - base.delivered,
            delivered_on_retry: self.delivered_on_retry - base.delivered_on_retry,
            dead: self.dead - base.dead,
            tiers: self.tiers.clone(),
        }
    }

    /// Every produced record went through the deduper, every forwarded event through the
    /// dispatcher, and nothing waits on a tier or is in flight.
    pub fn settled(&self, produced: &Produced) -> bool {
        let records = (produced.distinct + produced.resent) as f64;
        self.records_in >= records
            && self.forwarded + self.duplicates + self.invalid >= records
            && self.dispatched >= self.forwarded
            && self.dispatcher_inflight == 0.0
            && self
                .tiers
                .values()
                .all(|(waiting, inflight)| *waiting == 0.0 && *inflight == 0.0)
    }
}

/// GET `url` (plain HTTP, the pipeline's ops server) and return the body.
async fn fetch(url: &str) -> anyhow::Result<String> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--metrics-url {url}: only http:// is supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/metrics"),
    };
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(authority).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .with_context(|| format!("reading {url}: timed out"))?
        .with_context(|| format!("reading {url}"))?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("{url}: not an HTTP response"))?;
    let status = head.split_whitespace().nth(1);
    if !head.starts_with("HTTP/1.") || status != Some("200") {
        anyhow::bail!("{url}: {}", head.lines().next().unwrap_or("no status line"));
    }
    Ok(body.to_string())
}

/// The end of a watched demo run.
pub struct Outcome {
    pub produced: Produced,
    pub seen: Snapshot,
    pub settled: bool,
}

/// Shows the view until the producer finished and the pipeline settled (or `timeout`).
pub async fn run(
    view: &View,
    url: &str,
    producer: tokio::task::JoinHandle<anyhow::Result<Produced>>,
    timeout: Duration,
) -> anyhow::Result<Outcome> {
    let base = match fetch(url).await {
        Ok(page) => Snapshot::parse(&page),
        Err(e) => {
            producer.abort();
            return Err(e.context(
                "the live view reads the running pipeline's /metrics (start `hookline run all` \
                 first, or pass --metrics-url)",
            ));
        }
    };
    let start = Instant::now();
    let mut producer = Some(producer);
    let mut produced = None;
    let mut seen = Snapshot::default();
    let mut settled_polls = 0;
    loop {
        if let Some(handle) = producer.as_mut().filter(|h| h.is_finished()) {
            produced = Some(handle.await.context("the producer task")??);
            producer = None;
        }
        if let Ok(page) = fetch(url).await {
            seen = Snapshot::parse(&page).since(&base);
            view.show(&seen);
        }
        if let Some(p) = &produced {
            settled_polls = if seen.settled(p) {
                settled_polls + 1
            } else {
                0
            };
            if settled_polls >= SETTLED_POLLS {
                break;
            }
        }
        if start.elapsed() > timeout {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    view.finish();
    let produced = match (produced, producer) {
        (Some(p), _) => p,
        (None, Some(handle)) => {
            handle.abort();
            anyhow::bail!("the demo producer did not finish within {timeout:?}")
        }
        (None, None) => Produced::default(),
    };
    Ok(Outcome {
        settled: settled_polls >= SETTLED_POLLS,
        produced,
        seen,
    })
}

/// The closing summary, with the commands to try next.
pub fn summary(outcome: &Outcome, config_path: &Path, config: &Config) {
    let s = &outcome.seen;
    let p = &outcome.produced;
    println!();
    if outcome.settled {
        println!("demo finished: every event is delivered or dead");
    } else {
        println!("demo: still settling when the watch timed out (the pipeline keeps going)");
    }
    println!(
        "  produced      {} events + {} re-sent ids",
        p.distinct, p.resent
    );
    println!("  deduplicated  {} (dropped by the deduper)", s.duplicates);
    println!(
        "  delivered     {} attempts got a 2xx ({} of them retries)",
        s.delivered, s.delivered_on_retry
    );
    println!("  dead          {} deliveries", s.dead);
    let bin = std::env::args()
        .next()
        .unwrap_or_else(|| "hookline".to_string());
    let cfg = config_path.display();
    println!();
    println!("try:");
    println!("  {bin} --config {cfg} dead list                     # the dead letters");
    println!("  {bin} --config {cfg} dead show <position>          # one, with its attempts");
    println!("  {bin} --config {cfg} replay --all --dry-run        # what a replay would send");
    println!("  {bin} --config {cfg} replay --all                  # send them again (idempotent)");
    println!(
        "  metrics: {}   dashboard: deploy/monitoring/grafana-dashboard.json",
        metrics_url(config.server.listen)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# HELP x
hookline_deduper_valid_events_total 27
hookline_deduper_invalid_events_total{reason="not_json"} 1
hookline_deduper_forwarded_total 20
hookline_deduper_duplicates_total 7
hookline_dispatcher_events_total{result="fanned_out"} 20
hookline_dispatcher_inflight_events 0
hookline_delivery_attempts_total{class="ok",result="delivered",stage="dispatcher"} 22
hookline_delivery_attempts_total{class="http_status",result="failed",stage="dispatcher"} 5
hookline_dispatcher_handoffs_total{target="dlq"} 0
hookline_delivery_attempts_total{class="ok",result="delivered",stage="retry.5s"} 4
hookline_delivery_attempts_total{class="ok",result="delivered",stage="replay"} 1
hookline_retry_records_total{outcome="dead_exhausted",tier="30s"} 2
hookline_retry_records_total{outcome="delivered",tier="5s"} 4
hookline_retry_waiting_records{tier="5s"} 1
hookline_retry_inflight_records{tier="5s"} 0
"#;

    #[test]
    fn snapshot_reads_the_pipeline_counters() {
        let s = Snapshot::parse(PAGE);
        assert_eq!(s.records_in, 28.0);
        assert_eq!(s.duplicates, 7.0);
        assert_eq!(s.delivered, 26.0);
        assert_eq!(s.delivered_on_retry, 4.0);
        assert_eq!(s.dead, 2.0);
        assert_eq!(s.tiers.get("5s"), Some(&(1.0, 0.0)));
        let produced = Produced {
            distinct: 20,
            resent: 7,
        };
        assert!(!s.settled(&produced), "a record still waits on a tier");
        let mut drained = s.clone();
        drained.tiers.insert("5s".into(), (0.0, 0.0));
        assert!(drained.settled(&produced));
        assert_eq!(s.since(&s).delivered, 0.0);
    }

    #[test]
    fn tiers_sort_by_delay() {
        let mut tiers = vec!["30s", "5s", "2h", "15s", "1500ms", "1d"];
        tiers.sort_by_key(|t| tier_millis(t));
        assert_eq!(tiers, ["1500ms", "5s", "15s", "30s", "2h", "1d"]);
    }

    #[test]
    fn metrics_url_reads_a_wildcard_listen_locally() {
        let listen: SocketAddr = "0.0.0.0:9464".parse().expect("addr");
        assert_eq!(metrics_url(listen), "http://127.0.0.1:9464/metrics");
    }
}
