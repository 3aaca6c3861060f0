//! Operational webhooks, in the shape users run them: `run deduper`, two `run dispatcher`
//! processes (each a member of the relay's group), `run retry-tiers` and `run admin`, all
//! separate processes. An operator endpoint subscribed to `hookline.*` and a tenant's own
//! subscribed to `hookline.endpoint.*` get, signed and exactly once each: an endpoint created,
//! disabled through the API, marked failing, dead-lettered (`hookline.delivery.dead` naming the
//! DLQ position and the replay command) and recovered. A catch-all endpoint gets none of them,
//! and a producer cannot forge one (`reserved_type`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::message::Message as _;
use rdkafka::producer::FutureRecord;
use serde_json::{json, Value};

use crate::admin::{admin_section, ADMIN_TOKEN};
use crate::harness::*;
use crate::live::verifies;
use crate::receiver::{Behavior, Receiver, Recorded};
use crate::secured::wait_logged;

const OPS_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ACME_OPS_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// Until every process answers `/readyz` 200 (the relay's probe included).
pub(crate) async fn all_ready(logs: &[&Path]) {
    let http = reqwest::Client::new();
    for log in logs {
        let start = Instant::now();
        loop {
            if let Some(addr) = ops_addr(log) {
                let ready = http
                    .get(format!("http://{addr}/readyz"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                if ready {
                    break;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "{} not ready in 90 s:\n{}",
                log.display(),
                std::fs::read_to_string(log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

pub(crate) async fn call(
    api: &str,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .request(method, format!("http://{api}{path}"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .expect("sent");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn ok(api: &str, method: reqwest::Method, path: &str, body: Value) -> Value {
    let (status, v) = call(api, method.clone(), path, body).await;
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {v}"
    );
    v
}

fn body(r: &Recorded) -> Value {
    serde_json::from_slice(&r.body).expect("a JSON body")
}

/// (type, data.endpoint_id) → the requests of that operational event at `path`.
fn by_kind(rx: &Receiver, path: &str) -> BTreeMap<(String, String), Vec<Recorded>> {
    let mut out: BTreeMap<(String, String), Vec<Recorded>> = BTreeMap::new();
    for r in rx.requests(path) {
        let v = body(&r);
        let ty = v["type"].as_str().unwrap_or_default().to_string();
        let ep = v["data"]["endpoint_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        out.entry((ty, ep)).or_default().push(r);
    }
    out
}

/// Until `path` has received an event of `ty` about `endpoint`; returns its first request.
async fn arrives(
    rx: &Receiver,
    path: &str,
    ty: &str,
    endpoint: &str,
    within: Duration,
) -> Recorded {
    let start = Instant::now();
    loop {
        let key = (ty.to_string(), endpoint.to_string());
        if let Some(r) = by_kind(rx, path).get(&key).and_then(|v| v.first().cloned()) {
            return r;
        }
        assert!(
            start.elapsed() < within,
            "no {ty} about {endpoint} at {path} within {within:?}; got {:?}",
            by_kind(rx, path).keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_changes_and_dead_deliveries_are_signed_webhooks_once_across_pods() {
    require_kafka();
    let prefix = unique_prefix("opwebhooks");
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("dir");
    let rx = Receiver::start().await;
    rx.default("bad", Behavior::Status(500));
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
         [log]\nlevel = \"info\"\nformat = \"json\"\n[retry]\nschedule = [\"0s\", \"1s\"]\n\
         [control]\nfailing_after = \"2s\"\n{}\
         [[endpoints]]\nid = \"all\"\nurl = \"{}\"\n",
        bootstrap(),
        admin_section(),
        rx.url("all"),
    );
    let config_path = dir.join("hookline.toml");
    std::fs::write(&config_path, &text).expect("config");
    let config = hookline_common::config::Config::from_toml_with_env(&text, "test", Vec::new())
        .expect("config");
    apply_topics(&config).await;

    let mut procs = Vec::new();
    for (name, args, instance) in [
        ("deduper", vec!["run", "deduper"], "dd"),
        ("dispatcher-1", vec!["run", "dispatcher"], "d1"),
        ("dispatcher-2", vec!["run", "dispatcher"], "d2"),
        ("retry-tiers", vec!["run", "retry-tiers"], "rt"),
        ("admin", vec!["run", "admin"], "ad"),
    ] {
        let log = dir.join(format!("{name}.log"));
        let child = Hookline::start(
            &config_path,
            &args,
            &[("HOOKLINE_KAFKA__INSTANCE_ID", instance)],
            &log,
        );
        procs.push((child, log));
    }
    let admin_log = procs[4].1.clone();
    let api = wait_logged(&admin_log, "admin api listening", &mut procs[4].0).await;
    let logs: Vec<&Path> = procs.iter().map(|(_, l)| l.as_path()).collect();
    all_ready(&logs).await;

    // The operator's endpoint (every tenant's), a tenant's own, then the endpoints watched.
    for (id, tenant, types, secret) in [
        ("ops", None, vec!["hookline.*"], OPS_SECRET),
        (
            "acme-ops",
            Some("acme"),
            vec!["hookline.endpoint.*"],
            ACME_OPS_SECRET,
        ),
    ] {
        ok(
            &api,
            reqwest::Method::POST,
            "/v1/endpoints",
            json!({"id": id, "url": rx.url(id), "tenant": tenant, "event_types": types, "secret": secret}),
        )
        .await;
    }
    for id in ["crm", "bad"] {
        ok(
            &api,
            reqwest::Method::POST,
            "/v1/endpoints",
            json!({"id": id, "url": rx.url(id), "tenant": "acme", "event_types": ["order.*"]}),
        )
        .await;
    }
    let created = arrives(
        &rx,
        "ops",
        "hookline.endpoint.created",
        "crm",
        Duration::from_secs(60),
    )
    .await;
    let v = body(&created);
    assert_eq!(v["tenant"], "acme");
    assert_eq!(v["data"]["url"], rx.url("crm"));
    assert_eq!(v["data"]["version"], 1);
    assert!(
        verifies(&created, OPS_SECRET),
        "signed with the operator endpoint's secret"
    );
    assert_eq!(
        created.headers["webhook-id"],
        v["id"].as_str().unwrap_or_default()
    );

    // Disabled through the API, with both dispatchers (relay members) running.
    ok(
        &api,
        reqwest::Method::PATCH,
        "/v1/endpoints/crm",
        json!({"enabled": false}),
    )
    .await;
    let disabled = arrives(
        &rx,
        "ops",
        "hookline.endpoint.disabled",
        "crm",
        Duration::from_secs(30),
    )
    .await;
    let v = body(&disabled);
    assert_eq!(v["data"]["automatic"], false);
    assert_eq!(v["data"]["reason"], "manual");
    assert!(verifies(&disabled, OPS_SECRET));
    let tenant_copy = arrives(
        &rx,
        "acme-ops",
        "hookline.endpoint.disabled",
        "crm",
        Duration::from_secs(30),
    )
    .await;
    assert!(
        verifies(&tenant_copy, ACME_OPS_SECRET),
        "the tenant's copy, signed with its secret"
    );
    assert_eq!(body(&tenant_copy)["id"], v["id"], "the same event to both");

    // `bad` answers 500: its delivery dies after two attempts; it is failing for 2 s.
    let (status, published) = call(
        &api,
        reqwest::Method::POST,
        "/v1/events",
        json!({"id": "evt-dies", "type": "order.paid", "tenant": "acme", "data": {}}),
    )
    .await;
    assert_eq!(status, 202, "{published}");
    let dead = arrives(
        &rx,
        "ops",
        "hookline.delivery.dead",
        "bad",
        Duration::from_secs(60),
    )
    .await;
    assert!(verifies(&dead, OPS_SECRET));
    let d = body(&dead)["data"].clone();
    assert_eq!(d["event_id"], "evt-dies");
    assert_eq!(d["event_type"], "order.paid");
    assert_eq!(d["reason"], "exhausted");
    assert_eq!(d["attempts"], 2);
    let dlq = crate::resilience::read_from(
        &bootstrap(),
        &format!("{prefix}.dlq"),
        Duration::from_secs(10),
        |r| !r.is_empty(),
    );
    assert_eq!(dlq.len(), 1, "one dead letter");
    let position = format!("{}:{}", dlq[0].partition(), dlq[0].offset());
    assert_eq!(d["dead_letter"]["position"], position.as_str());
    assert_eq!(
        d["replay"]["command"],
        format!(
            "hookline replay --partition {} --from-offset {} --to-offset {}",
            dlq[0].partition(),
            dlq[0].offset(),
            dlq[0].offset()
        )
    );
    let failing = arrives(
        &rx,
        "ops",
        "hookline.endpoint.failing",
        "bad",
        Duration::from_secs(60),
    )
    .await;
    let f = body(&failing)["data"].clone();
    assert_eq!(f["consecutive_failures"], 2);
    assert_eq!(f["last_error"], "http_status 500");
    // The tenant's endpoint asked for endpoint events only.
    arrives(
        &rx,
        "acme-ops",
        "hookline.endpoint.failing",
        "bad",
        Duration::from_secs(30),
    )
    .await;

    // It answers again: the next delivery recovers it.
    rx.default("bad", Behavior::Status(200));
    let (status, _) = call(
        &api,
        reqwest::Method::POST,
        "/v1/events",
        json!({"id": "evt-recovers", "type": "order.paid", "tenant": "acme", "data": {}}),
    )
    .await;
    assert_eq!(status, 202);
    arrives(
        &rx,
        "ops",
        "hookline.endpoint.recovered",
        "bad",
        Duration::from_secs(60),
    )
    .await;

    // Nobody can forge one: refused over HTTP, quarantined from the topic.
    let (status, refused) = call(
        &api,
        reqwest::Method::POST,
        "/v1/events",
        json!({"id": "forged-1", "type": "hookline.endpoint.disabled", "data": {}}),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["field"], "type", "{refused}");
    producer()
        .send(
            FutureRecord::to(&format!("{prefix}.events"))
                .key("forged-2")
                .payload(r#"{"id":"forged-2","type":"hookline.delivery.dead","data":{}}"#),
            Duration::from_secs(30),
        )
        .await
        .expect("produce");
    let invalid = read_until(&format!("{prefix}.invalid"), Duration::from_secs(30), |r| {
        !r.is_empty()
    });
    assert_eq!(invalid.len(), 1);
    assert_eq!(
        header(&invalid[0], "hookline-invalid-reason"),
        Some("reserved_type")
    );

    // Settle, then count: each change once at each subscriber, none at the catch-all.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ops = by_kind(&rx, "ops");
    for (ty, ep) in [
        ("hookline.endpoint.created", "crm"),
        ("hookline.endpoint.created", "bad"),
        ("hookline.endpoint.disabled", "crm"),
        ("hookline.delivery.dead", "bad"),
        ("hookline.endpoint.failing", "bad"),
        ("hookline.endpoint.recovered", "bad"),
    ] {
        let got = ops
            .get(&(ty.to_string(), ep.to_string()))
            .map_or(0, Vec::len);
        assert_eq!(
            got,
            1,
            "{ty} about {ep} delivered {got} times to ops: {:?}",
            ops.keys()
        );
    }
    for r in rx.requests("ops") {
        assert!(
            verifies(&r, OPS_SECRET),
            "every operational webhook is signed"
        );
        assert!(body(&r)["type"]
            .as_str()
            .unwrap_or_default()
            .starts_with("hookline."));
    }
    let acme = by_kind(&rx, "acme-ops");
    assert!(
        acme.keys()
            .all(|(ty, _)| ty.starts_with("hookline.endpoint.")),
        "the tenant's endpoint asked for endpoint events only: {:?}",
        acme.keys()
    );
    for (ty, ep) in [
        ("hookline.endpoint.disabled", "crm"),
        ("hookline.endpoint.failing", "bad"),
        ("hookline.endpoint.recovered", "bad"),
    ] {
        let got = acme
            .get(&(ty.to_string(), ep.to_string()))
            .map_or(0, Vec::len);
        assert_eq!(got, 1, "{ty} about {ep} delivered {got} times to acme-ops");
    }
    let all = rx.requests("all");
    assert_eq!(
        all.len(),
        2,
        "the catch-all got the two order.paid events and nothing of hookline's"
    );
    println!(
        "operational webhooks: ops got {} ({:?}), acme-ops {}, the catch-all {}",
        rx.requests("ops").len(),
        ops.keys().collect::<Vec<_>>(),
        rx.requests("acme-ops").len(),
        all.len()
    );
    for (mut child, _) in procs {
        let _ = child.child.kill();
    }
}
