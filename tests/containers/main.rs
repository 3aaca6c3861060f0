//! Container tests (`make test-containers`, part of `make test`): the image `hookline:local`
//! and the Compose stack, started for real and checked from outside the containers.
//!
//! `scripts/test-containers.sh` builds the images first (hookline from the host's release
//! binary, Kafka from the Maven jars) and runs this binary with `HOOKLINE_TEST_KAFKA` set to the
//! stack's published Kafka listener. One test walks the stack's life in order, because each step
//! needs the state the one before left (one Kafka, its volume kept across `down` and `up`):
//!
//! 1. `up`: the demo's events reach the receiver container, signed, once each; its 503s are retried;
//! 2. the dashboard answers on the published port and the stack's token signs in;
//! 3. the pipeline's process killed with SIGKILL mid-stream: the restart policy brings it back,
//!    every event is delivered and none is dispatched twice (counted on `<p>.dispatch`);
//! 4. `docker stop` mid-stream: a graceful drain (exit 0), then 0 duplicate POSTs;
//! 5. `down` and `up` again (volume kept): the dead letters are still there;
//! 6. the stages as separate services under the Kubernetes constraints and service-link
//!    environment, the dispatcher scaled to 3; one replica killed (`docker kill -s KILL`)
//!    mid-stream: nothing lost;
//! 7. the Kubernetes manifests' pods run from the image against this Kafka
//!    (`scripts/check_k8s_run.py`).
//!
//! Not part of `cargo test --workspace` (Cargo.toml: `test = false`): it needs a Docker engine
//! and the images, and fails loudly without them rather than skipping.

#[allow(dead_code)]
#[path = "../it/harness.rs"]
mod harness;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rdkafka::message::Message;

const PROJECT: &str = "hookline";
const BASE_FILES: [&str; 2] = ["docker-compose.yml", "deploy/compose/kafka-maven.yml"];
const STAGES_FILE: &str = "deploy/compose/stages.yml";
/// Kubernetes service-link variables on the stage services (test only).
const SERVICE_LINKS_FILE: &str = "tests/containers/service-links.yml";
const PREFIX: &str = "webhooks";
/// The clear token behind deploy/compose/hookline.toml's `compose-demo` hash (docs/deployment.md).
const DEMO_TOKEN: &str = "hlk_c6f0f79a34cc503fedbb1e26ad83e5839bd5cd9c5e7e39e6da7d42b8d0f5f130";

fn compose_cmd() -> Vec<String> {
    std::env::var("HOOKLINE_TEST_COMPOSE")
        .unwrap_or_else(|_| "docker compose".into())
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// `docker compose -p hookline -f … <args>`; panics with its output unless it succeeds.
fn compose(files: &[&str], args: &[&str]) -> String {
    let mut c = compose_command(files);
    c.args(args);
    checked(c, &format!("compose {}", args.join(" ")))
}

fn compose_command(files: &[&str]) -> Command {
    let cmd = compose_cmd();
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..]).args(["-p", PROJECT]);
    for f in files {
        c.args(["-f", f]);
    }
    c
}

fn docker(args: &[&str]) -> String {
    let mut c = Command::new("docker");
    c.args(args);
    checked(c, &format!("docker {}", args.join(" ")))
}

fn checked(mut c: Command, what: &str) -> String {
    let out: Output = c
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run ({e})"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        panic!(
            "{what} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
}

fn step(t0: Instant, msg: &str) {
    eprintln!("[{:>6.1}s] {msg}", t0.elapsed().as_secs_f64());
}

