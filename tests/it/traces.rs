//! One delivery's trace, read back from a real collector (issue 34, part 2). Jaeger v2 (an
//! OpenTelemetry Collector distribution, built by scripts/install-trace-tools.sh) receives
//! OTLP/HTTP from three hookline processes — `run deduper`, `run dispatcher`, `run retry-tiers` —
//! plus `hookline replay`, and from the test's own producer span. One event fanned out to two
//! endpoints makes one trace:
//!
//! ```text
//! produce (the producer)
//! └─ hookline.dedupe (kept)                         run deduper
//!    ├─ hookline.attempt ep#1 503                   run dispatcher
//!    │  └─ hookline.retry                           run retry-tiers
//!    │     └─ hookline.attempt ep#2 200             run retry-tiers
//!    └─ hookline.attempt dead#1 500                 run dispatcher
//!       └─ hookline.retry
//!          └─ hookline.attempt dead#2 500
//!             └─ hookline.dead_letter (exhausted)
//!                └─ hookline.replay                 hookline replay
//!                   └─ hookline.attempt dead#3 200
//! ```
//!
//! Every parent link is checked, and each POST's `traceparent` names its attempt's span; a third
//! endpoint with `trace_context = false` is traced but gets no `traceparent`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use crate::harness::*;
use crate::receiver::{Behavior, Receiver};
use crate::resilience::free_port;

/// The Jaeger binary: `HOOKLINE_TEST_JAEGER`, else where scripts/install-trace-tools.sh puts it.
fn jaeger_binary() -> PathBuf {
    let path = std::env::var_os("HOOKLINE_TEST_JAEGER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let tools = std::env::var_os("HOOKLINE_TOOLS")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/hookline/deploy-tools")
                });
            tools.join("bin/jaeger")
        });
    assert!(
        path.exists(),
        "the traces test needs Jaeger at {} (run scripts/install-trace-tools.sh; .ci/run does), \
         or set HOOKLINE_TEST_JAEGER",
        path.display()
    );
    path
}

/// Jaeger v2 on free loopback ports with in-memory storage; killed on drop.
struct Jaeger {
    child: std::process::Child,
    otlp: u16,
    query: u16,
    log: PathBuf,
}

