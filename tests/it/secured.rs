//! hookline against a Kafka that demands credentials (issue 34, part 1). A broker of the test's
//! own, from deploy/local/kafka's secured mode: a `SASL_SSL` listener (SCRAM-SHA-512, the user
//! made at format time) and an `SSL` listener that requires a client certificate, with a CA and
//! certificates made by deploy/local/kafka-tls in the broker's data dir.
//!
//! Through each listener: `topics apply`, `run all` delivering (and dead-lettering), `run admin`
//! publishing over HTTP, `endpoints list`, `dead list`, `replay`, `trace`. Then each bad
//! credential — wrong password, unknown CA, missing, refused and expired client certificate, the
//! wrong protocol — stops `run all` (and a tool) within seconds with its own exit code and a
//! message naming the listener, the mechanism and the fix; no secret appears in any output.
//! The test's own producer and readers use the broker's plaintext listener.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::receiver::{Behavior, Receiver};
use crate::resilience::{free_port, produce_ids, read_from, DedicatedBroker};

const USER: &str = "hookline";

/// The secured broker and what a client needs to reach it.
struct Secured {
    broker: DedicatedBroker,
    sasl_port: u16,
    ssl_port: u16,
    password: String,
    tls: PathBuf,
}

impl Secured {
    fn start() -> Secured {
        let mut ports = Vec::new();
        while ports.len() < 2 {
            let p = free_port();
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        // Random: the logs are searched for it.
        let password = format!("pw-{}", &unique_prefix("s")[2..].replace('-', ""));
        let broker = DedicatedBroker::start_with(
            "secured",
            vec![
                ("KAFKA_SASL_SSL_PORT".into(), ports[0].to_string()),
                ("KAFKA_SSL_PORT".into(), ports[1].to_string()),
                ("KAFKA_SCRAM_USERS".into(), format!("{USER}={password}")),
            ],
        );
        let tls = broker.data_dir().join("tls");
        Secured {
            broker,
            sasl_port: ports[0],
            ssl_port: ports[1],
            password,
            tls,
        }
    }

    fn file(&self, name: &str) -> String {
        self.tls.join(name).display().to_string()
    }

    /// `[kafka]` of a client of the SASL_SSL listener (the password comes from the environment).
    fn sasl_kafka(&self, ca: &str) -> String {
        format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:{}\"\n[kafka.options]\n\
             \"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanism\" = \"SCRAM-SHA-512\"\n\
             \"sasl.username\" = \"{USER}\"\n\"ssl.ca.location\" = \"{}\"\n",
            self.sasl_port,
            self.file(ca)
        )
    }

    /// `[kafka]` of a client of the SSL listener with the client certificate `cert` (none: "").
    fn ssl_kafka(&self, cert: &str) -> String {
        let mut s = format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:{}\"\n[kafka.options]\n\
             \"security.protocol\" = \"SSL\"\n\"ssl.ca.location\" = \"{}\"\n",
            self.ssl_port,
            self.file("ca.crt")
        );
        if !cert.is_empty() {
            s.push_str(&format!(
                "\"ssl.certificate.location\" = \"{}\"\n\"ssl.key.location\" = \"{}\"\n",
                self.file(&format!("{cert}.crt")),
                self.file(&format!("{cert}.key"))
            ));
        }
        s
    }
}

/// A `hookline` command with a clean `HOOKLINE_*` environment plus `env`.
fn hookline(config: &Path, env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HOOKLINE_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.arg("--config")
        .arg(config)
        .args(args)
        .env("HOOKLINE_SECRETS_KEY", secrets_key())
        .envs(env.iter().copied());
    cmd
}

async fn run(config: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = hookline(config, env, args);
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("thread")
        .expect("run hookline")
}

/// stdout of a command that must succeed; stdout and stderr must not hold `secret`.
async fn ok(config: &Path, env: &[(&str, &str)], args: &[&str], secret: &str) -> String {
    let out = run(config, env, args).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "hookline {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        !stdout.contains(secret) && !stderr.contains(secret),
        "hookline {args:?} printed the secret"
    );
    stdout
}

fn config_file(dir: &Path, name: &str, kafka: &str, rest: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{kafka}\n{rest}")).expect("write config");
    path
}

