//! The control plane under a broker failure: `run all` under the mixed stream while endpoints are
//! created, moved, re-subscribed, disabled, enabled and deleted through the admin API, and the
//! broker leading `<p>.endpoints` partition 0 is SIGKILLed in the middle of those changes (back
//! 8 s later). Every API call must succeed, or fail with a retryable answer (5xx, timeout) and
//! succeed when retried; no acknowledged change may be lost. Checked after: the API's list and an
//! independent reader of the topic (`hookline endpoints list`) hold exactly the expected set; each
//! new endpoint got every event of its type decided after its change was acknowledged + 2 s, and
//! nothing its state at the time excluded; the ledger of the two original endpoints balances; the
//! process never exited.
//!
//! Timing model of the delivery checks: event `n` is produced no earlier than
//! `stream start + index/rate` (its lower bound `a`), and its fan-out was decided before its first
//! POST to the healthy endpoint (`b`). A change's new state may apply from the moment its request
//! was sent until the next change's acknowledgement + [`MARGIN`]. An event must reach endpoint E
//! at URL U if every state of E that may apply within `[a, b + SLACK]` delivers it to U; a POST
//! at U arriving at `r` must be explained by some state that may apply within `[a, r]`.
//!
//! Found by this test (librdkafka 2.12.1, confluentinc/librdkafka#5511 and #5456): when the killed
//! broker also coordinated the group `<p>.deduper.dedupe`, stage B's `send_offsets_to_transaction`
//! could wait on the decommissioned coordinator past its timeout until the watchdog stopped the
//! process after 90 s (2 runs of 4). Fixed by the two upstream changes backported in
//! vendor/rdkafka-sys (PATCHED.md).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::cluster;
use crate::harness;
use crate::ledger;
use crate::procs::{hookline_command, watch, Hookline};
use crate::scenario::{env_or, Options, Scenario};
use crate::stream::Stream;

const TOKEN: &str = "hlk_faults_control_plane_test_token";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const TYPES: [&str; 2] = ["message.created", "order.paid"];
/// How long after an acknowledged change the dispatcher may still act on the state before it.
const MARGIN: Duration = Duration::from_secs(2);
/// How long after the healthy endpoint's first POST of an event another endpoint's attempt of
/// the same fan-out may still be decided.
const SLACK: Duration = Duration::from_secs(2);
/// One API request's client timeout (the registry writer retries inside the call: up to five
/// tries of 10 s transactional calls).
const CALL_TIMEOUT: Duration = Duration::from_secs(45);
/// Tries of one API call before the test fails.
const MAX_TRIES: u32 = 6;
/// How long the killed broker stays down.
const DOWN: Duration = Duration::from_secs(8);

/// What an endpoint delivers: its receiver path, its one event type, enabled.
#[derive(Debug, Clone, PartialEq)]
struct State {
    path: String,
    ty: String,
    enabled: bool,
}

/// One acknowledged change of an endpoint (`state` None: absent).
struct Change {
    what: String,
    sent: Instant,
    ack: Instant,
    state: Option<State>,
}

/// A new endpoint's history: changes[0] is "absent" since the scenario started.
struct Timeline {
    changes: Vec<Change>,
}

impl Timeline {
    fn new(t0: Instant) -> Timeline {
        Timeline {
            changes: vec![Change {
                what: "absent".into(),
                sent: t0,
                ack: t0,
                state: None,
            }],
        }
    }

    fn current(&self) -> Option<&State> {
        self.changes.last().and_then(|c| c.state.as_ref())
    }

    /// The states that may apply at some moment in `[from, to]`.
    fn possible(&self, from: Instant, to: Instant) -> impl Iterator<Item = &Option<State>> {
        self.changes.iter().enumerate().filter_map(move |(i, c)| {
            let end = self.changes.get(i + 1).map(|next| next.ack + MARGIN);
            (c.sent <= to && end.is_none_or(|e| e >= from)).then_some(&c.state)
        })
    }
}

fn delivers<'a>(s: &'a Option<State>, ty: &str) -> Option<&'a str> {
    s.as_ref()
        .filter(|s| s.enabled && s.ty == ty)
        .map(|s| s.path.as_str())
}

