//! Can this process log in to the cluster? The check every Kafka command runs first.
//!
//! librdkafka answers a refused login (a wrong SASL password, a broker certificate signed by a CA
//! the client does not trust, a client certificate the broker refuses) the way it answers a broker
//! that is down: every call fails with "broker transport failure", and the client reconnects
//! forever. The cause is only in its log lines. A stage would then retry its start-up calls for
//! two minutes and stop with a transport error that names nothing to fix.
//!
//! [`check`] connects once with the process's `kafka.options`, reads what librdkafka logs and
//! reports, and tells a refusal (an [`AccessError`]: what was refused, on which listener, with
//! which mechanism, what to change, and an exit code of its own) from a cluster that is only
//! unreachable: that one is left to the stages' outage handling, which waits for it.
//! No option's value is ever part of a message, only their names (and `sasl.username`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};

use crate::config::Config;

/// How long [`check`] waits for a verdict. A refusal is seen within the first connection
/// (~0.1–0.5 s on loopback); a cluster that does not answer at all for this long is an outage,
/// not a refusal, and the process goes on to wait for it.
pub const CHECK_WINDOW: Duration = Duration::from_secs(10);

/// What the cluster refused. Each has its own exit code (10–16): an orchestrator or a deploy
/// script can tell "fix the Secret" from "the cluster is down" (exit 1) and a bad config (2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// SASL credentials rejected (wrong password, unknown user, user without that mechanism).
    SaslCredentials,
    /// The listener does not offer the configured `sasl.mechanism`.
    SaslMechanism,
    /// The broker's certificate is not signed by a CA the client trusts, or is not for that host.
    BrokerCertificateUntrusted,
    /// The listener requires a client certificate and none is configured.
    ClientCertificateMissing,
    /// The configured client certificate was refused (not signed by a CA the broker trusts).
    ClientCertificateRefused,
    /// The configured client certificate is expired (or not valid yet), and the broker refused it.
    ClientCertificateExpired,
    /// `security.protocol` does not match the listener (TLS to a plaintext one or the reverse).
    ProtocolMismatch,
}

impl Refusal {
    pub fn exit_code(self) -> u8 {
        match self {
            Refusal::SaslCredentials => 10,
            Refusal::SaslMechanism => 11,
            Refusal::BrokerCertificateUntrusted => 12,
            Refusal::ClientCertificateMissing => 13,
            Refusal::ClientCertificateRefused => 14,
            Refusal::ClientCertificateExpired => 15,
            Refusal::ProtocolMismatch => 16,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Refusal::SaslCredentials => "SASL authentication failed",
            Refusal::SaslMechanism => "SASL mechanism not enabled on the listener",
            Refusal::BrokerCertificateUntrusted => "the broker's TLS certificate is not trusted",
            Refusal::ClientCertificateMissing => "the listener requires a client certificate",
            Refusal::ClientCertificateRefused => "the broker refused the client certificate",
            Refusal::ClientCertificateExpired => "the client certificate has expired",
            Refusal::ProtocolMismatch => "security.protocol does not match the listener",
        }
    }
}

/// A refused login, said the way an operator fixes it.
#[derive(Debug, Clone)]
pub struct AccessError {
    pub refusal: Refusal,
    /// `SASL_SSL listener 127.0.0.1:9094`: `security.protocol` and `bootstrap.servers`.
    pub listener: String,
    /// `SCRAM-SHA-512 as user "hookline"`, `TLS client certificate /etc/…/client.crt`, …
    pub mechanism: String,
    /// What to change, naming the `kafka.options` keys.
    pub fix: String,
    /// librdkafka's own line (it names no secret).
    pub cause: String,
}

impl AccessError {
    pub fn exit_code(&self) -> u8 {
        self.refusal.exit_code()
    }
}

impl std::fmt::Display for AccessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kafka refused access: {} on the {} ({}). Fix: {}. librdkafka said: {}",
            self.refusal.what(),
            self.listener,
            self.mechanism,
            self.fix,
            self.cause
        )
    }
}

impl std::error::Error for AccessError {}

/// Why [`check`] did not pass.
#[derive(Debug)]
pub enum CheckError {
    /// The cluster answered and refused the login.
    Refused(AccessError),
    /// librdkafka refused the options themselves (a missing file, a bad value): a config error.
    Options(String),
}