/// Until `log` holds the JSON line `message` (its `addr`), or panics with the log.
pub(crate) async fn wait_logged(log: &Path, message: &str, child: &mut Hookline) -> String {
    let start = Instant::now();
    loop {
        if let Some(addr) = logged_addr(log, message) {
            return addr;
        }
        if let Some(status) = child.child.try_wait().expect("try_wait") {
            panic!(
                "exited ({status}) before logging {message:?}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no {message:?} in 60 s:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Everything hookline does, through one secured listener.
async fn through_listener(s: &Secured, name: &str, kafka: &str, env: &[(&str, &str)]) {
    let prefix = unique_prefix(&format!("sec-{name}"));
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("dir");
    let rx = Receiver::start().await;
    rx.default("bad", Behavior::Status(500));
    let token = hookline_admin::auth::generate();
    let hash = hookline_admin::auth::hex(&hookline_admin::auth::sha256(&token));
    let rest = format!(
        "[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[admin.tokens]]\nname = \"test\"\nsha256 = \"{hash}\"\nscope = \"admin\"\n\
         [http]\nallow_cidrs = [\"127.0.0.0/8\"]\n[log]\nlevel = \"info\"\nformat = \"json\"\n\
         [retry]\nschedule = [\"0s\", \"1s\", \"2s\"]\n\
         [[endpoints]]\nid = \"ok\"\nurl = \"{}\"\n[[endpoints]]\nid = \"bad\"\nurl = \"{}\"\n",
        rx.url("ok"),
        rx.url("bad")
    );
    let config = config_file(&dir, "hookline.toml", kafka, &rest);
    let secret = s.password.as_str();

    let out = ok(&config, env, &["topics", "apply"], secret).await;
    assert!(out.contains(&format!("created   {prefix}.events")), "{out}");

    let all_log = dir.join("run-all.log");
    let mut all = Hookline::start(&config, &["run", "all"], env, &all_log);
    wait_logged(&all_log, "admin api listening", &mut all).await;
    let ids: Vec<String> = (0..20).map(|i| format!("{name}-{i:02}")).collect();
    produce_ids(&s.broker.bootstrap(), &format!("{prefix}.events"), &ids).await;
    let got = rx.wait_for("ok", ids.len(), Duration::from_secs(60)).await;
    assert_eq!(got.len(), ids.len(), "every event delivered through {name}");
    // `bad` fails three times: 20 dead letters.
    let dead = read_from(
        &s.broker.bootstrap(),
        &format!("{prefix}.dlq"),
        Duration::from_secs(60),
        |r| r.len() >= ids.len(),
    );
    assert_eq!(dead.len(), ids.len(), "every `bad` delivery dead");

    // `run admin`, its own process: publishes over HTTP through the listener.
    let admin_log = dir.join("run-admin.log");
    let mut admin = Hookline::start(&config, &["run", "admin"], env, &admin_log);
    let api = wait_logged(&admin_log, "admin api listening", &mut admin).await;
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("http://{api}/v1/events"))
        .bearer_auth(&token)
        .json(&serde_json::json!({"id": format!("{name}-api"), "type": "order.paid", "data": {}}))
        .send()
        .await
        .expect("POST /v1/events");
    assert_eq!(answer.status(), 202, "{:?}", answer.text().await);
    let got = rx
        .wait_for("ok", ids.len() + 1, Duration::from_secs(60))
        .await;
    assert!(
        got.iter()
            .any(|r| r.headers["webhook-id"] == format!("{name}-api")),
        "the event published through `run admin` was delivered"
    );
    let endpoints = http
        .get(format!("http://{api}/v1/endpoints"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("GET /v1/endpoints");
    assert_eq!(endpoints.status(), 200);

    let list = ok(&config, env, &["endpoints", "list"], secret).await;
    assert!(list.contains("ok") && list.contains("bad"), "{list}");
    let listed = ok(&config, env, &["dead", "list", "--endpoint", "bad"], secret).await;
    for id in &ids {
        assert!(
            listed.contains(id.as_str()),
            "dead list lacks {id}:\n{listed}"
        );
    }
    let trace = ok(&config, env, &["trace", &ids[0]], secret).await;
    assert!(
        trace.contains("ok") && trace.contains("bad") && trace.contains("500"),
        "{trace}"
    );
    rx.default("bad", Behavior::Status(200));
    let replayed = ok(&config, env, &["replay", "--endpoint", "bad"], secret).await;
    assert!(
        replayed.contains(&format!("{} delivered", ids.len())),
        "{replayed}"
    );
    let bad_ok = rx
        .requests("bad")
        .iter()
        .filter(|r| r.headers.contains_key("webhook-id"))
        .count();
    assert!(bad_ok >= ids.len() * 4, "3 failed attempts + 1 replay each");

    for (child, log) in [(&mut all, &all_log), (&mut admin, &admin_log)] {
        assert!(
            child.child.try_wait().expect("try_wait").is_none(),
            "still running"
        );
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            !text.contains(secret),
            "{} holds the password",
            log.display()
        );
        assert!(!text.contains("kafka refused access"), "{}", log.display());
    }
    println!(
        "secured: {name}: {} delivered, {} dead and replayed, run admin published",
        ids.len(),
        ids.len()
    );
}

/// A bad credential: `args` exits within seconds with `code`, and stderr names everything in
/// `says`; neither the real nor the given password is printed.
async fn refused(
    s: &Secured,
    case: &str,
    kafka: &str,
    env: &[(&str, &str)],
    args: &[&str],
    code: i32,
    says: &[&str],
) -> String {
    let prefix = unique_prefix(&format!("refused-{case}"));
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("dir");
    let rest = format!(
        "[topics]\nprefix = \"{prefix}\"\npartitions = 3\n[server]\nlisten = \"127.0.0.1:0\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n[log]\nlevel = \"debug\"\n"
    );
    let config = config_file(&dir, "hookline.toml", kafka, &rest);
    let started = Instant::now();
    let out = run(&config, env, args).await;
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{case}: hookline {args:?} exit code\n{stderr}"
    );
    assert!(
        took < Duration::from_secs(8),
        "{case}: took {took:?} to stop"
    );
    for needle in says {
        assert!(
            stderr.contains(needle),
            "{case}: the error does not say {needle:?}:\n{stderr}"
        );
    }
    let mut secrets = vec![s.password.as_str()];
    secrets.extend(env.iter().map(|(_, v)| *v));
    for secret in secrets {
        assert!(
            !stderr.contains(secret) && !stdout.contains(secret),
            "{case}: a password was printed"
        );
    }
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: kafka refused access"))
        .unwrap_or_default()
        .to_string();
    println!("secured: {case}: exit {code} in {took:?}: {line}");
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_runs_through_sasl_ssl_and_mtls_and_bad_credentials_stop_it_named() {
    let s = Secured::start();
    let pw = [(
        "HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD",
        s.password.as_str(),
    )];
    let sasl = s.sasl_kafka("ca.crt");
    let mtls = s.ssl_kafka("client");
    through_listener(&s, "sasl", &sasl, &pw).await;
    through_listener(&s, "mtls", &mtls, &[]).await;

    let sasl_listener = format!("SASL_SSL listener at 127.0.0.1:{}", s.sasl_port);
    let ssl_listener = format!("SSL listener at 127.0.0.1:{}", s.ssl_port);
    let wrong = [(
        "HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD",
        "not-the-password-42",
    )];
    for args in [&["run", "all"][..], &["endpoints", "list"][..]] {
        refused(
            &s,
            "wrong-password",
            &sasl,
            &wrong,
            args,
            10,
            &[
                &sasl_listener,
                "SASL SCRAM-SHA-512 as user \"hookline\"",
                "sasl.password",
            ],
        )
        .await;
    }
    refused(
        &s,
        "unknown-ca",
        &s.sasl_kafka("other-ca.crt"),
        &pw,
        &["run", "all"],
        12,
        &[&sasl_listener, "not trusted", "ssl.ca.location"],
    )
    .await;
    refused(
        &s,
        "missing-client-cert",
        &s.ssl_kafka(""),
        &[],
        &["run", "all"],
        13,
        &[
            &ssl_listener,
            "without a client certificate",
            "ssl.certificate.location",
        ],
    )
    .await;
    refused(
        &s,
        "other-ca-client-cert",
        &s.ssl_kafka("other-client"),
        &[],
        &["run", "all"],
        14,
        &[
            &ssl_listener,
            "other-client.crt",
            "refused the client certificate",
        ],
    )
    .await;
    refused(
        &s,
        "expired-client-cert",
        &s.ssl_kafka("expired-client"),
        &[],
        &["run", "all"],
        15,
        &[&ssl_listener, "expired-client.crt", "has expired", "renew"],
    )
    .await;
    // A plaintext client of the SSL listener.
    refused(
        &s,
        "plaintext-to-tls",
        &format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:{}\"\n",
            s.ssl_port
        ),
        &[],
        &["run", "all"],
        16,
        &[
            "PLAINTEXT listener at",
            "does not match the listener",
            "security.protocol",
        ],
    )
    .await;
    drop(s);
}