impl Jaeger {
    async fn start(dir: &std::path::Path) -> Jaeger {
        let (otlp, query, grpc) = loop {
            let ports = (free_port(), free_port(), free_port());
            if ports.0 != ports.1 && ports.1 != ports.2 && ports.0 != ports.2 {
                break ports;
            }
        };
        let config = dir.join("jaeger.yaml");
        std::fs::write(
            &config,
            format!(
                "service:\n  extensions: [jaeger_storage, jaeger_query]\n  pipelines:\n    traces:\n      \
                 receivers: [otlp]\n      processors: [batch]\n      exporters: [jaeger_storage_exporter]\n  \
                 telemetry:\n    metrics:\n      level: none\n    logs:\n      level: info\n\
                 extensions:\n  jaeger_query:\n    storage:\n      traces: mem\n    http:\n      \
                 endpoint: 127.0.0.1:{query}\n    grpc:\n      endpoint: 127.0.0.1:{grpc}\n  \
                 jaeger_storage:\n    backends:\n      mem:\n        memory:\n          max_traces: 10000\n\
                 receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{otlp}\n\
                 processors:\n  batch:\n    timeout: 200ms\n\
                 exporters:\n  jaeger_storage_exporter:\n    trace_storage: mem\n"
            ),
        )
        .expect("jaeger config");
        let log = dir.join("jaeger.log");
        let child = Command::new(jaeger_binary())
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start jaeger");
        let jaeger = Jaeger {
            child,
            otlp,
            query,
            log,
        };
        let http = reqwest::Client::new();
        let start = Instant::now();
        loop {
            let up = http
                .get(format!("http://127.0.0.1:{query}/api/services"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if up {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "jaeger did not start:\n{}",
                std::fs::read_to_string(&jaeger.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        jaeger
    }

    fn otlp_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1/traces", self.otlp)
    }

    /// The trace's spans as Jaeger's query API answers them (`data[0]`), or None.
    async fn trace(&self, trace_id: &str) -> Option<serde_json::Value> {
        let v: serde_json::Value = reqwest::get(format!(
            "http://127.0.0.1:{}/api/traces/{trace_id}",
            self.query
        ))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
        v["data"].get(0).cloned()
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A producer's own span, exported to the collector by the producer's SDK (service
/// `test-producer`); returns its `traceparent`.
fn producer_span(otlp: String) -> String {
    use opentelemetry::trace::{Span as _, SpanKind, Tracer as _, TracerProvider as _};
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(otlp)
        .build()
        .expect("exporter");
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("test-producer")
                .build(),
        )
        .build();
    let tracer = provider.tracer("producer");
    let mut span = tracer
        .span_builder("produce order.paid")
        .with_kind(SpanKind::Producer)
        .start(&tracer);
    let sc = span.span_context().clone();
    span.end();
    provider.shutdown().expect("flush the producer span");
    format!("00-{}-{}-01", sc.trace_id(), sc.span_id())
}

/// One span of a Jaeger trace, flattened.
#[derive(Debug, Clone)]
struct Got {
    id: String,
    name: String,
    parent: Option<String>,
    process: String,
    tags: HashMap<String, serde_json::Value>,
}

fn spans(trace: &serde_json::Value) -> Vec<Got> {
    let processes = &trace["processes"];
    trace["spans"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let process = &processes[s["processID"].as_str().unwrap_or_default()];
            let process_tag = process["tags"]
                .as_array()
                .and_then(|tags| {
                    tags.iter()
                        .find(|t| t["key"] == "hookline.process")
                        .and_then(|t| t["value"].as_str())
                })
                .map(str::to_string)
                .unwrap_or_else(|| process["serviceName"].as_str().unwrap_or("").to_string());
            Got {
                id: s["spanID"].as_str().unwrap_or_default().to_string(),
                name: s["operationName"].as_str().unwrap_or_default().to_string(),
                parent: s["references"]
                    .as_array()
                    .and_then(|r| r.iter().find(|r| r["refType"] == "CHILD_OF"))
                    .and_then(|r| r["spanID"].as_str())
                    .map(str::to_string),
                process: process_tag,
                tags: s["tags"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|t| Some((t["key"].as_str()?.to_string(), t["value"].clone())))
                    .collect(),
            }
        })
        .collect()
}

fn tag_str<'a>(s: &'a Got, key: &str) -> &'a str {
    s.tags.get(key).and_then(|v| v.as_str()).unwrap_or("")
}

fn tag_int(s: &Got, key: &str) -> i64 {
    s.tags.get(key).and_then(|v| v.as_i64()).unwrap_or(-1)
}

/// The attempt span of `endpoint` number `n`.
fn attempt<'a>(all: &'a [Got], endpoint: &str, n: i64) -> Option<&'a Got> {
    all.iter().find(|s| {
        s.name == "hookline.attempt"
            && tag_str(s, "hookline.endpoint.id") == endpoint
            && tag_int(s, "hookline.attempt") == n
    })
}

fn one<'a>(all: &'a [Got], name: &str, endpoint: &str) -> Option<&'a Got> {
    all.iter()
        .find(|s| s.name == name && tag_str(s, "hookline.endpoint.id") == endpoint)
}

/// The tree under `root`, one span per line.
fn tree(all: &[Got], root: &Got, depth: usize, out: &mut String) {
    let status = tag_int(root, "http.response.status_code");
    out.push_str(&format!(
        "{}{} [{}]{}{}\n",
        "  ".repeat(depth),
        root.name,
        root.process,
        match (
            tag_str(root, "hookline.endpoint.id"),
            tag_int(root, "hookline.attempt"),
        ) {
            ("", _) => String::new(),
            (e, n) if n < 0 => format!(" {e}"),
            (e, n) => format!(" {e}#{n}"),
        },
        if status > 0 {
            format!(" {status}")
        } else {
            String::new()
        }
    ));
    for child in all
        .iter()
        .filter(|s| s.parent.as_deref() == Some(root.id.as_str()))
    {
        tree(all, child, depth + 1, out);
    }
}

