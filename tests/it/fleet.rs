//! Many endpoints through the control plane, in the shape users run it (`run deduper`, `run
//! dispatcher`, `run admin` as processes): creates from 8 concurrent clients over HTTP (rate
//! and latency printed, never asserted), each durable and visible; a delivery sent right after
//! a 201 (and right after a rotation) signed with the new secret; every list paged.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::admin::{admin_section, ADMIN_TOKEN};
use crate::harness::*;
use crate::live::verifies;
use crate::operational::{all_ready, call, ok};
use crate::receiver::Receiver;
use crate::secured::wait_logged;

const CLIENTS: usize = 8;
const PER_CLIENT: usize = 250;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `CLIENTS` clients (client `c` on `apis[c % apis.len()]`) calling `call(n)` for their share of `0..CLIENTS * PER_CLIENT` in a loop,
/// each answer `status`; prints the rate and the latency (never asserted).
async fn timed(
    apis: &[String],
    what: &str,
    status: u16,
    call: impl Fn(usize) -> (reqwest::Method, String, Value) + Send + Sync + 'static,
) {
    let call = Arc::new(call);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let api = apis[c % apis.len()].clone();
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut took = Vec::with_capacity(PER_CLIENT);
            for i in 0..PER_CLIENT {
                let (method, path, body) = call(c * PER_CLIENT + i);
                let mut req = http
                    .request(method, format!("http://{api}{path}"))
                    .bearer_auth(ADMIN_TOKEN);
                if !body.is_null() {
                    req = req.json(&body);
                }
                let t = Instant::now();
                let resp = req.send().await.expect("sent");
                took.push(t.elapsed());
                let got = resp.status().as_u16();
                assert_eq!(got, status, "{path}: {:?}", resp.text().await);
            }
            took
        }));
    }
    let mut took = Vec::new();
    for t in tasks {
        took.extend(t.await.expect("client"));
    }
    let elapsed = started.elapsed();
    took.sort();
    let n = took.len();
    println!(
        "{what}: {n} from {CLIENTS} clients in {:.2} s = {:.0}/s; latency p50 {:.1} ms, \
         p99 {:.1} ms, max {:.1} ms",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
        percentile(&took, 0.5).as_secs_f64() * 1e3,
        percentile(&took, 0.99).as_secs_f64() * 1e3,
        took.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

/// Until `path` has received a request; returns the first.
async fn first_request(rx: &Receiver, path: &str) -> crate::receiver::Recorded {
    let start = Instant::now();
    loop {
        if let Some(r) = rx.requests(path).into_iter().next() {
            return r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "nothing at {path} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts deduper, dispatcher and admin; returns the processes and the admin API's address.
pub(crate) async fn control_stack(
    dir: &Path,
    config_path: &Path,
) -> (Vec<(Hookline, std::path::PathBuf)>, String) {
    let mut procs = Vec::new();
    for (name, args) in [
        ("deduper", vec!["run", "deduper"]),
        ("dispatcher", vec!["run", "dispatcher"]),
        ("admin", vec!["run", "admin"]),
    ] {
        let log = dir.join(format!("{name}.log"));
        procs.push((Hookline::start(config_path, &args, &[], &log), log));
    }
    let admin_log = procs[2].1.clone();
    let api = wait_logged(&admin_log, "admin api listening", &mut procs[2].0).await;
    let logs: Vec<&Path> = procs.iter().map(|(_, l)| l.as_path()).collect();
    all_ready(&logs).await;
    (procs, api)
}

/// A test's directory, its config (the admin's tokens, `extra` appended) written there, and its
/// topics.
async fn setup(
    name: &str,
    extra: &str,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    hookline_common::config::Config,
) {
    let prefix = unique_prefix(name);
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("dir");
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
         [log]\nlevel = \"info\"\nformat = \"json\"\n{}{extra}",
        bootstrap(),
        admin_section(),
    );
    let config_path = dir.join("hookline.toml");
    std::fs::write(&config_path, &text).expect("config");
    let config = hookline_common::config::Config::from_toml_with_env(&text, "test", Vec::new())
        .expect("config");
    apply_topics(&config).await;
    (dir, config_path, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_endpoints_are_created_fast_paged_and_live_at_once() {
    require_kafka();
    let rx = Receiver::start().await;
    let (dir, config_path, config) = setup("fleet", "").await;
    let (procs, api) = control_stack(&dir, &config_path).await;

    // The writer's first write initialises its producer and reads the registry (once per
    // process): measured apart.
    let t = Instant::now();
    ok(
        &api,
        reqwest::Method::POST,
        "/v1/endpoints",
        json!({"id": "warm-up", "url": rx.url("warm-up"), "tenant": "warm"}),
    )
    .await;
    println!(
        "first create (the writer initialises): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    let cpu = |procs: &[(Hookline, std::path::PathBuf)]| -> Vec<Duration> {
        procs
            .iter()
            .map(|(h, _)| crate::control::cpu_of(&h.child.id().to_string()))
            .collect()
    };
    let cpu_before = cpu(&procs);

    // 8 clients, each creating its share in a loop (keep-alive connections, as a migration
    // script would).
    let url = rx.url("bulk");
    let total = CLIENTS * PER_CLIENT;
    let create_url = url.clone();
    timed(std::slice::from_ref(&api), "creates", 201, move |n| {
        (
            reqwest::Method::POST,
            "/v1/endpoints".to_string(),
            json!({
                "id": format!("ep-{n:05}"),
                "url": format!("{create_url}/{n}"),
                "tenant": format!("t{:03}", n % 100),
                "event_types": ["order.*"],
                "enabled": !n.is_multiple_of(10),
            }),
        )
    })
    .await;
    let cpu_after = cpu(&procs);
    for (i, name) in ["deduper", "dispatcher", "admin"].iter().enumerate() {
        println!(
            "CPU per create: {name} {:.0} µs",
            (cpu_after[i] - cpu_before[i]).as_secs_f64() * 1e6 / total as f64
        );
    }

    // Updates and deletes at the same concurrency (the deletes of endpoints made for them).
    timed(std::slice::from_ref(&api), "updates", 200, |n| {
        (
            reqwest::Method::PATCH,
            format!("/v1/endpoints/ep-{n:05}"),
            json!({"event_types": ["order.*", "invoice.*"]}),
        )
    })
    .await;
    let doomed: Vec<Value> = (0..total)
        .map(|n| json!({"id": format!("gone-{n:05}"), "url": rx.url("gone")}))
        .collect();
    for chunk in doomed.chunks(1000) {
        ok(
            &api,
            reqwest::Method::POST,
            "/v1/endpoints:batch",
            json!({"items": chunk}),
        )
        .await;
    }
    timed(std::slice::from_ref(&api), "deletes", 204, |n| {
        (
            reqwest::Method::DELETE,
            format!("/v1/endpoints/gone-{n:05}"),
            Value::Null,
        )
    })
    .await;

    // Durable and visible elsewhere: a reader of its own reads every one from the topic.
    let reader = crate::control::registry(&config, &secrets_key(), false).await;
    assert_eq!(
        reader.current().len(),
        total + 1,
        "every create on the topic"
    );

    // A delivery sent right after the 201 is signed with the secret the 201 returned.
    for i in 0..10 {
        let id = format!("fresh-{i}");
        let tenant = format!("fresh-t{i}");
        let created = ok(
            &api,
            reqwest::Method::POST,
            "/v1/endpoints",
            json!({"id": id, "url": rx.url(&id), "tenant": tenant, "event_types": ["order.*"]}),
        )
        .await;
        let secret = created["secret"].as_str().expect("a secret").to_string();
        ok(
            &api,
            reqwest::Method::POST,
            "/v1/events",
            json!({"type": "order.paid", "tenant": tenant, "data": {"i": i}}),
        )
        .await;
        let got = first_request(&rx, &id).await;
        assert!(verifies(&got, &secret), "{id}: signed with the new secret");
        // Rotated, then an event at once: signed with the new secret too.
        let rotated = ok(
            &api,
            reqwest::Method::POST,
            &format!("/v1/endpoints/{id}/rotate-secret"),
            json!({}),
        )
        .await;
        let new_secret = rotated["secret"].as_str().expect("new secret").to_string();
        ok(
            &api,
            reqwest::Method::POST,
            "/v1/events",
            json!({"type": "order.shipped", "tenant": tenant, "data": {"i": i}}),
        )
        .await;
        let start = Instant::now();
        let second = loop {
            if let Some(r) = rx.requests(&id).into_iter().nth(1) {
                break r;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{id}: no second delivery"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            verifies(&second, &new_secret),
            "{id}: signed with the rotated-in secret"
        );
    }

    // Every list paged: all of them through the cursor, each once, by id.
    let all = page_through(&api, ADMIN_TOKEN, "limit=300").await;
    assert_eq!(all.len(), total + 11, "every endpoint once");
    let sorted: Vec<String> = all
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(all, sorted, "by id, each once");
    // Filters: a tenant (n % 100 == 7), the state (n % 10 == 0 disabled), a URL prefix
    // (n = 1, 10..=19, 100..=199, 1000..=1999).
    assert_eq!(
        page_through(&api, ADMIN_TOKEN, "tenant=t007&limit=7")
            .await
            .len(),
        20
    );
    assert_eq!(
        page_through(&api, ADMIN_TOKEN, "state=disabled")
            .await
            .len(),
        200
    );
    let prefix = format!("url_prefix={}", urlencode(&format!("{url}/1")));
    assert_eq!(page_through(&api, ADMIN_TOKEN, &prefix).await.len(), 1111);
    // A tenant token sees its tenant's only, whatever the query asks.
    assert!(page_through(&api, crate::admin::ACME_TOKEN, "tenant=t007")
        .await
        .is_empty());
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("state=on", "state"),
        ("cursor=a%20b", "cursor"),
    ] {
        let (status, v) = get(&api, ADMIN_TOKEN, &format!("/v1/endpoints?{query}")).await;
        assert_eq!(status, 400, "{query}: {v}");
        assert_eq!(v["error"]["field"], field, "{query}: {v}");
    }

    // The dashboard's list pages too: 50 a page, a link to the next, filters kept.
    let http = reqwest::Client::new();
    let ui = |path: String| {
        http.get(format!("http://{api}{path}"))
            .header("cookie", format!("hookline_session={ADMIN_TOKEN}"))
            .send()
    };
    let first = ui("/?state=disabled".into())
        .await
        .expect("ui")
        .text()
        .await
        .expect("page");
    let rows = first.matches("<tr data-endpoint=").count();
    assert_eq!(rows, 50, "a page of the dashboard's list");
    let next = first
        .split("id=\"next\" href=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a next-page link")
        .replace("&amp;", "&");
    assert!(next.contains("state=disabled"), "{next}");
    let second = ui(next).await.expect("ui").text().await.expect("page");
    assert_eq!(second.matches("<tr data-endpoint=").count(), 50);
    assert!(
        !second.contains("data-endpoint=\"ep-00000\""),
        "the second page starts after the first"
    );
    let _ = call;
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn get(api: &str, token: &str, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("http://{api}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("sent");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Every endpoint id `GET /v1/endpoints?{query}` lists, following `next_cursor` to the end.
async fn page_through(api: &str, token: &str, query: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/endpoints?{query}&cursor={c}"),
            None => format!("/v1/endpoints?{query}"),
        };
        let (status, v) = get(api, token, &path).await;
        assert_eq!(status, 200, "{path}: {v}");
        for item in v["items"].as_array().expect("items") {
            ids.push(item["id"].as_str().expect("id").to_string());
        }
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return ids,
        }
        assert!(ids.len() < 100_000, "paging never ends");
    }
}

/// `hookline …` with the test's secrets key; (status ok, stdout, stderr).
fn hookline(config: &Path, args: &[&str]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(binary());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HOOKLINE_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .arg("--config")
        .arg(config)
        .args(args)
        .env("HOOKLINE_SECRETS_KEY", secrets_key())
        .output()
        .expect("run hookline");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn outcomes(v: &Value) -> Vec<(String, String)> {
    v["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            (
                i["id"].as_str().unwrap_or_default().to_string(),
                i["outcome"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_imports_are_all_or_nothing_and_idempotent() {
    require_kafka();
    let rx = Receiver::start().await;
    let file = format!(
        "[[endpoints]]\nid = \"from-file\"\nurl = \"{}\"\n",
        rx.url("from-file")
    );
    let (dir, config_path, _) = setup("fleet-import", &file).await;
    let (_procs, api) = control_stack(&dir, &config_path).await;

    // POST /v1/endpoints:batch: created, then unchanged on a re-send, then one updated.
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let items = |b_url: &str| {
        json!({"items": [
            {"id": "b-1", "url": rx.url("b-1"), "tenant": "acme", "secret": secret},
            {"id": "b-2", "url": b_url, "event_types": ["order.*"]},
            {"id": "b-3", "url": rx.url("b-3"), "enabled": false},
        ]})
    };
    let b2 = rx.url("b-2");
    let v = ok(
        &api,
        reqwest::Method::POST,
        "/v1/endpoints:batch",
        items(&b2),
    )
    .await;
    let created: Vec<(String, String)> = ["b-1", "b-2", "b-3"]
        .iter()
        .map(|id| (id.to_string(), "created".to_string()))
        .collect();
    assert_eq!(outcomes(&v), created);
    assert!(
        v["items"][0]["secret"].is_null(),
        "a given secret is not echoed"
    );
    assert!(v["items"][1]["secret"]
        .as_str()
        .is_some_and(|s| s.starts_with("whsec_")));
    let v = ok(
        &api,
        reqwest::Method::POST,
        "/v1/endpoints:batch",
        items(&b2),
    )
    .await;
    assert!(outcomes(&v).iter().all(|(_, o)| o == "unchanged"), "{v}");
    assert!(
        v["items"][1]["secret"].is_null(),
        "an existing endpoint keeps its secret"
    );
    let moved = format!("{b2}/v2");
    let v = ok(
        &api,
        reqwest::Method::POST,
        "/v1/endpoints:batch",
        items(&moved),
    )
    .await;
    assert_eq!(outcomes(&v)[1], ("b-2".to_string(), "updated".to_string()));
    assert_eq!(v["items"][1]["endpoint"]["version"], 2);
    assert_eq!(outcomes(&v)[0].1, "unchanged");

    // A bad item refuses the whole batch, naming it; the good one before it is not written.
    let (status, v) = call(
        &api,
        reqwest::Method::POST,
        "/v1/endpoints:batch",
        json!({"items": [
            {"id": "b-new", "url": rx.url("b-new")},
            {"id": "b-bad", "url": "ftp://nope"},
        ]}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "items[1].url", "{v}");
    let (status, _) = get(&api, ADMIN_TOKEN, "/v1/endpoints/b-new").await;
    assert_eq!(status, 404, "nothing of a refused batch is written");
    // A file-managed id refuses it too (409), and so does an empty or oversized one.
    let (status, v) = call(
        &api,
        reqwest::Method::POST,
        "/v1/endpoints:batch",
        json!({"items": [{"id": "b-new", "url": rx.url("b-new")}, {"id": "from-file", "url": rx.url("x")}]}),
    )
    .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(get(&api, ADMIN_TOKEN, "/v1/endpoints/b-new").await.0, 404);
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"id": format!("m-{i}"), "url": rx.url("m")}))
        .collect();
    for body in [json!({"items": []}), json!({"items": many})] {
        let (status, v) = call(&api, reqwest::Method::POST, "/v1/endpoints:batch", body).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["field"], "items");
    }

    // hookline endpoints import: 5,000 lines in one transaction, timed; re-run: unchanged.
    const LINES: usize = 5000;
    let file = dir.join("endpoints.jsonl");
    let mut lines = String::from("# exported from the old system\n");
    for i in 0..LINES {
        let mut line = json!({
            "id": format!("imp-{i:05}"),
            "url": format!("{}/{i}", rx.url("imp")),
            "tenant": format!("c{:04}", i / 5),
            "event_types": ["invoice.*"],
        });
        if i % 2 == 0 {
            line["secret"] = json!(secret);
        }
        lines.push_str(&line.to_string());
        lines.push('\n');
    }
    std::fs::write(&file, &lines).expect("file");
    let file_arg = file.to_str().expect("path");
    let t = Instant::now();
    let (success, out, err) = hookline(&config_path, &["endpoints", "import", file_arg]);
    let took = t.elapsed();
    assert!(success, "import failed: {out}\n{err}");
    assert!(
        out.contains(&format!(
            "imported {LINES} endpoint(s): {LINES} created, 0 updated, 0 unchanged"
        )),
        "{out}"
    );
    assert_eq!(
        out.matches("\nsecret imp-").count() + usize::from(out.starts_with("secret imp-")),
        LINES / 2,
        "generated secrets shown once"
    );
    println!(
        "import: {LINES} endpoints in {:.2} s with the CLI's start = {:.0}/s",
        took.as_secs_f64(),
        LINES as f64 / took.as_secs_f64()
    );
    let (success, out, err) = hookline(&config_path, &["endpoints", "import", file_arg]);
    assert!(success, "{err}");
    assert!(
        out.contains(&format!("{LINES} unchanged")),
        "re-run changes nothing: {out}"
    );
    // Visible over the API at once.
    assert_eq!(
        page_through(&api, ADMIN_TOKEN, "tenant=c0042").await.len(),
        5
    );

    // A bad line: its number and field named, nothing of the file written.
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        format!(
            "{}\n{}\n{}\n",
            json!({"id": "new-1", "url": rx.url("new-1")}),
            json!({"id": "new-2", "url": rx.url("new-2")}),
            json!({"id": "new-3", "url": "https://10.0.0.1:99999/x"}),
        ),
    )
    .expect("file");
    let (success, out, err) = hookline(
        &config_path,
        &["endpoints", "import", bad.to_str().expect("path")],
    );
    assert!(!success, "a bad file is refused: {out}");
    assert!(
        err.contains("line 3") && err.contains("field `url`"),
        "{err}"
    );
    assert_eq!(get(&api, ADMIN_TOKEN, "/v1/endpoints/new-1").await.0, 404);
    std::fs::write(
        &bad,
        format!(
            "{}\n{}\n",
            json!({"id": "new-1", "url": rx.url("new-1")}),
            json!({"id": "new-1", "url": rx.url("new-2")}),
        ),
    )
    .expect("file");
    let (success, _, err) = hookline(
        &config_path,
        &["endpoints", "import", bad.to_str().expect("path")],
    );
    assert!(
        !success && err.contains("line 2") && err.contains("line 1"),
        "{err}"
    );

    // Export → import is a round trip: every API endpoint, nothing changed; secrets only when
    // asked for.
    let (success, exported, err) = hookline(&config_path, &["endpoints", "export"]);
    assert!(success, "{err}");
    assert_eq!(
        exported.lines().count(),
        LINES + 3,
        "every API-managed endpoint, not the file's"
    );
    assert!(!exported.contains("whsec_"), "no secret unless asked for");
    let round = dir.join("round.jsonl");
    std::fs::write(&round, &exported).expect("file");
    let (success, out, err) = hookline(
        &config_path,
        &["endpoints", "import", round.to_str().expect("path")],
    );
    assert!(success, "{err}");
    assert!(out.contains(&format!("{} unchanged", LINES + 3)), "{out}");
    let (success, with, _) = hookline(
        &config_path,
        &["endpoints", "export", "--tenant", "acme", "--with-secrets"],
    );
    assert!(success);
    let line: Value = serde_json::from_str(with.lines().next().expect("b-1")).expect("json");
    assert_eq!(line["id"], "b-1");
    assert_eq!(line["secret"], secret);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admin_pods_creating_at_once_both_succeed() {
    require_kafka();
    let rx = Receiver::start().await;
    let (dir, config_path, config) = setup("fleet-two", "").await;
    let mut apis = Vec::new();
    let mut procs = Vec::new();
    for name in ["admin-a", "admin-b"] {
        let log = dir.join(format!("{name}.log"));
        let mut child = Hookline::start(&config_path, &["run", "admin"], &[], &log);
        apis.push(wait_logged(&log, "admin api listening", &mut child).await);
        procs.push((child, log));
    }
    let logs: Vec<&Path> = procs.iter().map(|(_, l)| l.as_path()).collect();
    all_ready(&logs).await;
    // Each pod's writer fences the other's whenever it initialises: every switch costs an
    // initialisation. Printed, never asserted; every create must still succeed.
    let url = rx.url("two");
    timed(&apis, "creates on two admin pods", 201, move |n| {
        (
            reqwest::Method::POST,
            "/v1/endpoints".to_string(),
            json!({"id": format!("two-{n:05}"), "url": format!("{url}/{n}")}),
        )
    })
    .await;
    let reader = crate::control::registry(&config, &secrets_key(), false).await;
    assert_eq!(
        reader.current().len(),
        CLIENTS * PER_CLIENT,
        "every create once"
    );
}