/// A change asked through the API.
enum Op {
    Create {
        id: String,
        path: String,
        ty: String,
    },
    Move {
        id: String,
        path: String,
    },
    Retype {
        id: String,
        ty: String,
    },
    Enable {
        id: String,
        on: bool,
    },
    Delete {
        id: String,
    },
}

impl Op {
    fn id(&self) -> &str {
        match self {
            Op::Create { id, .. }
            | Op::Move { id, .. }
            | Op::Retype { id, .. }
            | Op::Enable { id, .. }
            | Op::Delete { id } => id,
        }
    }

    fn describe(&self) -> String {
        match self {
            Op::Create { id, path, ty } => format!("create {id} ({path}, {ty})"),
            Op::Move { id, path } => format!("move {id} to {path}"),
            Op::Retype { id, ty } => format!("retype {id} to {ty}"),
            Op::Enable { id, on: true } => format!("enable {id}"),
            Op::Enable { id, on: false } => format!("disable {id}"),
            Op::Delete { id } => format!("delete {id}"),
        }
    }
}

/// One API call as it went.
struct Call {
    what: String,
    /// Every failed try: "503 unavailable: …", "timeout after 45s", …
    failures: Vec<String>,
    took: Duration,
    /// An answer that is not what the call did (e.g. 409 on a first create).
    anomaly: Option<String>,
    sent: Instant,
}

struct Api {
    base: String,
    client: reqwest::Client,
}

impl Api {
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), String> {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| {
            if e.is_timeout() {
                format!("timeout after {CALL_TIMEOUT:?}")
            } else {
                format!("transport error: {e}")
            }
        })?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| format!("{status}, body unread: {e}"))?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }
}

/// The fields the checks compare: (url, event types, enabled).
type Listed = BTreeMap<String, (String, Vec<String>, bool)>;

fn listed(items: &[Value]) -> Listed {
    items
        .iter()
        .map(|e| {
            let types = e["event_types"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|t| t.as_str().unwrap_or_default().to_string())
                        .collect()
                })
                .unwrap_or_default();
            (
                e["id"].as_str().unwrap_or_default().to_string(),
                (
                    e["url"].as_str().unwrap_or_default().to_string(),
                    types,
                    e["enabled"].as_bool().unwrap_or(false),
                ),
            )
        })
        .collect()
}

/// What the faults thread saw.
struct Fault {
    node: usize,
    roles: String,
    killed_at: Instant,
    /// The new leader of `<p>.endpoints[0]` and when metadata first named it.
    elected: Option<(usize, Instant)>,
    back_at: Instant,
    start_secs: f64,
    /// `start-node` calls it took (more than one: the restart failed, see the faults thread).
    start_tries: u32,
}

