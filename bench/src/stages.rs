//! The pipeline under test: the real `hookline` binary, one process per stage (`run deduper`,
//! `run dispatcher`, `run retry-tiers`), so CPU seconds (`/proc/<pid>/stat` utime + stime) and
//! peak RSS (`/proc/<pid>/status` VmHWM) are per stage. Each process gets its own ops port
//! (`HOOKLINE_SERVER__LISTEN`) whose `/metrics` the ledger reads and whose `/readyz` says when to
//! start producing. Logs go to one file per stage beside the config.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// The stages, in the order they are started and reported.
pub const STAGES: [&str; 3] = ["deduper", "dispatcher", "retry-tiers"];

pub struct StageProc {
    pub name: &'static str,
    pub pid: u32,
    pub ops: SocketAddr,
    pub log: PathBuf,
    child: Child,
}

/// The running stage processes; killed (SIGKILL) if dropped without [`Stages::stop`].
pub struct Stages {
    pub procs: Vec<StageProc>,
    http: reqwest::Client,
}

impl Stages {
    pub fn spawn(hookline: &Path, config: &Path, dir: &Path) -> anyhow::Result<Stages> {
        Stages::spawn_with(hookline, config, dir, &STAGES, &[])
    }

    /// `hookline run <name>` for each of `names` (a name twice: give each its own `dir`), with
    /// `env` set on top of a clean environment.
    pub fn spawn_with(
        hookline: &Path,
        config: &Path,
        dir: &Path,
        names: &[&'static str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Stages> {
        let mut procs = Vec::new();
        for &name in names {
            let ops = free_port()?;
            let log = dir.join(format!("{name}.log"));
            let out = std::fs::File::create(&log)
                .with_context(|| format!("creating {}", log.display()))?;
            let err = out.try_clone()?;
            let child = hookline_command(hookline)
                .arg("--config")
                .arg(config)
                .args(["run", name])
                .env("HOOKLINE_SERVER__LISTEN", ops.to_string())
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .with_context(|| format!("starting {} run {name}", hookline.display()))?;
            procs.push(StageProc {
                name,
                pid: child.id(),
                ops,
                log,
                child,
            });
        }
        Ok(Stages {
            procs,
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(10))
                .build()?,
        })
    }