/// What one of librdkafka's log or error lines says about access, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    SaslCredentials,
    SaslMechanism,
    BrokerUntrusted,
    ClientCertRejected,
    ProtocolMismatch,
}

fn classify(line: &str) -> Option<Signal> {
    let l = line.to_ascii_lowercase();
    let any = |needles: &[&str]| needles.iter().any(|n| l.contains(n));
    if any(&["unsupported sasl mechanism"]) {
        Some(Signal::SaslMechanism)
    } else if any(&["sasl authentication error", "authentication failed"]) {
        Some(Signal::SaslCredentials)
    } else if any(&[
        "certificate verify failed",
        "broker certificate could not be verified",
    ]) {
        Some(Signal::BrokerUntrusted)
    } else if any(&[
        "alert bad certificate",
        "alert number 42",
        "alert certificate unknown",
        "alert number 46",
        "alert certificate expired",
        "alert number 45",
        "alert certificate required",
        "alert number 116",
        "alert unknown ca",
        "alert number 48",
    ]) {
        Some(Signal::ClientCertRejected)
    } else if any(&[
        "incorrect security.protocol",
        "connecting to a plaintext broker listener",
        "wrong version number",
        "packet length too long",
    ]) || (l.contains("disconnected") && l.contains("in state apiversion_query"))
    {
        // The last: a TLS listener closes a plaintext client's first request unanswered.
        Some(Signal::ProtocolMismatch)
    } else {
        None
    }
}

/// N of librdkafka's "N identical error(s) suppressed"; 0 when the line has none.
fn suppressed(line: &str) -> u32 {
    line.find(" identical error(s) suppressed")
        .and_then(|end| {
            let digits = line[..end].rsplit(|c: char| !c.is_ascii_digit()).next()?;
            digits.parse().ok()
        })
        .unwrap_or(0)
}

/// The client context of the check: keeps the first line of each access signal.
#[derive(Default)]
struct Capture {
    seen: Mutex<Vec<(Signal, String, u32)>>,
}

impl Capture {
    /// Counts a log line's signal: the line itself and the identical ones librdkafka folded
    /// into it ("…, 5 identical error(s) suppressed)").
    fn note(&self, line: &str) {
        self.add(line, 1 + suppressed(line));
    }

    /// An error callback's reason: the same event as a log line, so it only names the signal.
    fn note_error(&self, reason: &str) {
        self.add(reason, 0);
    }

    fn add(&self, line: &str, count: u32) {
        let Some(signal) = classify(line) else {
            return;
        };
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.iter_mut().find(|(s, _, _)| *s == signal) {
            Some((_, _, n)) => *n += count,
            None => seen.push((signal, line.trim().to_string(), count.max(1))),
        }
    }

    /// A definite signal: any login refusal at once; a protocol mismatch once seen three times
    /// (~1 s: one connection closed during the version handshake can be a broker going down).
    fn verdict(&self) -> Option<(Signal, String)> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter()
            .find(|(s, _, n)| *s != Signal::ProtocolMismatch || *n >= 3)
            .map(|(s, line, _)| (*s, line.clone()))
    }
}

impl ClientContext for Capture {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        tracing::debug!(
            ?level,
            fac,
            message = log_message,
            "librdkafka (access check)"
        );
        self.note(log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, reason, "librdkafka error (access check)");
        self.note_error(reason);
    }
}