/// The node coordinating consumer group `group` (the cluster script's `coordinator group`).
fn group_coordinator(group: &str) -> Option<usize> {
    let script = std::env::var("HOOKLINE_TEST_CLUSTER").ok()?;
    let out = std::process::Command::new(script)
        .args(["coordinator", "group", group])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Joins the faults thread however the test ends: a panic during the outage must not leave the
/// broker down (other scenarios share the cluster).
/// (Without the signal sent, dropping the sender ends the thread before any kill.)
struct Restart {
    signal: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Fault>>,
}

impl Restart {
    fn kill(&mut self) {
        if let Some(tx) = self.signal.take() {
            tx.send(()).expect("faults thread");
        }
    }

    fn join(mut self) -> Fault {
        self.signal = None;
        self.thread
            .take()
            .expect("joined once")
            .join()
            .expect("faults thread")
    }
}

impl Drop for Restart {
    fn drop(&mut self) {
        self.signal = None;
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

/// The leader of `topic`'s partition 0 by a metadata request (fast, unlike the script's JVM).
fn metadata_leader(client: &rdkafka::consumer::BaseConsumer, topic: &str) -> Option<usize> {
    use rdkafka::consumer::Consumer as _;
    let md = client
        .fetch_metadata(Some(topic), Duration::from_secs(2))
        .ok()?;
    let t = md.topics().iter().find(|t| t.name() == topic)?;
    let p = t.partitions().iter().find(|p| p.id() == 0)?;
    usize::try_from(p.leader()).ok().filter(|n| *n > 0)
}

struct Run<'a> {
    sc: &'a Scenario,
    rt: &'a tokio::runtime::Runtime,
    api: Api,
    hookline: Hookline,
    timelines: BTreeMap<String, Timeline>,
    calls: Vec<Call>,
}

impl Run<'_> {
    /// Sleeps until `secs` after `from`, failing the test if hookline exits meanwhile.
    fn until(&mut self, from: Instant, secs: f64, what: &str) {
        let left = (from + Duration::from_secs_f64(secs)).saturating_duration_since(Instant::now());
        watch(&mut [&mut self.hookline], what, left.as_secs_f64());
    }

    /// Makes the change, retrying a retryable answer; records the acknowledged state.
    fn apply(&mut self, op: Op) {
        let what = op.describe();
        let id = op.id().to_string();
        let before = self.timelines.get(&id).and_then(|t| t.current().cloned());
        let sent = Instant::now();
        let mut failures = Vec::new();
        let mut anomaly = None;
        let mut tries = 0;
        let state: Option<State> = loop {
            tries += 1;
            assert!(
                tries <= MAX_TRIES,
                "{what}: no success in {MAX_TRIES} tries: {failures:?}"
            );
            if tries > 1 {
                std::thread::sleep(Duration::from_millis(500));
            }
            self.hookline.assert_running(&what);
            let (method, path, body) = match &op {
                Op::Create { id, path, ty } => (
                    Method::POST,
                    "/v1/endpoints".to_string(),
                    Some(
                        json!({"id": id, "url": self.sc.rx.url(path), "event_types": [ty], "secret": SECRET}),
                    ),
                ),
                Op::Move { id, path } => (
                    Method::PATCH,
                    format!("/v1/endpoints/{id}"),
                    Some(json!({"url": self.sc.rx.url(path)})),
                ),
                Op::Retype { id, ty } => (
                    Method::PATCH,
                    format!("/v1/endpoints/{id}"),
                    Some(json!({"event_types": [ty]})),
                ),
                Op::Enable { id, on } => (
                    Method::PATCH,
                    format!("/v1/endpoints/{id}"),
                    Some(json!({"enabled": on})),
                ),
                Op::Delete { id } => (Method::DELETE, format!("/v1/endpoints/{id}"), None),
            };
            let answer = self.rt.block_on(self.api.request(method, &path, body));
            let (status, body) = match answer {
                Ok(a) => a,
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            };
            if status.is_server_error() {
                let code = body["error"]["code"].as_str().unwrap_or("?");
                let msg = body["error"]["message"].as_str().unwrap_or("");
                failures.push(format!("{} {code}: {msg}", status.as_u16()));
                continue;
            }
            let expected = match &op {
                Op::Create { path, ty, .. } => Some(State {
                    path: path.clone(),
                    ty: ty.clone(),
                    enabled: true,
                }),
                Op::Move { path, .. } => before.clone().map(|s| State {
                    path: path.clone(),
                    ..s
                }),
                Op::Retype { ty, .. } => before.clone().map(|s| State {
                    ty: ty.clone(),
                    ..s
                }),
                Op::Enable { on, .. } => before.clone().map(|s| State { enabled: *on, ..s }),
                Op::Delete { .. } => None,
            };
            let code = body["error"]["code"].as_str().unwrap_or("");
            match (&op, status.as_u16()) {
                (Op::Create { .. }, 201) => {
                    self.check_view(&what, &body["endpoint"], &expected);
                    break expected;
                }
                (Op::Delete { .. }, 204) => break None,
                (Op::Move { .. } | Op::Retype { .. } | Op::Enable { .. }, 200) => {
                    self.check_view(&what, &body, &expected);
                    break expected;
                }
                // An earlier try that answered 5xx or timed out may have committed.
                (Op::Create { .. }, 409) if code == "already_exists" => {
                    if tries == 1 {
                        anomaly = Some(format!("409 already_exists on the first try: {body}"));
                    }
                    let (s, shown) = self
                        .rt
                        .block_on(self.api.request(Method::GET, &path_of(&id), None))
                        .unwrap_or_else(|e| panic!("{what}: reading it back: {e}"));
                    assert_eq!(s, StatusCode::OK, "{what}: reading it back: {shown}");
                    self.check_view(&what, &shown, &expected);
                    break expected;
                }
                (Op::Delete { .. }, 404) => {
                    if tries == 1 {
                        anomaly = Some(format!("404 on the first try: {body}"));
                    }
                    break None;
                }
                _ => panic!("{what}: unexpected answer {status} (try {tries}): {body}"),
            }
        };
        let ack = Instant::now();
        let took = ack - sent;
        if !failures.is_empty() || took > Duration::from_secs(2) || anomaly.is_some() {
            self.sc.say(&format!(
                "{what}: acknowledged after {:.1}s, {} tries{}{}",
                took.as_secs_f64(),
                tries,
                if failures.is_empty() {
                    String::new()
                } else {
                    format!(", failed tries: {failures:?}")
                },
                anomaly
                    .as_ref()
                    .map(|a| format!(", ANOMALY: {a}"))
                    .unwrap_or_default()
            ));
        }
        self.timelines
            .entry(id)
            .or_insert_with(|| Timeline::new(self.sc.t0))
            .changes
            .push(Change {
                what: what.clone(),
                sent,
                ack,
                state,
            });
        self.calls.push(Call {
            what,
            failures,
            took,
            anomaly,
            sent,
        });
    }

    /// The API's answer shows the state asked for.
    fn check_view(&self, what: &str, v: &Value, expected: &Option<State>) {
        let s = expected.as_ref().expect("a state to show");
        assert_eq!(
            v["url"].as_str(),
            Some(self.sc.rx.url(&s.path).as_str()),
            "{what}: url in {v}"
        );
        assert_eq!(
            v["event_types"],
            json!([s.ty]),
            "{what}: event_types in {v}"
        );
        assert_eq!(
            v["enabled"].as_bool(),
            Some(s.enabled),
            "{what}: enabled in {v}"
        );
    }

    /// The endpoints expected now: the two file ones and every new one not deleted.
    fn expected(&self) -> Listed {
        let mut out = Listed::new();
        for name in ["healthy", "flaky"] {
            out.insert(
                name.to_string(),
                (self.sc.rx.url(&format!("/{name}")), vec![], true),
            );
        }
        for (id, t) in &self.timelines {
            if let Some(s) = t.current() {
                out.insert(
                    id.clone(),
                    (self.sc.rx.url(&s.path), vec![s.ty.clone()], s.enabled),
                );
            }
        }
        out
    }
}

fn path_of(id: &str) -> String {
    format!("/v1/endpoints/{id}")
}

/// The admin API's address, from `run all`'s log.
fn admin_addr(log: &str) -> Option<String> {
    log.lines().find_map(|l| {
        let v: Value = serde_json::from_str(l).ok()?;
        if !v["message"].as_str()?.starts_with("admin api listening") {
            return None;
        }
        v["addr"].as_str().map(str::to_string)
    })
}

/// Where event `n` of [`Stream::mixed`] is among the records (each event is followed by its
/// re-send when `n % 3 == 2` and by an invalid record while `n < invalid`).
fn record_index(n: usize, invalid: usize) -> usize {
    n + n / 3 + n.min(invalid)
}

fn ms(d: f64) -> String {
    format!("{:.0}ms", d * 1000.0)
}

/// "median X, max Y (n)" of signed seconds.
fn spread(mut v: Vec<f64>) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.sort_by(f64::total_cmp);
    format!(
        "median {}, min {}, max {} (n={})",
        ms(v[v.len() / 2]),
        ms(v[0]),
        ms(v[v.len() - 1]),
        v.len()
    )
}