/// The request's `traceparent` parent-id.
fn parent_of(r: &crate::receiver::Recorded) -> String {
    r.headers
        .get("traceparent")
        .and_then(|t| t.split('-').nth(2))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_and_replayed_delivery_is_one_trace_across_the_processes() {
    require_kafka();
    let prefix = unique_prefix("traces");
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("dir");
    let jaeger = Jaeger::start(&dir).await;
    let rx = Receiver::start().await;
    rx.script("ep", vec![Behavior::Status(503), Behavior::Status(200)]);
    rx.default("dead", Behavior::Status(500));
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
         [log]\nlevel = \"info\"\nformat = \"json\"\n[retry]\nschedule = [\"0s\", \"2s\"]\n\
         [traces]\nenabled = true\nendpoint = \"{}\"\n\
         [[endpoints]]\nid = \"ep\"\nurl = \"{}\"\n[[endpoints]]\nid = \"dead\"\nurl = \"{}\"\n\
         [[endpoints]]\nid = \"quiet\"\nurl = \"{}\"\ntrace_context = false\n",
        bootstrap(),
        jaeger.otlp_url(),
        rx.url("ep"),
        rx.url("dead"),
        rx.url("quiet"),
    );
    let config_path = dir.join("hookline.toml");
    std::fs::write(&config_path, &text).expect("config");
    let config = hookline_common::config::Config::from_toml_with_env(&text, "test", Vec::new())
        .expect("config");
    apply_topics(&config).await;

    let mut stages = Vec::new();
    for stage in ["deduper", "dispatcher", "retry-tiers"] {
        let log = dir.join(format!("{stage}.log"));
        stages.push((
            Hookline::start(&config_path, &["run", stage], &[], &log),
            log,
        ));
    }

    let otlp = jaeger.otlp_url();
    let traceparent = tokio::task::spawn_blocking(move || producer_span(otlp))
        .await
        .expect("producer span");
    let trace_id = traceparent.split('-').nth(1).expect("trace id").to_string();
    let producer_span_id = traceparent.split('-').nth(2).expect("span id").to_string();
    producer()
        .send(
            FutureRecord::to(&format!("{prefix}.events"))
                .key("evt-traced")
                .payload(r#"{"id":"evt-traced","type":"order.paid","data":{}}"#)
                .headers(OwnedHeaders::new().insert(Header {
                    key: "traceparent",
                    value: Some(traceparent.as_bytes()),
                })),
            Duration::from_secs(30),
        )
        .await
        .expect("produce");

    let got = rx.wait_for("ep", 2, Duration::from_secs(90)).await;
    assert_eq!(got.len(), 2, "503, then 200 on the 2 s tier");
    // `trace_context = false`: traced (its attempt span is in the trace), but no header sent.
    let quiet = rx.wait_for("quiet", 1, Duration::from_secs(30)).await;
    assert_eq!(quiet.len(), 1);
    assert!(
        !quiet[0].headers.contains_key("traceparent"),
        "trace_context = false sends no traceparent"
    );
    // Dead after its two attempts: replayed through the binary, traced too.
    let dlq = format!("{prefix}.dlq");
    let dead = crate::resilience::read_from(&bootstrap(), &dlq, Duration::from_secs(60), |r| {
        !r.is_empty()
    });
    assert_eq!(dead.len(), 1, "one dead letter");
    rx.default("dead", Behavior::Status(200));
    let mut replay = Command::new(env!("CARGO_BIN_EXE_hookline"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HOOKLINE_") {
            replay.env_remove(k);
        }
    }
    let replay = replay
        .arg("--config")
        .arg(&config_path)
        .args(["replay", "--endpoint", "dead"])
        .env("HOOKLINE_SECRETS_KEY", secrets_key())
        .output()
        .expect("replay");
    assert!(
        replay.status.success(),
        "replay: {}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let dead_requests = rx.requests("dead");
    assert_eq!(dead_requests.len(), 3, "two attempts and the replay");

    // Read the trace back until every span arrived (each process exports in batches).
    let start = Instant::now();
    let all = loop {
        if let Some(trace) = jaeger.trace(&trace_id).await {
            let all = spans(&trace);
            let complete = attempt(&all, "ep", 2).is_some()
                && attempt(&all, "dead", 3).is_some()
                && one(&all, "hookline.dead_letter", "dead").is_some()
                && all.iter().any(|s| s.name == "produce order.paid")
                && all.iter().filter(|s| s.name == "hookline.retry").count() == 2;
            if complete {
                break all;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "trace {trace_id} incomplete in Jaeger: {:?}",
            jaeger.trace(&trace_id).await.map(|t| spans(&t))
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };

    let by_name = |name: &str| {
        all.iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span"))
    };
    let produce = by_name("produce order.paid");
    assert_eq!(produce.id, producer_span_id);
    let dedupe = by_name("hookline.dedupe");
    assert_eq!(dedupe.parent.as_deref(), Some(producer_span_id.as_str()));
    assert_eq!(tag_str(dedupe, "hookline.dedupe.outcome"), "kept");
    assert_eq!(dedupe.process, "run deduper");

    let ep1 = attempt(&all, "ep", 1).expect("ep#1");
    let ep_retry = one(&all, "hookline.retry", "ep").expect("ep retry");
    let ep2 = attempt(&all, "ep", 2).expect("ep#2");
    assert_eq!(ep1.parent.as_deref(), Some(dedupe.id.as_str()));
    assert_eq!(tag_int(ep1, "http.response.status_code"), 503);
    assert_eq!(ep1.process, "run dispatcher");
    assert_eq!(tag_str(ep1, "hookline.next"), "retry.2s");
    assert!(
        tag_int(ep1, "hookline.next.due_ms") > 0,
        "next due on the span"
    );
    assert_eq!(ep_retry.parent.as_deref(), Some(ep1.id.as_str()));
    assert_eq!(ep_retry.process, "run retry-tiers");
    assert_eq!(ep2.parent.as_deref(), Some(ep_retry.id.as_str()));
    assert_eq!(tag_int(ep2, "http.response.status_code"), 200);
    assert_eq!(ep2.process, "run retry-tiers");

    let d1 = attempt(&all, "dead", 1).expect("dead#1");
    let d_retry = one(&all, "hookline.retry", "dead").expect("dead retry");
    let d2 = attempt(&all, "dead", 2).expect("dead#2");
    let letter = one(&all, "hookline.dead_letter", "dead").expect("dead letter");
    let replayed = one(&all, "hookline.replay", "dead").expect("replay");
    let d3 = attempt(&all, "dead", 3).expect("dead#3");
    assert_eq!(d1.parent.as_deref(), Some(dedupe.id.as_str()));
    assert_eq!(d_retry.parent.as_deref(), Some(d1.id.as_str()));
    assert_eq!(d2.parent.as_deref(), Some(d_retry.id.as_str()));
    assert_eq!(letter.parent.as_deref(), Some(d2.id.as_str()));
    assert_eq!(tag_str(letter, "hookline.dead.reason"), "exhausted");
    assert_eq!(replayed.parent.as_deref(), Some(letter.id.as_str()));
    assert_eq!(replayed.process, "replay");
    assert_eq!(d3.parent.as_deref(), Some(replayed.id.as_str()));
    assert_eq!(tag_int(d3, "http.response.status_code"), 200);
    let q = attempt(&all, "quiet", 1).expect("quiet#1 is traced");
    assert_eq!(q.parent.as_deref(), Some(dedupe.id.as_str()));

    // Each POST carried its attempt's span, in the producer's trace.
    for r in got.iter().chain(dead_requests.iter()) {
        let tp = r
            .headers
            .get("traceparent")
            .expect("traceparent on the POST");
        assert!(tp.contains(&trace_id), "{tp}");
    }
    assert_eq!(parent_of(&got[0]), ep1.id);
    assert_eq!(parent_of(&got[1]), ep2.id);
    assert_eq!(
        dead_requests.iter().map(parent_of).collect::<Vec<_>>(),
        vec![d1.id.clone(), d2.id.clone(), d3.id.clone()]
    );

    let mut shown = String::new();
    tree(&all, produce, 0, &mut shown);
    println!("trace {trace_id} read back from Jaeger:\n{shown}");
    drop(stages);
}

/// A trace started by `POST /v1/events` (no producer span): the request's span is the root,
/// the dedupe span its child, the attempt the dedupe span's; the same event id posted again
/// is its own trace whose dedupe span says `dropped` and that has no attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_v1_events_starts_the_trace_and_a_duplicate_is_dropped_in_its_own() {
    require_kafka();
    let prefix = unique_prefix("traces-post");
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("dir");
    let jaeger = Jaeger::start(&dir).await;
    let rx = Receiver::start().await;
    let token = hookline_admin::auth::generate();
    let hash = hookline_admin::auth::hex(&hookline_admin::auth::sha256(&token));
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[admin.tokens]]\nname = \"t\"\nsha256 = \"{hash}\"\nscope = \"admin\"\n\
         [http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
         [log]\nlevel = \"info\"\nformat = \"json\"\n\
         [traces]\nenabled = true\nendpoint = \"{}\"\n\
         [[endpoints]]\nid = \"ep\"\nurl = \"{}\"\n",
        bootstrap(),
        jaeger.otlp_url(),
        rx.url("ep"),
    );
    let config_path = dir.join("hookline.toml");
    std::fs::write(&config_path, &text).expect("config");
    let config = hookline_common::config::Config::from_toml_with_env(&text, "test", Vec::new())
        .expect("config");
    apply_topics(&config).await;
    let log = dir.join("run-all.log");
    let mut all = Hookline::start(&config_path, &["run", "all"], &[], &log);
    let api = loop {
        if let Some(addr) = logged_addr(&log, "admin api listening") {
            break addr;
        }
        assert!(
            all.child.try_wait().expect("try_wait").is_none(),
            "run all exited:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let http = reqwest::Client::new();
    for _ in 0..2 {
        let answer = http
            .post(format!("http://{api}/v1/events"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"id": "evt-posted", "type": "order.paid", "data": {}}))
            .send()
            .await
            .expect("POST /v1/events");
        assert_eq!(answer.status(), 202);
    }
    let got = rx.wait_for("ep", 1, Duration::from_secs(60)).await;
    let tp = got[0]
        .headers
        .get("traceparent")
        .expect("traceparent")
        .clone();
    let trace_id = tp.split('-').nth(1).expect("trace id").to_string();
    let start = Instant::now();
    let all_spans = loop {
        if let Some(t) = jaeger.trace(&trace_id).await {
            let s = spans(&t);
            if s.iter().any(|s| s.name == "hookline.attempt") && s.len() >= 3 {
                break s;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "trace {trace_id} incomplete"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let post = all_spans
        .iter()
        .find(|s| s.name == "POST /v1/events")
        .expect("the request's span");
    assert_eq!(post.parent, None, "the request started the trace");
    assert_eq!(tag_str(post, "hookline.event.id"), "evt-posted");
    let dedupe = all_spans
        .iter()
        .find(|s| s.name == "hookline.dedupe")
        .expect("dedupe");
    assert_eq!(dedupe.parent.as_deref(), Some(post.id.as_str()));
    assert_eq!(tag_str(dedupe, "hookline.dedupe.outcome"), "kept");
    let attempt = all_spans
        .iter()
        .find(|s| s.name == "hookline.attempt")
        .expect("attempt");
    assert_eq!(attempt.parent.as_deref(), Some(dedupe.id.as_str()));

    // The second POST: its own trace, its dedupe span `dropped`, no attempt. Jaeger's search by
    // service and operation finds it.
    let start = Instant::now();
    loop {
        let found: serde_json::Value = reqwest::get(format!(
            "http://127.0.0.1:{}/api/traces?service=hookline&operation=hookline.dedupe&limit=20&lookback=1h",
            jaeger.query
        ))
        .await
        .expect("search")
        .json()
        .await
        .expect("json");
        let dropped = found["data"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .flat_map(spans)
            .filter(|s| {
                s.name == "hookline.dedupe" && tag_str(s, "hookline.dedupe.outcome") == "dropped"
            })
            .count();
        if dropped == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no dropped dedupe span: {found}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        rx.requests("ep").len(),
        1,
        "the duplicate was not delivered"
    );
    drop(all);
}