fn wait_for<T>(what: &str, deadline: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The containers of a service (every replica), running or not.
fn container(files: &[&str], service: &str) -> Vec<String> {
    compose(files, &["ps", "-a", "-q", service])
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn inspect(id: &str, format: &str) -> String {
    docker(&["inspect", "-f", format, id]).trim().to_owned()
}

fn health(id: &str) -> String {
    inspect(
        id,
        "{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}",
    )
}

fn wait_healthy(files: &[&str], services: &[&str], deadline: Duration) {
    for s in services {
        let ids = wait_for(&format!("a container of {s}"), deadline, || {
            let ids = container(files, s);
            (!ids.is_empty()).then_some(ids)
        });
        for id in ids {
            wait_for(&format!("{s} ({id:.12}) healthy"), deadline, || {
                (health(&id) == "healthy").then_some(())
            });
        }
    }
}

/// What the receiver container logged, per `webhook-id`.
#[derive(Default, Debug)]
struct ReceiverLog {
    /// Fresh receipts (200 "webhook received") with their `webhook-attempt`.
    received: HashMap<String, Vec<u32>>,
    /// POSTs of an id already received (the receiver's dedupe absorbed them).
    duplicates: HashMap<String, u32>,
    /// 503s on purpose (`--fail-every`).
    failed_on_purpose: BTreeSet<String>,
    rejected: usize,
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn field(line: &str, name: &str) -> Option<String> {
    let start = line.find(&format!("{name}="))? + name.len() + 1;
    let rest = &line[start..];
    let value = if let Some(quoted) = rest.strip_prefix('"') {
        &quoted[..quoted.find('"')?]
    } else {
        rest.split_whitespace().next()?
    };
    Some(value.to_owned())
}

fn receiver_log(files: &[&str]) -> ReceiverLog {
    let text = compose(
        files,
        &["logs", "--no-color", "--no-log-prefix", "receiver"],
    );
    let mut log = ReceiverLog::default();
    for line in text.lines().map(strip_ansi) {
        if line.contains("request rejected") {
            log.rejected += 1;
            continue;
        }
        let Some(id) = field(&line, "webhook_id") else {
            continue;
        };
        if line.contains("webhook received") {
            let attempt = field(&line, "attempt")
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            log.received.entry(id).or_default().push(attempt);
        } else if line.contains("duplicate delivery") {
            *log.duplicates.entry(id).or_default() += 1;
        } else if line.contains("failing on purpose") {
            log.failed_on_purpose.insert(id);
        }
    }
    log
}

/// Dead letters of the `demo` endpoint (the receiver) on `<p>.dlq`, per event id.
fn demo_dead_letters() -> HashMap<String, usize> {
    let mut dead = HashMap::new();
    for m in harness::read_until(&format!("{PREFIX}.dlq"), Duration::from_secs(3), |_| false) {
        if harness::header(&m, "hookline-endpoint-id") == Some("demo") {
            if let Some(id) = harness::header(&m, "hookline-event-id") {
                *dead.entry(id.to_owned()).or_insert(0) += 1;
            }
        }
    }
    dead
}

/// The ledger for the receiver's endpoint: waits until every id in `ids` reached the receiver or
/// holds exactly one dead letter (its `--fail-every 5` gives each attempt a one-in-five chance of a
/// 503, so with the stack's four attempts about one event in 625 runs out of them). Returns the
/// receiver's log and the dead ids.
fn wait_settled(
    files: &[&str],
    ids: &BTreeSet<String>,
    deadline: Duration,
) -> (ReceiverLog, BTreeSet<String>) {
    let start = Instant::now();
    loop {
        let log = receiver_log(files);
        let missing: BTreeSet<String> = ids
            .iter()
            .filter(|id| !log.received.contains_key(*id))
            .cloned()
            .collect();
        if missing.is_empty() {
            return (log, BTreeSet::new());
        }
        let dead = demo_dead_letters();
        if missing.iter().all(|id| dead.contains_key(id)) {
            for id in &missing {
                assert_eq!(dead[id], 1, "{id}: exactly one dead letter");
            }
            return (log, missing);
        }
        let lost: Vec<_> = missing
            .iter()
            .filter(|id| !dead.contains_key(*id))
            .collect();
        assert!(
            start.elapsed() < deadline,
            "after {deadline:?}, {} of {} events neither reached the receiver nor are dead, e.g. {:?}",
            lost.len(),
            ids.len(),
            &lost[..lost.len().min(5)]
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn duplicate_posts(log: &ReceiverLog, ids: &BTreeSet<String>) -> u32 {
    ids.iter().filter_map(|id| log.duplicates.get(id)).sum()
}

/// Committed records on `<p>.dispatch` per event id, for the ids given.
fn dispatched(ids: &BTreeSet<String>) -> BTreeMap<String, usize> {
    let records = harness::read_until(
        &format!("{PREFIX}.dispatch"),
        Duration::from_secs(60),
        |rs| {
            let seen: BTreeSet<&str> = rs
                .iter()
                .filter_map(|m| harness::header(m, "hookline-event-id"))
                .filter(|id| ids.contains(*id))
                .collect();
            seen.len() == ids.len()
        },
    );
    // Read on for a moment: a second copy would come after the first.
    let more = harness::read_until(
        &format!("{PREFIX}.dispatch"),
        Duration::from_secs(3),
        |_| false,
    );
    let records = if more.len() > records.len() {
        more
    } else {
        records
    };
    let mut counts = BTreeMap::new();
    for m in &records {
        if let Some(id) = harness::header(m, "hookline-event-id") {
            if ids.contains(id) {
                *counts.entry(id.to_owned()).or_insert(0) += 1;
            }
        }
    }
    counts
}

fn assert_dispatched_once(ids: &BTreeSet<String>, what: &str) {
    let counts = dispatched(ids);
    let missing = ids.iter().filter(|id| !counts.contains_key(*id)).count();
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert_eq!(
        missing, 0,
        "{what}: {missing} events never on the dispatch topic"
    );
    assert!(
        twice.is_empty(),
        "{what}: {} events dispatched more than once, e.g. {:?}",
        twice.len(),
        &twice[..twice.len().min(5)]
    );
}

/// Produces `count` events (type `message.created`, which only the `demo` endpoint subscribes
/// to) over about `secs` seconds on a thread, every tenth id re-sent with other bytes and key;
/// returns the unique ids and the thread.
fn produce_stream(
    tag: &str,
    count: usize,
    secs: f64,
) -> (BTreeSet<String>, std::thread::JoinHandle<()>) {
    let run = format!("{:x}", std::process::id() ^ rand::random::<u32>());
    let ids: Vec<String> = (0..count).map(|n| format!("ct-{tag}-{run}-{n}")).collect();
    let set = ids.iter().cloned().collect();
    let topic = format!("{PREFIX}.events");
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let producer = harness::producer();
            let gap = Duration::from_secs_f64(secs / count as f64);
            let start = tokio::time::Instant::now();
            let mut pending = futures::stream::FuturesUnordered::new();
            for (n, id) in ids.iter().enumerate() {
                tokio::time::sleep_until(start + gap * n as u32).await;
                let value = serde_json::json!({
                    "id": id, "type": "message.created", "tenant": "demo",
                    "data": {"n": n, "text": "container test"}
                })
                .to_string();
                pending.push(send(&producer, &topic, id.clone(), value));
                if n % 10 == 9 {
                    let again = serde_json::json!({
                        "id": id, "type": "message.created", "tenant": "demo",
                        "data": {"n": n, "resent": true}
                    })
                    .to_string();
                    pending.push(send(&producer, &topic, format!("{id}-again"), again));
                }
            }
            use futures::StreamExt;
            while let Some(r) = pending.next().await {
                r.expect("produce");
            }
        });
    });
    (set, handle)
}

async fn send(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    key: String,
    value: String,
) -> Result<(), rdkafka::error::KafkaError> {
    let rec = rdkafka::producer::FutureRecord::to(topic)
        .key(&key)
        .payload(&value);
    producer
        .send(rec, Duration::from_secs(60))
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
}

/// Dead letters on `<p>.dlq`: (partition, offset) → key.
fn dead_letters(at_least: usize) -> BTreeMap<(i32, i64), String> {
    dead_letters_until(|rs| rs.len() >= at_least)
}

/// The dead letters once every position of `before` has been read again (or 90 s passed). Not
/// a count: stages started again after `down` may dead-letter more, on other partitions, before
/// the reader has fetched every old one.
fn dead_letters_covering(before: &BTreeMap<(i32, i64), String>) -> BTreeMap<(i32, i64), String> {
    dead_letters_until(|rs| {
        let seen: BTreeSet<(i32, i64)> = rs.iter().map(|m| (m.partition(), m.offset())).collect();
        before.keys().all(|pos| seen.contains(pos))
    })
}

fn dead_letters_until(
    done: impl Fn(&[rdkafka::message::OwnedMessage]) -> bool,
) -> BTreeMap<(i32, i64), String> {
    harness::read_until(&format!("{PREFIX}.dlq"), Duration::from_secs(90), done)
        .iter()
        .map(|m| {
            let key = m
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .unwrap_or_default();
            ((m.partition(), m.offset()), key)
        })
        .collect()
}

/// Demo events read back from `<p>.events`: (unique ids, unique `order.*` ids).
fn demo_ids() -> (BTreeSet<String>, BTreeSet<String>) {
    let records = harness::read_until(&format!("{PREFIX}.events"), Duration::from_secs(5), |_| {
        false
    });
    let mut all = BTreeSet::new();
    let mut orders = BTreeSet::new();
    for m in &records {
        let Some(v) = m
            .payload()
            .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
        else {
            continue;
        };
        let (Some(id), Some(ty)) = (v["id"].as_str(), v["type"].as_str()) else {
            continue;
        };
        if id.starts_with("demo-") {
            all.insert(id.to_owned());
            if ty.starts_with("order.") {
                orders.insert(id.to_owned());
            }
        }
    }
    (all, orders)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http client")
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn dashboard_signs_in() {
    block_on(async {
        let c = http();
        let login = c
            .get("http://127.0.0.1:8090/ui/login")
            .send()
            .await
            .expect("GET /ui/login on the published port");
        assert_eq!(login.status(), 200, "login page");
        let bad = c
            .post("http://127.0.0.1:8090/ui/login")
            .form(&[("token", "hlk_not-a-token")])
            .send()
            .await
            .expect("POST /ui/login");
        assert_eq!(bad.status(), 401, "a wrong token is refused");
        let ok = c
            .post("http://127.0.0.1:8090/ui/login")
            .form(&[("token", DEMO_TOKEN)])
            .send()
            .await
            .expect("POST /ui/login");
        assert_eq!(ok.status(), 303, "the stack's token signs in");
        let cookie = ok
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .expect("a session cookie")
            .to_owned();
        let page = c
            .get("http://127.0.0.1:8090/")
            .header("cookie", cookie)
            .send()
            .await
            .expect("GET / signed in");
        assert_eq!(page.status(), 200, "the endpoints page");
        let body = page.text().await.expect("body");
        assert!(
            body.contains("always-down") && body.contains("demo"),
            "the endpoints page lists the stack's endpoints"
        );
    });
}

/// Seconds from `docker run` of the image's default command (`run all`) to `/readyz` 200, on
/// its own topic prefix (topics applied first, by the image too) on the stack's Kafka.
fn start_to_ready() -> f64 {
    let prefix = format!("ready{:x}", rand::random::<u32>());
    let network = format!("{PROJECT}_hookline");
    let config = format!(
        "{}/deploy/compose/hookline.toml:/etc/hookline/hookline.toml:ro",
        std::env::current_dir().expect("cwd").display()
    );
    let prefix_env = format!("HOOKLINE_TOPICS__PREFIX={prefix}");
    let common = [
        "--network",
        network.as_str(),
        "--env-file",
        "deploy/compose/secrets-key.env",
        "-e",
        prefix_env.as_str(),
        "-v",
        config.as_str(),
        "--read-only",
        "--cap-drop",
        "ALL",
    ];
    let mut apply = vec!["run", "--rm"];
    apply.extend(common);
    apply.extend(["hookline:local", "topics", "apply"]);
    docker(&apply);
    let mut run = vec!["run", "-d", "--rm"];
    run.extend(common);
    run.push("hookline:local");
    let start = Instant::now();
    let id = docker(&run).trim().to_owned();
    let ip = inspect(
        &id,
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
    );
    let url = format!("http://{ip}:9464/readyz");
    wait_for(
        "the new container's /readyz",
        Duration::from_secs(120),
        || (get_status(&url) == Some(200)).then_some(()),
    );
    let secs = start.elapsed().as_secs_f64();
    docker(&["stop", &id]);
    secs
}

fn get_status(url: &str) -> Option<u16> {
    block_on(async {
        http()
            .get(url)
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    })
}

/// Every service of both layouts (the stages file moves `hookline` and `demo` to a profile).
fn all_files() -> Vec<&'static str> {
    let mut files = BASE_FILES.to_vec();
    files.extend([STAGES_FILE, SERVICE_LINKS_FILE]);
    files
}

fn down_everything() {
    compose(
        &all_files(),
        &[
            "--profile",
            "all-in-one",
            "down",
            "-v",
            "--remove-orphans",
            "--timeout",
            "45",
        ],
    );
}

/// On a failure: the stack's last log lines, then nothing left running.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let mut logs = compose_command(&all_files());
        logs.args([
            "--profile",
            "all-in-one",
            "logs",
            "--no-color",
            "--tail",
            "60",
        ]);
        if let Ok(out) = logs.output() {
            eprintln!(
                "--- the stack's last log lines\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let mut down = compose_command(&all_files());
        down.args([
            "--profile",
            "all-in-one",
            "down",
            "-v",
            "--remove-orphans",
            "--timeout",
            "10",
        ]);
        let _ = down.output();
    }
}

#[test]
fn compose_stack_runs_as_users_run_it() {
    let t0 = Instant::now();
    let base: Vec<&str> = BASE_FILES.to_vec();
    let stages = all_files();

    step(t0, "clean slate: compose down -v");
    let _cleanup = Cleanup;
    down_everything();

    // 1. up: the demo.
    step(
        t0,
        "compose up (Kafka from Maven jars, topics, receiver, pipeline, admin, demo)",
    );
    compose(&base, &["up", "-d", "--no-build"]);
    wait_healthy(
        &base,
        &["kafka", "receiver", "hookline", "admin"],
        Duration::from_secs(180),
    );
    step(t0, "every service healthy");
    harness::require_kafka();
    let ready = start_to_ready();
    step(
        t0,
        &format!("start to ready: `docker run hookline:local` (run all) answered /readyz 200 after {ready:.2}s"),
    );
    let demo = container(&base, "demo");
    assert_eq!(demo.len(), 1, "one demo container");
    wait_for(
        "the demo producer to finish",
        Duration::from_secs(120),
        || (inspect(&demo[0], "{{.State.Status}}") == "exited").then_some(()),
    );
    assert_eq!(
        inspect(&demo[0], "{{.State.ExitCode}}"),
        "0",
        "demo exit code"
    );
    let (demo_ids, demo_orders) = demo_ids();
    assert!(
        demo_ids.len() >= 50,
        "the demo produced 50 ids: {demo_ids:?}"
    );
    let (log, demo_dead) = wait_settled(&base, &demo_ids, Duration::from_secs(120));
    assert_eq!(
        log.rejected, 0,
        "the receiver rejected requests (bad signatures?)"
    );
    for id in demo_ids.difference(&demo_dead) {
        assert_eq!(log.received[id].len(), 1, "{id} received once");
    }
    assert_eq!(
        duplicate_posts(&log, &demo_ids),
        0,
        "no duplicate POSTs in a clean run"
    );
    let retried: Vec<_> = log
        .failed_on_purpose
        .iter()
        .filter(|id| demo_ids.contains(*id) && !demo_dead.contains(*id))
        .collect();
    assert!(!retried.is_empty(), "the receiver failed some on purpose");
    for id in &retried {
        let attempts = &log.received[*id];
        assert!(
            attempts.iter().all(|a| *a >= 2),
            "{id} answered 503 first, then succeeded on a retry: {attempts:?}"
        );
    }
    step(
        t0,
        &format!(
            "demo: {} ids delivered once each, signatures valid, {} retried after a 503, {} dead after 4 503s",
            demo_ids.len() - demo_dead.len(),
            retried.len(),
            demo_dead.len()
        ),
    );

    // 2. The dashboard on the host's published port.
    dashboard_signs_in();
    assert_eq!(
        get_status("http://127.0.0.1:9464/readyz"),
        Some(200),
        "the pipeline's /readyz on the published port"
    );
    step(
        t0,
        "dashboard: login page, a wrong token refused, the token signs in",
    );

    // 3. kill -9 mid-stream, the restart policy brings it back.
    let pipeline = container(&base, "hookline").remove(0);
    let restarts = |id: &str| -> u32 { inspect(id, "{{.RestartCount}}").parse().unwrap() };
    let before = restarts(&pipeline);
    let (ids, producing) = produce_stream("kill", 1500, 6.0);
    std::thread::sleep(Duration::from_millis(2000));
    // SIGKILL from outside Docker, as the OOM killer or a crash ends a process: `docker kill`
    // would count as a manual stop, which disables the restart policy until the next `start`
    // (docker-kill(1)).
    let pid = inspect(&pipeline, "{{.State.Pid}}");
    let mut kill = Command::new("kill");
    kill.args(["-KILL", &pid]);
    checked(kill, "kill -KILL the pipeline's process");
    step(
        t0,
        &format!("kill: SIGKILL to the pipeline's process (host pid {pid}) mid-stream"),
    );
    producing.join().expect("producer thread");
    wait_for(
        "the restart policy to restart it",
        Duration::from_secs(30),
        || (restarts(&pipeline) > before).then_some(()),
    );
    let recovery = Instant::now();
    let (log, dead) = wait_settled(&base, &ids, Duration::from_secs(180));
    let kill_dups = duplicate_posts(&log, &ids);
    step(
        t0,
        &format!(
            "kill: restarted by its policy; all {} events settled {:.1}s after the restart ({} dead after 4 503s), {} duplicate POSTs (at-least-once)",
            ids.len(),
            recovery.elapsed().as_secs_f64(),
            dead.len(),
            kill_dups
        ),
    );
    assert_dispatched_once(&ids, "kill");
    step(t0, "kill: every event on the dispatch topic exactly once");
    wait_healthy(&base, &["hookline"], Duration::from_secs(120));

    // 4. docker stop mid-stream: graceful drain, no duplicate POSTs.
    let (ids, producing) = produce_stream("stop", 1500, 6.0);
    std::thread::sleep(Duration::from_millis(2000));
    let stopping = Instant::now();
    docker(&["stop", &pipeline]);
    let stop_secs = stopping.elapsed().as_secs_f64();
    assert_eq!(
        inspect(&pipeline, "{{.State.ExitCode}}"),
        "0",
        "SIGTERM: a graceful exit"
    );
    producing.join().expect("producer thread");
    docker(&["start", &pipeline]);
    let (log, dead) = wait_settled(&base, &ids, Duration::from_secs(180));
    let stop_dups = duplicate_posts(&log, &ids);
    assert_eq!(stop_dups, 0, "a graceful stop POSTs nothing twice");
    assert_dispatched_once(&ids, "stop");
    step(
        t0,
        &format!(
            "stop: drained and exited 0 in {stop_secs:.1}s; all {} events settled after `docker start` ({} dead after 4 503s), 0 duplicate POSTs",
            ids.len(),
            dead.len()
        ),
    );

    // 5. down + up keeps the dead letters (the Kafka volume).
    let dead = dead_letters(demo_orders.len());
    assert!(
        dead.len() >= demo_orders.len(),
        "every demo order.* event is dead on `always-down`: {} of {}",
        dead.len(),
        demo_orders.len()
    );
    step(t0, &format!("{} dead letters before `down`", dead.len()));
    compose(&base, &["down", "--timeout", "45"]);
    step(
        t0,
        "compose down (volume kept); up again with the stages as services",
    );

    // 6. The stages as services, the dispatcher scaled to 3.
    compose(
        &stages,
        &["up", "-d", "--no-build", "--scale", "dispatcher=3"],
    );
    wait_healthy(
        &stages,
        &[
            "kafka",
            "receiver",
            "deduper",
            "dispatcher",
            "retry-tiers",
            "admin",
        ],
        Duration::from_secs(180),
    );
    assert!(
        container(&stages, "hookline").is_empty(),
        "the one-process pipeline is not started in the stages layout"
    );
    let after = dead_letters_covering(&dead);
    for (pos, key) in &dead {
        assert_eq!(
            after.get(pos),
            Some(key),
            "dead letter {pos:?} kept across down/up"
        );
    }
    step(
        t0,
        &format!(
            "after down/up: all {} dead letters still on the topic",
            dead.len()
        ),
    );
    let dispatchers = container(&stages, "dispatcher");
    assert_eq!(dispatchers.len(), 3, "three dispatcher replicas");
    for service in ["deduper", "dispatcher", "retry-tiers"] {
        for id in container(&stages, service) {
            assert_eq!(
                inspect(&id, "{{.Config.User}}"),
                "10001:10001",
                "{service} user"
            );
            assert_eq!(
                inspect(&id, "{{.HostConfig.ReadonlyRootfs}}"),
                "true",
                "{service} read-only"
            );
            assert_eq!(
                inspect(&id, "{{.HostConfig.CapDrop}}"),
                "[ALL]",
                "{service} caps"
            );
            let env = inspect(&id, "{{range .Config.Env}}{{println .}}{{end}}");
            assert!(
                env.lines()
                    .any(|l| l.starts_with("HOOKLINE_ADMIN_PORT=tcp://")),
                "{service} has the Kubernetes service-link environment"
            );
            let ip = inspect(
                &id,
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            );
            assert_eq!(
                get_status(&format!("http://{ip}:9464/readyz")),
                Some(200),
                "{service} ({ip}) /readyz from outside the container"
            );
        }
    }
    step(t0, "stages: deduper, 3 dispatchers, retry tiers ready as user 10001, read-only, no capabilities, service links set");
    let (ids, producing) = produce_stream("scale", 3000, 8.0);
    std::thread::sleep(Duration::from_millis(2500));
    let victim = &dispatchers[1];
    // `docker kill` leaves it stopped (it disables the restart policy): the two others take over.
    docker(&["kill", "-s", "KILL", victim]);
    step(
        t0,
        "stages: one of three dispatcher replicas killed mid-stream (not restarted)",
    );
    producing.join().expect("producer thread");
    let recovery = Instant::now();
    let (log, dead) = wait_settled(&stages, &ids, Duration::from_secs(180));
    assert_dispatched_once(&ids, "scale");
    step(
        t0,
        &format!(
            "stages: all {} events settled with 2 dispatchers left ({:.1}s after the stream ended; {} dead after 4 503s), {} duplicate POSTs, none dispatched twice",
            ids.len(),
            recovery.elapsed().as_secs_f64(),
            dead.len(),
            duplicate_posts(&log, &ids)
        ),
    );

    // 7. The Kubernetes manifests' pods from the image, against this Kafka.
    let python = std::env::var("HOOKLINE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let kustomize = std::env::var("HOOKLINE_TEST_KUSTOMIZE").unwrap_or_else(|_| "kustomize".into());
    let mut k8s = Command::new(python);
    k8s.args([
        "scripts/check_k8s_run.py",
        "--image",
        "hookline:local",
        "--kustomize",
        &kustomize,
        "--network",
        &format!("{PROJECT}_hookline"),
        "--bootstrap",
        "kafka:9092",
        "--secrets-key-file",
        "deploy/compose/secrets-key.env",
    ]);
    let status = k8s.status().unwrap_or_else(|e| {
        panic!(
            "run {:?} scripts/check_k8s_run.py: {e} (the deploy tools' Python: run \
             scripts/install-deploy-tools.sh, or set HOOKLINE_TEST_PYTHON)",
            k8s.get_program()
        )
    });
    assert!(
        status.success(),
        "the Kubernetes pods did not all run (above)"
    );
    step(
        t0,
        "kubernetes: every workload's command/args started from the image, probes answered",
    );

    down_everything();
    step(t0, "compose down -v: done");
}
