//! Deployment concerns proven against the real broker and the real binary: the HTTP client
//! trusts a company CA given the way containers give one (`SSL_CERT_FILE`, or the image's system
//! store), every metric the alert rules and the Grafana dashboard use is one the binary
//! exports after traffic, and the Compose stack's admin service starts from its config and its
//! endpoint secrets key, becomes ready and opens to the token docs/deployment.md gives for it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use hookline_common::contract::delivery::HISTORY;
use hookline_common::contract::headers as h;

use crate::harness::*;

/// Generous waits: tests share a 2-core machine with the broker and each other.
const WAIT: Duration = Duration::from_secs(60);

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private CA ("the company CA") and a server certificate for 127.0.0.1 signed by it, made with
/// the `openssl` command line. Returns (ca.pem, server.pem, server.key).
fn company_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let p = |n: &str| dir.join(n);
    run(Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args([
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=hookline test company CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
        ])
        .arg(p("ca.key"))
        .arg("-out")
        .arg(p("ca.pem")));
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args(["-subj", "/CN=127.0.0.1", "-keyout"])
        .arg(p("server.key"))
        .arg("-out")
        .arg(p("server.csr")));
    std::fs::write(
        p("server.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n\
         basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n",
    )
    .expect("write ext");
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-in"])
        .arg(p("server.csr"))
        .arg("-CA")
        .arg(p("ca.pem"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .arg("-CAcreateserial")
        .arg("-extfile")
        .arg(p("server.ext"))
        .arg("-out")
        .arg(p("server.pem")));
    (p("ca.pem"), p("server.pem"), p("server.key"))
}

/// A minimal HTTPS webhook receiver: answers 200 to every request and records its `webhook-id`.
async fn tls_receiver(cert: &Path, key: &Path) -> (String, Arc<Mutex<Vec<String>>>) {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("read cert")
        .collect::<Result<_, _>>()
        .expect("parse cert");
    let key = PrivateKeyDer::from_pem_file(key).expect("read key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_by_server = seen.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen_by_server.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Headers, then the body by content-length.
                loop {
                    let Ok(n) = tls.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some(end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let head = text[..end].to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if buf.len() < end + 4 + length {
                        continue;
                    }
                    if let Some(id) = head.lines().find_map(|l| l.strip_prefix("webhook-id:")) {
                        if let Ok(mut s) = seen.lock() {
                            s.push(id.trim().to_string());
                        }
                    }
                    let _ = tls
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    let _ = tls.shutdown().await;
                    return;
                }
            });
        }
    });
    (format!("https://{addr}/hooks"), seen)
}