/// Nothing is produced: a producer only because its `poll` serves the error callbacks.
impl ProducerContext for Capture {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// Connects with the process's `kafka.options` and waits (up to [`CHECK_WINDOW`]) until the
/// cluster answers a metadata request (Ok), refuses the login ([`CheckError::Refused`]), or
/// stays unreachable (Ok: the stages wait for an outage by themselves). Blocking; run it on a
/// blocking thread.
pub fn check(config: &Config) -> Result<(), CheckError> {
    check_within(config, CHECK_WINDOW)
}

pub fn check_within(config: &Config, window: Duration) -> Result<(), CheckError> {
    let mut client_config: ClientConfig = super::base_config(config);
    // Reconnect quickly: a refusal is only seen on a connection attempt.
    client_config
        .set("reconnect.backoff.ms", "100")
        .set("reconnect.backoff.max.ms", "500")
        .set("client.id", "hookline-access-check");
    let producer: BaseProducer<Capture> = client_config
        .create_with_context(Capture::default())
        .map_err(|e| CheckError::Options(options_error(&e)))?;
    let started = Instant::now();
    loop {
        let answered = producer
            .client()
            .fetch_metadata(None, Duration::from_millis(500))
            .is_ok();
        // Serves the error callbacks.
        producer.poll(Duration::ZERO);
        if answered {
            return Ok(());
        }
        if let Some((signal, line)) = producer.context().verdict() {
            return Err(CheckError::Refused(explain(config, signal, line)));
        }
        if started.elapsed() >= window {
            tracing::warn!(
                bootstrap = %config.kafka.bootstrap_servers,
                waited_s = window.as_secs(),
                "kafka did not answer the access check; going on (the stages wait for it)"
            );
            return Ok(());
        }
    }
}

fn options_error(e: &KafkaError) -> String {
    match e {
        KafkaError::ClientCreation(msg) => format!("kafka.options: {msg}"),
        other => format!("kafka.options: {other}"),
    }
}

fn option<'a>(config: &'a Config, key: &str) -> Option<&'a str> {
    config.kafka.options.get(key).map(String::as_str)
}

/// The refusal named for the operator: listener, mechanism, the fix in `kafka.options` terms.
fn explain(config: &Config, signal: Signal, cause: String) -> AccessError {
    let protocol = option(config, "security.protocol")
        .unwrap_or("plaintext")
        .to_ascii_uppercase();
    let listener = format!(
        "{protocol} listener at {}",
        config.kafka.bootstrap_servers.trim()
    );
    let sasl = protocol.starts_with("SASL");
    let tls = protocol.ends_with("SSL");
    let sasl_mechanism = option(config, "sasl.mechanism")
        .or(option(config, "sasl.mechanisms"))
        .unwrap_or("GSSAPI");
    let certificate = option(config, "ssl.certificate.location").map(str::to_string);
    let has_certificate = certificate.is_some() || option(config, "ssl.certificate.pem").is_some();
    let mechanism = match (sasl, tls) {
        (true, _) => match option(config, "sasl.username") {
            Some(user) => format!("SASL {sasl_mechanism} as user {user:?}"),
            None => format!("SASL {sasl_mechanism}, no sasl.username set"),
        },
        (false, true) => match &certificate {
            Some(path) => format!("TLS with client certificate {path}"),
            None if has_certificate => {
                "TLS with the client certificate of ssl.certificate.pem".into()
            }
            None => "TLS without a client certificate".into(),
        },
        (false, false) => "no authentication".into(),
    };
    let ca = match option(config, "ssl.ca.location") {
        Some(path) => format!("ssl.ca.location ({path})"),
        None => "ssl.ca.location (unset: the system's CA store was used)".into(),
    };
    let (refusal, fix) = match signal {
        Signal::SaslCredentials => (
            Refusal::SaslCredentials,
            format!(
                "check sasl.username and sasl.password (the user must exist on the cluster with \
                 {sasl_mechanism} credentials); if the password was rotated, update the Secret \
                 holding HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD and restart"
            ),
        ),
        Signal::SaslMechanism => (
            Refusal::SaslMechanism,
            format!(
                "set sasl.mechanism to one the listener enables (it refused {sasl_mechanism}; \
                 MSK and Confluent Cloud use SCRAM-SHA-512 or PLAIN, see docs/deployment.md)"
            ),
        ),
        Signal::BrokerUntrusted => (
            Refusal::BrokerCertificateUntrusted,
            format!(
                "point {ca} at the PEM of the CA that signed the broker's certificate, and check \
                 that bootstrap.servers uses a host name the certificate is for \
                 (ssl.endpoint.identification.algorithm=https checks it)"
            ),
        ),
        Signal::ClientCertRejected if !has_certificate => (
            Refusal::ClientCertificateMissing,
            "set ssl.certificate.location and ssl.key.location to a client certificate signed by \
             a CA the listener trusts (and ssl.key.password if the key is encrypted)"
                .into(),
        ),
        Signal::ClientCertRejected => match certificate.as_deref().and_then(expired_since) {
            Some(not_after) => (
                Refusal::ClientCertificateExpired,
                format!(
                    "renew the certificate at ssl.certificate.location (valid until {not_after}) \
                     and restart; cert-manager renews it in the Secret by itself"
                ),
            ),
            None => (
                Refusal::ClientCertificateRefused,
                "use a client certificate signed by a CA the listener trusts (its \
                 ssl.truststore), set in ssl.certificate.location and ssl.key.location"
                    .into(),
            ),
        },
        Signal::ProtocolMismatch => (
            Refusal::ProtocolMismatch,
            format!(
                "set security.protocol to what the listener at {} speaks (PLAINTEXT, SSL, \
                 SASL_PLAINTEXT or SASL_SSL; it is {protocol} now), or use that listener's port",
                config.kafka.bootstrap_servers.trim()
            ),
        ),
    };
    AccessError {
        refusal,
        listener,
        mechanism,
        fix,
        cause,
    }
}

