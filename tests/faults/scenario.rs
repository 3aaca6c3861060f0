//! What every scenario starts from: a unique topic prefix, a receiver with a healthy and a flaky
//! endpoint, a config file for the `hookline` processes, the topics applied.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::harness;
use crate::ledger;
use crate::procs::{hookline_command, Hookline};
use crate::receiver::{Behavior, Receiver};

/// Seven attempts, compressed into seconds (the spec's shape: at once, then six tiers, a
/// second apart: a round settles ~6 s after its stream).
pub const SCHEDULE: &str = r#"["0s", "1s", "2s", "3s", "4s", "5s", "6s"]"#;

/// Knobs of a scenario's config file.
#[derive(Default)]
pub struct Options<'a> {
    /// Bootstrap servers other than the cluster's (e.g. the fault proxy's).
    pub bootstrap: Option<String>,
    /// `kafka.instance_id` (static membership; stage B's transactional id `<p>.deduper.dedupe.<id>`).
    pub instance_id: Option<&'a str>,
    /// Lines for `[kafka.options]` (librdkafka properties of every client).
    pub kafka_options: &'a str,
}

pub struct Scenario {
    pub prefix: String,
    pub rx: Receiver,
    /// The flaky endpoint's script (every third request a 503), for the ledger.
    pub flaky: Vec<Behavior>,
    pub config: PathBuf,
    /// When the scenario started (its log lines count from here).
    pub t0: Instant,
    name: String,
}

impl Scenario {
    pub fn new(name: &str, rt: &tokio::runtime::Runtime, opts: Options) -> Scenario {
        let prefix = harness::unique_prefix(name);
        let rx = rt.block_on(Receiver::start());
        // Flaky: every third request answers 503 (the rest 200), so retries run through the
        // tiers while faults happen; a delivery dies only if all seven attempts get a 503.
        let flaky: Vec<Behavior> = (0..200_000)
            .map(|i| {
                if i % 3 == 0 {
                    Behavior::Status(503)
                } else {
                    Behavior::Status(200)
                }
            })
            .collect();
        rx.script("/flaky", flaky.clone());
        let config = write_config(&prefix, &rx, &opts);
        let topics = hookline_command(&config)
            .args(["topics", "apply"])
            .output()
            .expect("topics apply");
        assert!(
            topics.status.success(),
            "topics apply: {}",
            String::from_utf8_lossy(&topics.stderr)
        );
        Scenario {
            prefix,
            rx,
            flaky,
            config,
            t0: Instant::now(),
            name: name.to_owned(),
        }
    }

    /// A progress line with the scenario's elapsed time.
    pub fn say(&self, msg: &str) {
        eprintln!(
            "[{} {:>6.1}s] {msg}",
            self.name,
            self.t0.elapsed().as_secs_f64()
        );
    }

    /// The end of a scenario run by one `run all` process: waits for the stream's producer,
    /// settles the ledger with at most `bound` duplicate POSTs (the process must keep running
    /// throughout), reports it, and stops the process.
    pub fn finish(
        &self,
        producing: JoinHandle<()>,
        mut hookline: Hookline,
        ids: &BTreeSet<String>,
        invalid: usize,
        bound: usize,
    ) -> ledger::Summary {
        producing.join().expect("producer thread");
        self.say("stream produced");
        let summary = ledger::settle(self, ids, invalid, bound, || {
            hookline.assert_running("the settling")
        });
        hookline.assert_running("the ledger check");
        self.say(&format!("ledger balanced: {summary}"));
        hookline.stop();
        summary
    }
}

fn write_config(prefix: &str, rx: &Receiver, opts: &Options) -> PathBuf {
    let instance = opts
        .instance_id
        .map(|id| format!("instance_id = \"{id}\"\n"))
        .unwrap_or_default();
    let text = format!(
        r#"[kafka]
bootstrap_servers = "{bs}"
{instance}
[kafka.options]
{options}
[topics]
prefix = "{prefix}"
partitions = 3
replication_factor = 3
[server]
listen = "127.0.0.1:0"
[admin]
listen = "127.0.0.1:0"
[http]
allow_cidrs = ["127.0.0.0/8"]
[retry]
schedule = {SCHEDULE}
[log]
format = "json"
level = "info,hookline_delivery::write=debug"

[[endpoints]]
id = "healthy"
url = "{healthy}"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]

[[endpoints]]
id = "flaky"
url = "{flaky}"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
"#,
        bs = opts.bootstrap.clone().unwrap_or_else(harness::bootstrap),
        options = opts.kafka_options,
        healthy = rx.url("/healthy"),
        flaky = rx.url("/flaky"),
    );
    let dir = std::env::temp_dir().join(prefix);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("hookline.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// An env var of the test runner's, parsed, or the default.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