/// Per (event, new endpoint): the deliveries every possible state makes due (and whether they
/// arrived), and the ones every possible state excludes after the endpoint's creation.
struct Due {
    due: usize,
    /// Excluded by every state that may apply (another type, disabled, deleted).
    excluded: usize,
    /// Of those, events of the endpoint's type excluded only by its being disabled or deleted.
    off: usize,
    missing: Vec<String>,
}

fn due_deliveries(
    ids: &BTreeSet<String>,
    timelines: &BTreeMap<String, Timeline>,
    healthy_first: &HashMap<String, Instant>,
    got: &HashMap<(String, String), Vec<Instant>>,
    event_of: &dyn Fn(&str) -> Option<(usize, Instant)>,
) -> Due {
    let mut d = Due {
        due: 0,
        excluded: 0,
        off: 0,
        missing: Vec::new(),
    };
    for id in ids {
        let (n, a) = event_of(id).expect("an event id");
        let ty = TYPES[n % 2];
        let b = *healthy_first
            .get(id)
            .expect("every event reached the healthy endpoint");
        for (eid, t) in timelines {
            let states: Vec<&Option<State>> = t.possible(a, b + SLACK).collect();
            let paths: BTreeSet<Option<&str>> = states.iter().map(|s| delivers(s, ty)).collect();
            match paths.into_iter().collect::<Vec<_>>().as_slice() {
                [Some(path)] => {
                    d.due += 1;
                    if !got.contains_key(&(path.to_string(), id.clone())) {
                        d.missing.push(format!("{eid}@{path} {id}"));
                    }
                }
                // Delivered in no state that may apply, the endpoint created by then.
                [None] if states.iter().any(|s| s.is_some()) || a > t.changes[1].ack => {
                    d.excluded += 1;
                    let last_ty = t.changes.iter().rev().find_map(|c| c.state.as_ref());
                    let its_type = states
                        .iter()
                        .filter_map(|s| s.as_ref())
                        .chain(last_ty)
                        .all(|s| s.ty == ty);
                    let off = states.iter().all(|s| s.as_ref().is_none_or(|s| !s.enabled));
                    if its_type && off && a > t.changes[1].ack + MARGIN {
                        d.off += 1;
                    }
                }
                _ => {}
            }
        }
    }
    d
}