    /// Waits until every stage answers `/readyz` with 200.
    pub async fn wait_ready(&mut self, deadline: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        for i in 0..self.procs.len() {
            loop {
                self.check_alive()?;
                let url = format!("http://{}/readyz", self.procs[i].ops);
                if let Ok(r) = self.http.get(&url).send().await {
                    if r.status().is_success() {
                        break;
                    }
                }
                if start.elapsed() > deadline {
                    bail!(
                        "stage {} not ready after {deadline:?} (log: {})",
                        self.procs[i].name,
                        self.procs[i].log.display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// An error naming the stage if one has exited: a run measured without it means nothing.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            if let Some(status) = p.child.try_wait()? {
                bail!(
                    "stage {} exited ({status}); see {}",
                    p.name,
                    p.log.display()
                );
            }
        }
        Ok(())
    }

    /// CPU seconds used so far by each stage (same order as [`STAGES`]).
    pub fn cpu_seconds(&self) -> anyhow::Result<Vec<f64>> {
        self.procs.iter().map(|p| cpu_seconds(p.pid)).collect()
    }

    /// Peak resident set size of each stage in bytes.
    pub fn peak_rss(&self) -> anyhow::Result<Vec<u64>> {
        self.procs.iter().map(|p| peak_rss(p.pid)).collect()
    }

    /// The sum of a metric's samples (those with `label` if given) from a stage's `/metrics`.
    pub async fn metric(
        &self,
        stage: &str,
        name: &str,
        label: Option<(&str, &str)>,
    ) -> anyhow::Result<f64> {
        Ok(sum_metric(&self.metrics_text(stage).await?, name, label))
    }

    /// A stage's whole `/metrics` page.
    pub async fn metrics_text(&self, stage: &str) -> anyhow::Result<String> {
        let p = self
            .procs
            .iter()
            .find(|p| p.name == stage)
            .with_context(|| format!("no stage named {stage}"))?;
        Ok(self
            .http
            .get(format!("http://{}/metrics", p.ops))
            .send()
            .await
            .with_context(|| format!("reading /metrics of {stage}"))?
            .text()
            .await?)
    }

    /// Stops the stages as [`Stages::stop`] does and starts them again with `config` (logs in
    /// `dir`): the same consumer groups and topics, other settings.
    pub async fn restart(
        &mut self,
        hookline: &Path,
        config: &Path,
        dir: &Path,
        grace: Duration,
    ) -> anyhow::Result<()> {
        self.stop_procs(grace).await?;
        *self = Stages::spawn(hookline, config, dir)?;
        Ok(())
    }

    /// SIGTERM to every stage, then waits (up to `grace`) for each to exit; SIGKILL after that.
    pub async fn stop(mut self, grace: Duration) -> anyhow::Result<()> {
        self.stop_procs(grace).await
    }

    async fn stop_procs(&mut self, grace: Duration) -> anyhow::Result<()> {
        for p in &self.procs {
            let _ = Command::new("kill")
                .args(["-TERM", &p.pid.to_string()])
                .status();
        }
        let start = Instant::now();
        let mut procs = std::mem::take(&mut self.procs);
        for p in &mut procs {
            loop {
                if p.child.try_wait()?.is_some() {
                    break;
                }
                if start.elapsed() > grace {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

impl Drop for Stages {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

/// `hookline` without the bench's own `HOOKLINE_*` environment, which must not reconfigure
/// the stages (or a CLI call) behind its back.
pub fn hookline_command(hookline: &Path) -> Command {
    let mut cmd = Command::new(hookline);
    for (k, _) in std::env::vars() {
        if k.starts_with("HOOKLINE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A port nobody listens on now (bound and released; the stage binds it a moment later). Taken
/// below the kernel's ephemeral range: a port from `bind(:0)` could be handed to any other
/// socket (a test's client, another process's `:0`) between the release and the stage's bind —
/// seen once in CI as the deduper's "Address already in use".
pub fn free_port() -> anyhow::Result<SocketAddr> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let span = low.saturating_sub(20_000).max(1);
    for _ in 0..100 {
        let port = 20_000 + (rand::random::<u16>() % span);
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return Ok(l.local_addr()?);
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`, almost always 100).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// utime + stime of a process in seconds.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    parse_cpu_ticks(&stat)
        .map(|t| t as f64 / clock_ticks())
        .with_context(|| format!("unreadable /proc/{pid}/stat"))
}

/// utime (field 14) + stime (field 15); fields are counted after the `(comm)` which may hold
/// spaces.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU seconds the whole machine spent busy so far, over all cores (`/proc/stat`: every state
/// but idle and iowait). Set against the stages' and the bench's own, it shows how much went to
/// the broker and to whoever else shares the box.
pub fn machine_busy_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("no cpu line in /proc/stat")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let busy: u64 = v
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, x)| x)
        .sum();
    Ok(busy as f64 / clock_ticks())
}

/// VmHWM (peak RSS) of a process in bytes.
pub fn peak_rss(pid: u32) -> anyhow::Result<u64> {
    proc_status_bytes(pid, "VmHWM:")
}

/// Resident set size of a process now, in bytes (`VmRSS`).
pub fn current_rss(pid: u32) -> anyhow::Result<u64> {
    proc_status_bytes(pid, "VmRSS:")
}

fn proc_status_bytes(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Sums the samples of `name` in Prometheus text format, only those carrying `label` if given.
pub fn sum_metric(text: &str, name: &str, label: Option<(&str, &str)>) -> f64 {
    let wanted = label.map(|(k, v)| format!("{k}=\"{v}\""));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.chars().next()? {
                '{' => {
                    let end = rest.find('}')?;
                    (&rest[1..end], &rest[end + 1..])
                }
                ' ' => ("", rest),
                _ => return None, // another metric whose name starts with `name`
            };
            if let Some(w) = &wanted {
                if !labels.split(',').any(|l| l == w) {
                    return None;
                }
            }
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

/// The `q` quantile of histogram `name` (samples carrying `label`) in Prometheus text format:
/// the upper bound of the first bucket holding that share of the count (None: no samples).
pub fn histogram_quantile(text: &str, name: &str, label: (&str, &str), q: f64) -> Option<f64> {
    let wanted = format!("{}=\"{}\"", label.0, label.1);
    let bucket = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&bucket)?;
            let end = rest.find('}')?;
            let labels = &rest[..end];
            if !labels.split(',').any(|l| l == wanted) {
                return None;
            }
            let le = labels
                .split(',')
                .find_map(|l| l.strip_prefix("le=\""))?
                .trim_end_matches('"');
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = rest[end + 1..].split_whitespace().next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_ticks_after_a_command_with_spaces() {
        let stat = "42 (my (odd) proc) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
    }

    #[test]
    fn sums_metric_samples_by_label() {
        let text = "# HELP x\n\
            hookline_retry_records_total{outcome=\"dead_exhausted\",tier=\"1s\"} 2\n\
            hookline_retry_records_total{outcome=\"dead_exhausted\",tier=\"2s\"} 3\n\
            hookline_retry_records_total{outcome=\"delivered\",tier=\"1s\"} 7\n\
            hookline_retry_records_total_other 100\n\
            hookline_deduper_duplicates_total 5\n";
        let name = "hookline_retry_records_total";
        assert_eq!(
            sum_metric(text, name, Some(("outcome", "dead_exhausted"))),
            5.0
        );
        assert_eq!(sum_metric(text, name, None), 12.0);
        assert_eq!(
            sum_metric(text, "hookline_deduper_duplicates_total", None),
            5.0
        );
    }

    #[test]
    fn reads_a_quantile_from_buckets() {
        let text = "h_bucket{step=\"a\",le=\"0.001\"} 10\n\
            h_bucket{step=\"a\",le=\"0.01\"} 98\n\
            h_bucket{step=\"a\",le=\"+Inf\"} 100\n\
            h_bucket{step=\"b\",le=\"0.001\"} 0\n\
            h_bucket{step=\"b\",le=\"+Inf\"} 0\n";
        assert_eq!(
            histogram_quantile(text, "h", ("step", "a"), 0.5),
            Some(0.01)
        );
        assert_eq!(
            histogram_quantile(text, "h", ("step", "a"), 0.05),
            Some(0.001)
        );
        assert_eq!(
            histogram_quantile(text, "h", ("step", "a"), 0.99),
            Some(f64::INFINITY)
        );
        assert_eq!(histogram_quantile(text, "h", ("step", "b"), 0.5), None);
    }

    #[test]
    fn reads_this_process() {
        assert!(machine_busy_seconds().expect("machine") > 0.0);
        let pid = std::process::id();
        assert!(cpu_seconds(pid).expect("cpu") >= 0.0);
        assert!(peak_rss(pid).expect("rss") > 0);
    }
}