/// The certificate's "not after" if the PEM file's first certificate is not valid now (expired,
/// or not valid yet); None when it is valid or cannot be read.
fn expired_since(path: &str) -> Option<String> {
    let pem = std::fs::read(path).ok()?;
    let cert = openssl::x509::X509::from_pem(&pem).ok()?;
    let now = openssl::asn1::Asn1Time::days_from_now(0).ok()?;
    let expired = cert.not_after() < now;
    let early = cert.not_before() > now;
    (expired || early).then(|| {
        if early {
            format!("{}, valid from {}", cert.not_after(), cert.not_before())
        } else {
            cert.not_after().to_string()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn librdkafka_lines_are_classified() {
        let cases = [
            ("127.0.0.1:9094/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512", Some(Signal::SaslCredentials)),
            ("SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root CA certificates are installed", Some(Signal::BrokerUntrusted)),
            ("Receive failed: error:0A000412:SSL routines::ssl/tls alert bad certificate: SSL alert number 42", Some(Signal::ClientCertRejected)),
            ("Receive failed: ssl/tls alert certificate unknown: SSL alert number 46", Some(Signal::ClientCertRejected)),
            ("Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol configuration (connecting to a SSL listener?)", Some(Signal::ProtocolMismatch)),
            ("SSL handshake failed: Disconnected: SSL connection closed by peer: connecting to a PLAINTEXT broker listener? (after 12ms in state SSL_HANDSHAKE)", Some(Signal::ProtocolMismatch)),
            ("Disconnected: connection closed by peer: receive 0 after POLLIN (after 1ms in state APIVERSION_QUERY)", Some(Signal::ProtocolMismatch)),
            ("Connect to ipv4#127.0.0.1:9094 failed: Connection refused", None),
            ("1/1 brokers are down", None),
        ];
        for (line, want) in cases {
            assert_eq!(classify(line), want, "{line}");
        }
    }

    #[test]
    fn a_protocol_mismatch_needs_three_lines_a_refusal_one() {
        let c = Capture::default();
        let closed =
            "127.0.0.1:9093/bootstrap: Disconnected: connection closed by peer: receive 0 \
                      after POLLIN (after 1ms in state APIVERSION_QUERY)";
        c.note(closed);
        c.note_error(closed);
        assert!(
            c.verdict().is_none(),
            "an error callback repeats a logged line"
        );
        c.note(closed);
        assert!(c.verdict().is_none());
        c.note(closed);
        assert!(c.verdict().is_some());
        // librdkafka folds repeats into the next line.
        let c = Capture::default();
        c.note(closed);
        c.note(
            "Disconnected: connection closed by peer: receive 0 after POLLIN (after 1ms in \
                state APIVERSION_QUERY, 1 identical error(s) suppressed)",
        );
        assert_eq!(c.verdict().map(|v| v.0), Some(Signal::ProtocolMismatch));
        let c = Capture::default();
        c.note("SASL authentication error: Authentication failed");
        assert_eq!(c.verdict().map(|v| v.0), Some(Signal::SaslCredentials));
    }

    #[test]
    fn exit_codes_are_distinct() {
        let all = [
            Refusal::SaslCredentials,
            Refusal::SaslMechanism,
            Refusal::BrokerCertificateUntrusted,
            Refusal::ClientCertificateMissing,
            Refusal::ClientCertificateRefused,
            Refusal::ClientCertificateExpired,
            Refusal::ProtocolMismatch,
        ];
        let mut codes: Vec<u8> = all.iter().map(|r| r.exit_code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        assert!(codes.iter().all(|c| (10..=16).contains(c)));
    }
}