/// Config for `hookline run dispatcher` with one HTTPS endpoint; failures wait a minute on the first
/// tier (nothing retries within the test).
fn tls_config(prefix: &str, url: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(prefix);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("hookline.toml");
    std::fs::write(
        &path,
        format!(
            "[kafka]\nbootstrap_servers = \"{bs}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
             [server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
             [retry]\nschedule = [\"0s\", \"60s\"]\n\
             [[endpoints]]\nid = \"company\"\nurl = \"{url}\"\n",
            bs = bootstrap()
        ),
    )
    .expect("write config");
    path
}

/// Sends one event through `hookline run dispatcher` to an HTTPS endpoint whose certificate the
/// company CA signed, with `SSL_CERT_FILE` pointing at that CA if `trust_ca`; `Ok` if delivered,
/// else the history of the record handed to the first tier.
async fn deliver_over_company_tls(name: &str, trust_ca: bool) -> Result<(), String> {
    let prefix = unique_prefix(name);
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let (ca, cert, key) = company_ca(&dir);
    let (url, seen) = tls_receiver(&cert, &key).await;
    let config_path = tls_config(&prefix, &url);
    apply_topics(&test_config(
        &prefix,
        "[retry]\nschedule = [\"0s\", \"60s\"]",
    ))
    .await;
    let ca_text = ca.to_string_lossy().into_owned();
    let env: Vec<(&str, &str)> = if trust_ca {
        vec![("SSL_CERT_FILE", ca_text.as_str())]
    } else {
        Vec::new()
    };
    let _dispatcher = Hookline::start(
        &config_path,
        &["run", "dispatcher"],
        &env,
        &dir.join("dispatcher.log"),
    );
    let id = format!("{name}-1");
    let body = format!(r#"{{"id":"{id}","type":"invoice.paid","data":{{}}}}"#);
    produce(
        &producer(),
        &format!("{prefix}.dispatch"),
        None,
        Some(id.as_bytes()),
        Some(body.as_bytes()),
        &[(h::EVENT_ID, &id), (h::EVENT_TYPE, "invoice.paid")],
    )
    .await;
    let start = Instant::now();
    let tier = format!("{prefix}.retry.1m");
    while start.elapsed() < WAIT {
        if seen.lock().map(|s| s.contains(&id)).unwrap_or(false) {
            return Ok(());
        }
        let handed_off = tokio::task::spawn_blocking({
            let tier = tier.clone();
            move || read_until(&tier, Duration::from_millis(500), |r| !r.is_empty())
        })
        .await
        .expect("reader");
        if let Some(m) = handed_off.first() {
            return Err(header(m, HISTORY).unwrap_or("(no history)").to_string());
        }
    }
    panic!(
        "neither delivered nor handed off within {WAIT:?}; log: {}",
        std::fs::read_to_string(dir.join("dispatcher.log")).unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatcher_trusts_a_company_ca_from_ssl_cert_file() {
    require_kafka();
    // Without the CA the certificate is unknown: a `tls` failure handed to the first tier. This
    // proves the test's certificate is not trusted by accident.
    let without = deliver_over_company_tls("tls-noca", false).await;
    let history = without.expect_err("delivered without trusting the company CA");
    assert!(history.contains("\"class\":\"tls\""), "history: {history}");
    // With the CA bundle given the way containers give one: delivered.
    deliver_over_company_tls("tls-ca", true)
        .await
        .unwrap_or_else(|history| panic!("not delivered with SSL_CERT_FILE: {history}"));
}

/// The files whose PromQL must only name metrics that exist.
const MONITORING_FILES: &[&str] = &[
    "deploy/monitoring/alerts.yaml",
    "deploy/monitoring/grafana-dashboard.json",
    "deploy/kubernetes/components/prometheus-operator/prometheusrule.yaml",
];

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The PromQL of a monitoring file: the `expr`/`query`/`definition` strings of a Grafana
/// dashboard, or a rule file without its comment lines.
fn promql_of(file: &str, text: &str) -> String {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "query" | "definition", serde_json::Value::String(s)) => {
                            out.push(s.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    if file.ends_with(".json") {
        let v: serde_json::Value = serde_json::from_str(text).expect("the dashboard is JSON");
        let mut out = Vec::new();
        walk(&v, &mut out);
        out.join("\n")
    } else {
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Metric names PromQL uses: every identifier directly followed by `{` or `[` (a selector or a
/// range), plus every `hookline_…` token (e.g. inside `label_values(…)`); with the equality
/// matchers (`label="value"`) of each `hookline_…{…}` selector. A selector's braces are skipped,
/// so regexes in matchers are never read as names.
fn referenced(promql: &str) -> (BTreeSet<String>, Vec<(String, String, String)>) {
    let chars: Vec<char> = promql.chars().collect();
    let mut names = BTreeSet::new();
    let mut matchers = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !(is_ident(chars[i]) && (i == 0 || !is_ident(chars[i - 1]) && chars[i - 1] != '$')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let next = chars.get(i).copied();
        if word.starts_with("hookline_") || next == Some('{') || next == Some('[') {
            names.insert(word.clone());
        }
        if next == Some('{') {
            let close = chars[i..]
                .iter()
                .position(|&c| c == '}')
                .map_or(chars.len(), |p| i + p);
            let inner: String = chars[i + 1..close].iter().collect();
            if word.starts_with("hookline_") {
                for m in inner.split(',') {
                    if let Some((k, v)) = m.split_once('=') {
                        let (k, v) = (k.trim(), v.trim());
                        // Regex matchers (=~, !~) and negations are not checked.
                        if !v.starts_with('~') && !k.ends_with('!') {
                            matchers.push((
                                word.clone(),
                                k.to_string(),
                                v.trim_matches('"').to_string(),
                            ));
                        }
                    }
                }
            }
            i = close;
        }
    }
    (names, matchers)
}

/// A sample's name and labels.
type Series = (String, Vec<(String, String)>);

/// `(sample name, labels)` of every sample on a Prometheus text page, and the family names.
fn exported(page: &str) -> (Vec<Series>, BTreeSet<String>) {
    let mut samples = Vec::new();
    let mut families = BTreeSet::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.split_whitespace().next() {
                families.insert(name.to_string());
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = line[..end].to_string();
        let mut labels = Vec::new();
        if line[end..].starts_with('{') {
            let close = line.find('}').unwrap_or(line.len());
            for pair in line[end + 1..close].split("\",") {
                if let Some((k, v)) = pair.split_once("=\"") {
                    labels.push((k.to_string(), v.trim_end_matches('"').to_string()));
                }
            }
        }
        samples.push((name, labels));
    }
    (samples, families)
}

fn get(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_use_only_metrics_the_binary_exports_after_traffic() {
    require_kafka();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let prefix = unique_prefix("metrics-names");
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    // A receiver failing every 3rd fresh request (retries that succeed), and an endpoint that
    // refuses every connection (a dead letter after a schedule of seconds).
    let mut receiver = Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["receiver", "--listen", "127.0.0.1:0", "--secret", secret])
        .args(["--fail-every", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start receiver");
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(receiver.stdout.take().expect("stdout")),
        &mut first,
    )
    .expect("receiver address");
    let receiver = Hookline { child: receiver };
    let schedule = "[retry]\nschedule = [\"0s\", \"1s\", \"2s\"]\n";
    let config_path = dir.join("hookline.toml");
    std::fs::write(
        &config_path,
        format!(
            "[kafka]\nbootstrap_servers = \"{bs}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
             [server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
             [log]\nformat = \"json\"\n{schedule}\
             [[endpoints]]\nid = \"demo\"\nurl = \"http://{addr}/webhooks\"\nsecrets = [\"{secret}\"]\n\
             [[endpoints]]\nid = \"refused\"\nurl = \"http://127.0.0.1:1/webhooks\"\nevent_types = [\"order.*\"]\n",
            bs = bootstrap(),
            addr = first.trim(),
        ),
    )
    .expect("write config");
    apply_topics(&test_config(&prefix, schedule)).await;
    let log = dir.join("run-all.log");
    let _pipeline = Hookline::start(&config_path, &["run", "all"], &[], &log);

    // Demo events with re-sent ids, and one record that is not JSON.
    let out = Command::new(env!("CARGO_BIN_EXE_hookline"))
        .arg("--config")
        .arg(&config_path)
        .args([
            "demo",
            "produce",
            "--count",
            "12",
            "--duplicate-rate",
            "0.5",
        ])
        .args(["--rate", "100"])
        .output()
        .expect("demo produce");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    produce(
        &producer(),
        &format!("{prefix}.events"),
        None,
        None,
        Some(b"not json"),
        &[],
    )
    .await;

    // Traffic has reached every stage once a dead letter exists and an invalid event was counted.
    let start = Instant::now();
    let page = loop {
        let page = ops_addr(&log).and_then(|a| get(&format!("http://{a}/metrics")));
        if let Some(page) = &page {
            let (samples, _) = exported(page);
            let positive = |name: &str, label: (&str, &str)| {
                page.lines().any(|l| {
                    l.starts_with(name)
                        && l.contains(&format!("{}=\"{}\"", label.0, label.1))
                        && !l.ends_with(" 0")
                })
            };
            if !samples.is_empty()
                && positive(
                    "hookline_retry_records_total",
                    ("outcome", "dead_exhausted"),
                )
                && positive(
                    "hookline_deduper_invalid_events_total",
                    ("reason", "not_json"),
                )
            {
                break page.clone();
            }
        }
        assert!(
            start.elapsed() < WAIT,
            "no dead letter / invalid event on /metrics within {WAIT:?}; log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    drop(receiver);
    let (samples, families) = exported(&page);
    let sample_names: BTreeSet<String> = samples.iter().map(|(n, _)| n.clone()).collect();

    let external_text =
        std::fs::read_to_string(root.join("deploy/monitoring/external-metrics.txt"))
            .expect("external-metrics.txt");
    let external: BTreeSet<String> = external_text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();

    let mut problems = Vec::new();
    let mut used_external = BTreeSet::new();
    let mut used_hookline = BTreeSet::new();
    for file in MONITORING_FILES {
        let text = std::fs::read_to_string(root.join(file)).expect("monitoring file");
        let (names, matchers) = referenced(&promql_of(file, &text));
        for name in &names {
            if name.starts_with("hookline_") {
                used_hookline.insert(name.clone());
                if !sample_names.contains(name) && !families.contains(name) {
                    problems.push(format!("{file}: `{name}` is not exported by hookline"));
                }
            } else if external.contains(name) {
                used_external.insert(name.clone());
            } else {
                problems.push(format!(
                    "{file}: `{name}` is neither a hookline metric nor listed in external-metrics.txt"
                ));
            }
        }
        for (name, key, value) in matchers {
            // Added by Prometheus / the PodMonitor, not by the binary.
            if ["namespace", "pod", "job", "instance", "component"].contains(&key.as_str()) {
                continue;
            }
            let found = samples.iter().any(|(n, labels)| {
                n == &name && labels.iter().any(|(k, v)| k == &key && v == &value)
            });
            if !found {
                problems.push(format!(
                    "{file}: `{name}{{{key}=\"{value}\"}}` matches no exported series"
                ));
            }
        }
    }
    for name in external.difference(&used_external) {
        problems.push(format!(
            "external-metrics.txt lists `{name}`, which nothing uses"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The dashboard parses as JSON and the check really saw names.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/monitoring/grafana-dashboard.json"))
            .expect("dashboard"),
    )
    .expect("the Grafana dashboard is valid JSON");
    assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() > 5));
    assert!(used_hookline.len() >= 20, "only {used_hookline:?}");
}

/// The clear admin token docs/deployment.md's "Docker Compose" section gives for the local stack.
fn readme_compose_token(root: &Path) -> String {
    let path = root.join("docs/deployment.md");
    let doc = std::fs::read_to_string(path).expect("docs/deployment.md");
    let section = doc
        .split_once("\n## Docker Compose")
        .map(|(_, rest)| rest.split_once("\n## ").map_or(rest, |(s, _)| s))
        .expect("docs/deployment.md has a \"Docker Compose\" section");
    let start = section
        .find("hlk_")
        .expect("the Docker Compose section gives the stack's admin token");
    let token: String = section[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    assert_eq!(token.len(), 4 + 64, "not a `hookline admin token`: {token}");
    token
}

/// The Compose stack's endpoint secrets key (`HOOKLINE_SECRETS_KEY` in the env file every hookline
/// service of docker-compose.yml reads).
fn compose_secrets_key(root: &Path) -> String {
    let path = root.join("deploy/compose/secrets-key.env");
    let text = std::fs::read_to_string(&path).expect("deploy/compose/secrets-key.env");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("HOOKLINE_SECRETS_KEY="))
        .map(str::to_string)
        .expect("the compose env file sets HOOKLINE_SECRETS_KEY")
}

/// The Compose `admin` service's process: `hookline run admin` with deploy/compose/hookline.toml
/// and the stack's endpoint secrets key (it seeds the config's endpoints, sealed with it),
/// listening on all interfaces as the service does (`HOOKLINE_ADMIN__LISTEN`, here on a free
/// port), with Kafka and the ops port pointed at the test's. It reports ready on `/readyz` (its
/// `admin` probe) once its ingest has read the idempotency claims; the clear token of
/// docs/deployment.md opens the API and publishes an event onto `<p>.events`; another token is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_admin_service_gets_ready_and_the_readme_token_opens_it() {
    require_kafka();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let prefix = unique_prefix("compose-admin");
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    // deploy/compose/hookline.toml's topic plan (3 partitions, its schedule) under a test prefix.
    apply_topics(&test_config(
        &prefix,
        "[retry]\nschedule = [\"0s\", \"5s\", \"15s\", \"30s\"]",
    ))
    .await;
    let token = readme_compose_token(root);
    let key = compose_secrets_key(root);
    let bootstrap = bootstrap();
    let log = dir.join("admin.log");
    let _admin = Hookline::start(
        &root.join("deploy/compose/hookline.toml"),
        &["run", "admin"],
        &[
            ("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", bootstrap.as_str()),
            ("HOOKLINE_TOPICS__PREFIX", prefix.as_str()),
            ("HOOKLINE_SERVER__LISTEN", "127.0.0.1:0"),
            ("HOOKLINE_ADMIN__LISTEN", "0.0.0.0:0"),
            ("HOOKLINE_LOG__FORMAT", "json"),
            ("HOOKLINE_SECRETS_KEY", key.as_str()),
        ],
        &log,
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // Ready on the ops server, as the compose health check and the Kubernetes probe ask.
    let start = Instant::now();
    let (ops, api) = loop {
        let ops = ops_addr(&log);
        let api = logged_addr(&log, "admin api listening");
        if let (Some(ops), Some(api)) = (&ops, &api) {
            if get(&format!("http://{ops}/readyz")).is_some_and(|b| b.trim() == "ready") {
                break (ops.clone(), api.clone());
            }
        }
        assert!(
            start.elapsed() < WAIT,
            "the admin process was not ready within {WAIT:?}; log: {}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        api.starts_with("0.0.0.0:"),
        "listens on all interfaces: {api}"
    );
    let api = api.replacen("0.0.0.0", "127.0.0.1", 1);
    let metrics = get(&format!("http://{ops}/metrics")).expect("/metrics");
    assert!(
        metrics.contains("hookline_ingest_idempotency_keys"),
        "the admin process's metrics are on its ops port"
    );

    let http = reqwest::Client::new();
    let dead_letters = format!("http://{api}/v1/dead-letters");
    let status = |r: Result<reqwest::Response, reqwest::Error>| r.expect("request").status();
    assert_eq!(
        status(http.get(&dead_letters).send().await),
        reqwest::StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status(
            http.get(&dead_letters)
                .bearer_auth(format!("hlk_{}", "0".repeat(64)))
                .send()
                .await
        ),
        reqwest::StatusCode::UNAUTHORIZED
    );
    let listed = http
        .get(&dead_letters)
        .bearer_auth(&token)
        .send()
        .await
        .expect("list dead letters");
    assert_eq!(listed.status(), reqwest::StatusCode::OK, "{}", log_text());
    let body: serde_json::Value = listed.json().await.expect("JSON");
    assert!(body["items"].is_array(), "{body}");

    // The config's endpoints were seeded, sealed with the stack's key, and open with it.
    let endpoints: serde_json::Value = http
        .get(format!("http://{api}/v1/endpoints"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("list endpoints")
        .json()
        .await
        .expect("JSON");
    let items = endpoints["items"].as_array().expect("items");
    let demo = items
        .iter()
        .find(|e| e["id"] == "demo")
        .unwrap_or_else(|| panic!("the compose config's `demo` endpoint: {endpoints}"));
    assert!(
        demo["problem"].is_null() && demo["enabled"] == true && demo["managed_by"] == "file",
        "{demo}"
    );
    assert_eq!(demo["secrets"].as_array().map(Vec::len), Some(1), "{demo}");

    // docs/deployment.md's example publish: 202 and the event on `<p>.events`.
    let published = http
        .post(format!("http://{api}/v1/events"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "try-1")
        .header("content-type", "application/json")
        .body(r#"{"type":"order.paid","data":{"order":1}}"#)
        .send()
        .await
        .expect("publish");
    assert_eq!(
        published.status(),
        reqwest::StatusCode::ACCEPTED,
        "{}",
        log_text()
    );
    let answer: serde_json::Value = published.json().await.expect("JSON");
    let id = answer["id"].as_str().expect("an id").to_string();
    let events = format!("{prefix}.events");
    let has_id = move |records: &[rdkafka::message::OwnedMessage]| {
        records.iter().any(|r| {
            r.payload()
                .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                .is_some_and(|v| v["id"] == id.as_str())
        })
    };
    let found = tokio::task::spawn_blocking(move || has_id(&read_until(&events, WAIT, &has_id)))
        .await
        .expect("reader");
    assert!(found, "the published event is not on <p>.events");
}