#[test]
fn control_plane_leader_killed_while_endpoints_change() {
    crate::require_cluster();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sc = Scenario::new("cp", &rt, Options::default());
    // An admin token of our own: `run all`'s dev token is printed on stdout, which procs drops.
    {
        let hash: String = Sha256::digest(TOKEN.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&sc.config)
            .expect("config");
        write!(
            f,
            "\n[[admin.tokens]]\nname = \"faults\"\nsha256 = \"{hash}\"\nscope = \"admin\"\n"
        )
        .expect("append the token");
    }
    let endpoints_topic = format!("{}.endpoints", sc.prefix);
    let writer_txn = format!("{}.control.endpoints-writer", sc.prefix);
    let hookline = Hookline::all(&sc.config);
    let client = reqwest::Client::builder()
        .timeout(CALL_TIMEOUT)
        .build()
        .expect("client");
    let mut run = Run {
        sc: &sc,
        rt: &rt,
        api: Api {
            base: String::new(),
            client,
        },
        hookline,
        timelines: BTreeMap::new(),
        calls: Vec::new(),
    };

    // The admin API up, the file endpoints seeded.
    let started = Instant::now();
    let addr = loop {
        run.hookline.assert_running("the start");
        if let Some(a) = admin_addr(&run.hookline.log_text()) {
            break a;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no admin api within 120 s; log:\n{}",
            run.hookline.tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    run.api.base = format!("http://{addr}");
    let (status, body) = rt
        .block_on(run.api.request(Method::GET, "/v1/endpoints", None))
        .expect("list endpoints");
    assert_eq!(status, StatusCode::OK, "{body}");
    sc.say(&format!(
        "hookline run all up, admin api {addr} ({} endpoints listed)",
        body["items"].as_array().map_or(0, Vec::len)
    ));

    // The faults thread: the leader of <p>.endpoints[0] killed on a signal, back DOWN later.
    let (kill_tx, kill_rx) = mpsc::channel::<()>();
    let mut fault = Restart {
        signal: Some(kill_tx),
        thread: Some({
            let topic = endpoints_topic.clone();
            let writer_txn = writer_txn.clone();
            let dedupe_group = format!("{}.deduper.dedupe", sc.prefix);
            std::thread::spawn(move || {
                let by_script = cluster::leader(&topic, 0);
                let coordinator = cluster::txn_coordinator(&writer_txn);
                let dedupe_coordinator = group_coordinator(&dedupe_group);
                let md: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", harness::bootstrap())
                    .create()
                    .expect("metadata client");
                if kill_rx.recv().is_err() {
                    panic!("the test ended before the kill");
                }
                let node = metadata_leader(&md, &topic)
                    .or(by_script)
                    .expect("a leader of <p>.endpoints[0]");
                let mut roles = vec![format!("leader of {topic}[0]")];
                if coordinator == Some(node) {
                    roles.push("the registry writer's transaction coordinator".into());
                }
                if dedupe_coordinator == Some(node) {
                    roles.push(format!("coordinator of group {dedupe_group}"));
                }
                let killed_at = Instant::now();
                cluster::kill9(node);
                let mut elected = None;
                while killed_at.elapsed() < Duration::from_secs(30) {
                    if let Some(n) = metadata_leader(&md, &topic).filter(|n| *n != node) {
                        elected = Some((n, Instant::now()));
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                std::thread::sleep((killed_at + DOWN).saturating_duration_since(Instant::now()));
                // A restart can fail for reasons of the host's (the PROXIED listener's port is in
                // the ephemeral range: a client socket's TIME-WAIT on it fails the bind for up to
                // 60 s); the broker must come back whatever this test finds.
                let mut start_tries = 0;
                let first_start = Instant::now();
                let start_secs = loop {
                    start_tries += 1;
                    match std::panic::catch_unwind(|| cluster::start_node(node)) {
                        Ok(secs) => break secs,
                        Err(e) if first_start.elapsed() > Duration::from_secs(120) => {
                            std::panic::resume_unwind(e)
                        }
                        Err(_) => std::thread::sleep(Duration::from_secs(10)),
                    }
                };
                Fault {
                    node,
                    roles: roles.join(", "),
                    killed_at,
                    elected,
                    back_at: Instant::now(),
                    start_secs,
                    start_tries,
                }
            })
        }),
    };

    let unique = env_or("HOOKLINE_TEST_FAULT_EVENTS", 1800usize);
    let rate = env_or("HOOKLINE_TEST_FAULT_RATE", 80.0f64);
    let stream = Stream::mixed(&sc.prefix, unique, 30);
    let (ids, invalid) = (stream.ids.clone(), stream.invalid);
    let records = stream.len();
    sc.say(&format!(
        "{unique} events ({records} records) at {rate}/s, ~{:.0}s",
        records as f64 / rate
    ));
    let s0 = Instant::now();
    let producing = stream.start(&sc.prefix, rate);

    let n_new = 12;
    let ty = |k: usize| TYPES[k % 2].to_string();
    let other = |k: usize| TYPES[(k + 1) % 2].to_string();
    let new = |k: usize| format!("new-{k}");

    // Phase A: half the endpoints created before the fault.
    run.until(s0, 3.0, "the stream's start");
    for k in 0..n_new / 2 {
        run.apply(Op::Create {
            id: new(k),
            path: format!("/new-{k}"),
            ty: ty(k),
        });
        run.until(s0, 3.0 + 0.6 * (k + 1) as f64, "the creates");
    }
    // The kill lands while the next writes are in flight.
    fault.kill();
    sc.say("killing the leader of <p>.endpoints[0]");

    // Phase B: during the outage and the failover.
    let phase_b = Instant::now();
    let mut ops: Vec<Op> = (n_new / 2..n_new)
        .map(|k| Op::Create {
            id: new(k),
            path: format!("/new-{k}"),
            ty: ty(k),
        })
        .collect();
    ops.extend([
        Op::Move {
            id: new(2),
            path: "/new-2-moved".into(),
        },
        Op::Retype {
            id: new(3),
            ty: other(3),
        },
        Op::Enable {
            id: new(4),
            on: false,
        },
        Op::Delete { id: new(5) },
    ]);
    for (i, op) in ops.into_iter().enumerate() {
        run.apply(op);
        run.until(phase_b, 0.5 * (i + 1) as f64, "the changes");
    }

    // Phase C: from DOWN + 1 s after the kill (the broker restarting, then back).
    run.until(phase_b, DOWN.as_secs_f64() + 1.0, "the outage");
    let phase_c = Instant::now();
    let ops = [
        Op::Move {
            id: new(6),
            path: "/new-6-moved".into(),
        },
        Op::Enable {
            id: new(4),
            on: true,
        },
        Op::Enable {
            id: new(7),
            on: false,
        },
        Op::Delete { id: new(8) },
        Op::Retype {
            id: new(9),
            ty: other(9),
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        run.apply(op);
        run.until(phase_c, 0.5 * (i + 1) as f64, "the changes");
    }
    let last_change = Instant::now();
    sc.say(&format!(
        "{} changes made, the last {:.1}s into the stream",
        run.calls.len(),
        (last_change - s0).as_secs_f64()
    ));

    let fault = fault.join();
    sc.say(&format!(
        "broker {} ({}) killed {:.1}s into the stream; new leader {}; back after {:.1}s (start-node {:.1}s, {} tries)",
        fault.node,
        fault.roles,
        (fault.killed_at - s0).as_secs_f64(),
        fault.elected.map_or("not seen within 30s".into(), |(n, at)| format!(
            "broker {n} after {:.1}s",
            (at - fault.killed_at).as_secs_f64()
        )),
        (fault.back_at - fault.killed_at).as_secs_f64(),
        fault.start_secs,
        fault.start_tries
    ));
    while !producing.is_finished() {
        run.hookline.assert_running("the stream");
        std::thread::sleep(Duration::from_millis(200));
    }
    producing.join().expect("producer thread");
    sc.say("stream produced");

    let retried: Vec<&Call> = run
        .calls
        .iter()
        .filter(|c| !c.failures.is_empty())
        .collect();
    let failed_tries: usize = retried.iter().map(|c| c.failures.len()).sum();
    let slowest = run.calls.iter().max_by_key(|c| c.took).expect("calls made");
    let outage_calls: Vec<&Call> = run
        .calls
        .iter()
        .filter(|c| c.sent >= fault.killed_at && c.sent <= fault.back_at)
        .collect();
    sc.say(&format!(
        "calls sent during the outage: {}",
        outage_calls
            .iter()
            .map(|c| format!(
                "{} at +{:.1}s took {:.1}s",
                c.what,
                (c.sent - fault.killed_at).as_secs_f64(),
                c.took.as_secs_f64()
            ))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    let anomalies: Vec<String> = run
        .calls
        .iter()
        .filter_map(|c| c.anomaly.as_ref().map(|a| format!("{}: {a}", c.what)))
        .collect();
    let api = format!(
        "{} API writes, {} retried ({} failed tries: {:?}), slowest {} {:.1}s, {} calls sent during the outage (max {:.1}s); \
         failover: broker {} killed, leader of <p>.endpoints[0] re-elected after {}, broker back after {:.1}s",
        run.calls.len(),
        retried.len(),
        failed_tries,
        retried
            .iter()
            .map(|c| format!("{}: {}", c.what, c.failures.join(" | ")))
            .collect::<Vec<_>>(),
        slowest.what,
        slowest.took.as_secs_f64(),
        outage_calls.len(),
        outage_calls
            .iter()
            .map(|c| c.took.as_secs_f64())
            .fold(0.0, f64::max),
        fault.node,
        fault.elected.map_or("(not seen)".into(), |(_, at)| format!(
            "{:.1}s",
            (at - fault.killed_at).as_secs_f64()
        )),
        (fault.back_at - fault.killed_at).as_secs_f64(),
    );
    sc.say(&format!("API: {api}"));

    // (c) + (d): the original endpoints' ledger, the process alive throughout.
    let summary = {
        let hookline = &mut run.hookline;
        ledger::settle(&sc, &ids, invalid, ledger::one_percent(&ids), || {
            hookline.assert_running("the settling")
        })
    };
    sc.say(&format!("ledger balanced: {summary}"));

    // (a) The API's list and the topic (read by another process) hold exactly the expected set.
    let expected = run.expected();
    let (status, body) = rt
        .block_on(run.api.request(Method::GET, "/v1/endpoints", None))
        .expect("list endpoints");
    assert_eq!(status, StatusCode::OK, "{body}");
    let from_api = listed(body["items"].as_array().expect("items"));
    assert_eq!(from_api, expected, "the admin API's endpoint list");
    let cli = hookline_command(&sc.config)
        .args(["endpoints", "list", "--json"])
        .output()
        .expect("hookline endpoints list");
    assert!(
        cli.status.success(),
        "endpoints list: {}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let from_topic: Vec<Value> = String::from_utf8_lossy(&cli.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(
        listed(&from_topic),
        expected,
        "`hookline endpoints list` (the topic, read by another process)"
    );

    // (b) The new endpoints' deliveries against their timelines.
    let healthy_first: HashMap<String, Instant> = {
        let mut m = HashMap::new();
        for r in sc.rx.requests("/healthy") {
            if let Some(id) = r.headers.get("webhook-id") {
                m.entry(id.clone()).or_insert(r.at);
            }
        }
        m
    };
    let event_of = |id: &str| -> Option<(usize, Instant)> {
        let n: usize = id.rsplit('-').next()?.parse().ok()?;
        let at = s0 + Duration::from_secs_f64(record_index(n, invalid) as f64 / rate);
        Some((n, at))
    };
    // Which endpoint a path belongs to (paths are never reused).
    let mut owner: HashMap<String, String> = HashMap::new();
    for (id, t) in &run.timelines {
        for c in &t.changes {
            if let Some(s) = &c.state {
                owner.insert(s.path.clone(), id.clone());
            }
        }
    }
    let refresh = |got: &mut HashMap<(String, String), Vec<Instant>>| {
        for path in owner.keys() {
            for r in sc.rx.requests(path) {
                if let Some(id) = r.headers.get("webhook-id") {
                    let v = got.entry((path.clone(), id.clone())).or_default();
                    if !v.contains(&r.at) {
                        v.push(r.at);
                    }
                }
            }
        }
    };
    let mut got: HashMap<(String, String), Vec<Instant>> = HashMap::new();
    refresh(&mut got);
    let settle_new = Instant::now();
    let Due {
        due: must,
        excluded,
        off,
        missing,
    } = loop {
        let due = due_deliveries(&ids, &run.timelines, &healthy_first, &got, &event_of);
        if due.missing.is_empty() || settle_new.elapsed() > Duration::from_secs(30) {
            break due;
        }
        std::thread::sleep(Duration::from_secs(1));
        refresh(&mut got);
    };
    let mut unexplained = Vec::new();
    let mut posts = 0usize;
    for ((path, id), ats) in &got {
        let eid = &owner[path];
        let t = &run.timelines[eid];
        let (n, a) = event_of(id).expect("an event id");
        let ty = TYPES[n % 2];
        for r in ats {
            posts += 1;
            if !t
                .possible(a, *r)
                .any(|s| delivers(s, ty) == Some(path.as_str()))
            {
                unexplained.push(format!(
                    "{eid}@{path} {id} ({ty}, produced ≥{:.1}s, POST at {:.1}s)",
                    (a - s0).as_secs_f64(),
                    (*r - s0).as_secs_f64()
                ));
            }
        }
    }

    // Propagation: acknowledgement → first POST at the state's path of the change's kind.
    let mut create_prop = Vec::new();
    let mut move_prop = Vec::new();
    let mut other_prop = Vec::new();
    for t in run.timelines.values() {
        for c in &t.changes[1..] {
            let Some(s) = c.state.as_ref().filter(|s| s.enabled) else {
                continue;
            };
            let first = sc
                .rx
                .requests(&s.path)
                .iter()
                .filter(|r| r.at >= c.sent)
                .filter(|r| {
                    r.headers
                        .get("webhook-id")
                        .and_then(|id| event_of(id))
                        .is_some_and(|(n, _)| TYPES[n % 2] == s.ty)
                })
                .map(|r| r.at)
                .min();
            let Some(first) = first else { continue };
            let secs = if first >= c.ack {
                (first - c.ack).as_secs_f64()
            } else {
                -(c.ack - first).as_secs_f64()
            };
            if c.what.starts_with("create") {
                create_prop.push(secs);
            } else if c.what.starts_with("move") {
                move_prop.push(secs);
            } else {
                other_prop.push(secs);
            }
        }
    }

    sc.say(&format!(
        "SUMMARY: {api}; propagation ack → first POST: creates {}, URL moves {}, enable/retype {}; \
         new endpoints: {must} (endpoint, event) deliveries due, {} missing; {excluded} excluded by state \
         ({off} of its type while disabled/deleted), {posts} POSTs, {} unexplained; anomalies: {}; ledger: {summary}",
        spread(create_prop),
        spread(move_prop),
        spread(other_prop),
        missing.len(),
        unexplained.len(),
        if anomalies.is_empty() {
            "none".to_string()
        } else {
            anomalies.join("; ")
        },
    ));
    assert!(
        missing.is_empty(),
        "{} due deliveries to new endpoints never arrived, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        unexplained.is_empty(),
        "{} POSTs to new endpoints no state explains, e.g. {:?}",
        unexplained.len(),
        &unexplained[..unexplained.len().min(10)]
    );
    assert!(
        anomalies.is_empty(),
        "API answers that were not what the call did: {anomalies:?}"
    );
    run.hookline.assert_running("the checks");
    run.hookline.stop();
}
