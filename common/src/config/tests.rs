//! Unit tests of loading, defaults, validation and environment overrides.

use super::env::OVERRIDE_SECTIONS;
use super::*;

const MIN: &str = "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_with_env(text, "test.toml", Vec::new())
}

fn field_of(err: ConfigError) -> String {
    match err {
        ConfigError::Field { field, .. } => field,
        other => panic!("expected a field error, got {other}"),
    }
}

#[test]
fn minimal_config_gets_spec_defaults() {
    let c = load(MIN).expect("minimal config");
    assert_eq!(c.topics.prefix, "webhooks");
    assert_eq!(c.http.timeout, Duration::from_secs(10));
    assert_eq!(c.dedupe.window, Duration::from_secs(86_400));
    let names: Vec<String> = c.retry.schedule[1..]
        .iter()
        .map(|d| tier_name(*d))
        .collect();
    assert_eq!(names, ["1m", "5m", "30m", "2h", "6h", "24h"]);
}

#[test]
fn example_file_is_valid() {
    let text = include_str!("../../../config/hookline.example.toml");
    load(text).expect("example config must validate");
}

#[test]
fn unknown_key_names_the_field() {
    let err = load(&format!("{MIN}[topics]\npartitons = 3\n")).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("topics"), "{msg}");
    assert!(msg.contains("partitons"), "{msg}");
}

#[test]
fn bad_values_name_the_field() {
    let cases = [
        ("[topics]\npartitions = 0\n", "topics.partitions"),
        ("[topics]\npartitions = \"six\"\n", "topics.partitions"),
        ("[http]\ntimeout = \"ten seconds\"\n", "http.timeout"),
        ("[retry]\nschedule = [\"1m\"]\n", "retry.schedule[0]"),
        ("[retry]\nschedule = [\"0s\", \"5m\", \"1m\"]\n", "retry.schedule[2]"),
        ("[http]\nallow_cidrs = [\"localhost\"]\n", "http.allow_cidrs[0]"),
        (
            "[[endpoints]]\nid = \"a\"\nurl = \"ftp://x\"\n",
            "endpoints[0].url",
        ),
        (
            "[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\nsecrets = [\"nope\"]\n",
            "endpoints[0].secrets[0]",
        ),
        (
            "[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\n[[endpoints]]\nid = \"a\"\nurl = \"https://y\"\n",
            "endpoints[1].id",
        ),
        (
            "[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\nfilter = \"data.amount >\"\n",
            "endpoints[0].filter",
        ),
        (
            "[[dedupe.keys]]\ntype = \"call.*\"\npointers = [\"data/callId\"]\n",
            "dedupe.keys[0].pointers[0]",
        ),
    ];
    for (extra, field) in cases {
        let err = load(&format!("{MIN}{extra}")).expect_err(extra);
        assert_eq!(field_of(err), field, "for {extra:?}");
    }
}

#[test]
fn min_insync_replicas_defaults_to_two_from_replication_three() {
    let isr = |extra: &str| {
        load(&format!("{MIN}[topics]\n{extra}"))
            .expect(extra)
            .topics
            .min_insync_replicas()
    };
    assert_eq!(isr(""), 1, "default replication factor 1");
    assert_eq!(isr("replication_factor = 2\n"), 1);
    assert_eq!(isr("replication_factor = 3\n"), 2);
    assert_eq!(isr("replication_factor = 5\n"), 2);
    assert_eq!(isr("replication_factor = 5\nmin_insync_replicas = 3\n"), 3);
    assert_eq!(isr("replication_factor = 3\nmin_insync_replicas = 1\n"), 1);
    for bad in [
        "replication_factor = 3\nmin_insync_replicas = 4\n",
        "min_insync_replicas = 2\n",
        "replication_factor = 3\nmin_insync_replicas = 0\n",
    ] {
        let err = load(&format!("{MIN}[topics]\n{bad}")).expect_err(bad);
        assert_eq!(field_of(err), "topics.min_insync_replicas", "{bad}");
    }
}

#[test]
fn env_overrides_apply_and_are_typed() {
    let env = vec![
        ("HOOKLINE_TOPICS__PARTITIONS".to_string(), "12".to_string()),
        ("HOOKLINE_TOPICS__PREFIX".to_string(), "t1".to_string()),
        (
            "HOOKLINE_RETRY__SCHEDULE".to_string(),
            "[\"0s\", \"2s\"]".to_string(),
        ),
        (
            "HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD".to_string(),
            "123".to_string(),
        ),
        ("HOOKLINE_CONFIG".to_string(), "ignored".to_string()),
        ("HOOKLINE_TEST_KAFKA".to_string(), "ignored".to_string()),
    ];
    let c = Config::from_toml_with_env(MIN, "t", env).expect("overrides");
    assert_eq!(c.topics.partitions, 12);
    assert_eq!(c.topics.prefix, "t1");
    assert_eq!(c.retry.schedule.len(), 2);
    assert_eq!(c.kafka.options["sasl.password"], "123");
    let debug = format!("{:?}", c.kafka);
    assert!(
        debug.contains("sasl.password") && !debug.contains("123"),
        "{debug}"
    );
}

#[test]
fn env_override_of_unknown_key_is_rejected() {
    let env = vec![("HOOKLINE_TOPICS__NOPE".to_string(), "1".to_string())];
    let err = Config::from_toml_with_env(MIN, "t", env).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn env_override_without_double_underscore_is_rejected() {
    let env = vec![(
        "HOOKLINE_KAFKA_BOOTSTRAP_SERVERS".to_string(),
        "x:1".to_string(),
    )];
    let err = Config::from_toml_with_env(MIN, "t", env).unwrap_err();
    assert!(
        err.to_string().contains("HOOKLINE_KAFKA_BOOTSTRAP_SERVERS"),
        "{err}"
    );
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What Kubernetes injects into every pod of a namespace with Services `hookline` (ports
/// 9464/TCP named `metrics`) and `hookline-admin` / `hookline-dispatcher`.
const SERVICE_LINKS: &[(&str, &str)] = &[
    ("HOOKLINE_SERVICE_HOST", "10.0.0.11"),
    ("HOOKLINE_SERVICE_PORT", "9464"),
    ("HOOKLINE_SERVICE_PORT_METRICS", "9464"),
    ("HOOKLINE_PORT", "tcp://10.0.0.11:9464"),
    ("HOOKLINE_PORT_9464_TCP", "tcp://10.0.0.11:9464"),
    ("HOOKLINE_PORT_9464_TCP_PROTO", "tcp"),
    ("HOOKLINE_PORT_9464_TCP_PORT", "9464"),
    ("HOOKLINE_PORT_9464_TCP_ADDR", "10.0.0.11"),
    ("HOOKLINE_ADMIN_SERVICE_HOST", "10.0.0.12"),
    ("HOOKLINE_ADMIN_SERVICE_PORT", "8080"),
    ("HOOKLINE_ADMIN_SERVICE_PORT_HTTP_API", "8080"),
    ("HOOKLINE_ADMIN_PORT", "tcp://10.0.0.12:8080"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP", "tcp://10.0.0.12:8080"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP_PROTO", "tcp"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP_PORT", "8080"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP_ADDR", "10.0.0.12"),
    ("HOOKLINE_DISPATCHER_SERVICE_HOST", "10.0.0.13"),
    ("HOOKLINE_DISPATCHER_PORT_9464_UDP_ADDR", "10.0.0.13"),
    (
        "HOOKLINE_DISPATCHER_PORT_9464_SCTP",
        "sctp://10.0.0.13:9464",
    ),
];

#[test]
fn kubernetes_service_links_are_ignored_and_named() {
    let mut vars = env(SERVICE_LINKS);
    vars.push(("HOOKLINE_TOPICS__PARTITIONS".into(), "12".into()));
    let c = Config::from_toml_with_env(MIN, "t", vars).expect("service links are not errors");
    assert_eq!(c.topics.partitions, 12, "real overrides still apply");
    let mut want: Vec<String> = SERVICE_LINKS.iter().map(|(k, _)| k.to_string()).collect();
    want.sort();
    assert_eq!(c.ignored_env, want);
}

#[test]
fn mistyped_override_names_the_intended_key() {
    let cases = [
        (
            "HOOKLINE_KAFKA_BOOTSTRAP_SERVERS",
            "HOOKLINE_KAFKA__BOOTSTRAP_SERVERS",
        ),
        ("HOOKLINE_TOPICS_PARTITIONS", "HOOKLINE_TOPICS__PARTITIONS"),
        (
            "HOOKLINE_KAFKA_OPTIONS_SASL_PASSWORD",
            "HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD",
        ),
        ("HOOKLINE_SERVER_LISTEN", "HOOKLINE_SERVER__LISTEN"),
    ];
    for (typed, intended) in cases {
        let err = Config::from_toml_with_env(MIN, "t", env(&[(typed, "1")]))
            .expect_err(typed)
            .to_string();
        assert!(err.contains(typed), "{typed}: {err}");
        assert!(
            err.contains(&format!("did you mean {intended}")),
            "{typed}: {err}"
        );
    }
    // Not a service link and not a section: still an error, without a guess.
    let err = Config::from_toml_with_env(MIN, "t", env(&[("HOOKLINE_NOPE", "1")]))
        .expect_err("unknown variable");
    assert!(err.to_string().contains("HOOKLINE_NOPE"), "{err}");
}

#[test]
fn override_sections_are_real_sections() {
    // MIN opens `[kafka]` already; every other section must be accepted as an empty table.
    for section in OVERRIDE_SECTIONS.iter().filter(|s| **s != "kafka") {
        load(&format!("{MIN}[{section}]\n"))
            .unwrap_or_else(|e| panic!("`{section}` is not a config section: {e}"));
    }
}

#[test]
fn secrets_are_not_in_debug_output() {
    let c = load(&format!(
        "{MIN}[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n"
    ))
    .expect("valid");
    let dbg = format!("{:?}", c.endpoints[0]);
    assert!(!dbg.contains("MfKQ9r8"), "{dbg}");
}

#[test]
fn custom_headers_are_checked_naming_the_field() {
    let ep = |headers: &str| {
        format!("{MIN}[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\nheaders = [{headers}]\n")
    };
    let c = load(&ep(
        r#"{ name = "X-Api-Key", value = "k1" }, { name = "Authorization", value = "Bearer tok-123", secret = true }"#,
    ))
    .expect("valid");
    let h = &c.endpoints[0].headers;
    assert_eq!(h[0].name.as_str(), "x-api-key");
    assert_eq!((h[0].value_text(), h[0].secret), ("k1", false));
    assert_eq!((h[1].value_text(), h[1].secret), ("Bearer tok-123", true));
    let dbg = format!("{:?}", c.endpoints[0]);
    assert!(dbg.contains("k1") && !dbg.contains("tok-123"), "{dbg}");

    let big = "v".repeat(4000);
    let cases = [
        (
            r#"{ name = "Webhook-Id", value = "x" }"#.to_string(),
            "endpoints[0].headers[0].name",
        ),
        (
            r#"{ name = "content-type", value = "x" }"#.into(),
            "endpoints[0].headers[0].name",
        ),
        (
            r#"{ name = "Host", value = "x" }"#.into(),
            "endpoints[0].headers[0].name",
        ),
        (
            r#"{ name = "Transfer-Encoding", value = "x" }"#.into(),
            "endpoints[0].headers[0].name",
        ),
        (
            r#"{ name = "Connection", value = "x" }"#.into(),
            "endpoints[0].headers[0].name",
        ),
        (
            r#"{ name = "bad name", value = "x" }"#.into(),
            "endpoints[0].headers[0].name",
        ),
        (
            r#"{ name = "X-A", value = "x" }, { name = "X-B", value = "a\r\nEvil: 1" }"#.into(),
            "endpoints[0].headers[1].value",
        ),
        (
            r#"{ name = "X-A", value = "x" }, { name = "x-a", value = "y" }"#.into(),
            "endpoints[0].headers[1].name",
        ),
        (
            r#"{ name = "X-A", value = "x", sekret = true }"#.into(),
            "endpoints[0].headers[0].sekret",
        ),
        (
            format!(
                r#"{{ name = "X-A", value = "{big}" }}, {{ name = "X-B", value = "{big}" }}, {{ name = "X-C", value = "{big}" }}"#
            ),
            "endpoints[0].headers",
        ),
    ];
    for (headers, field) in cases {
        let err = load(&ep(&headers)).expect_err(&headers);
        let msg = err.to_string();
        assert_eq!(field_of(err), field, "for {headers}: {msg}");
        assert!(!msg.contains("Evil"), "the value is not echoed: {msg}");
    }
}

#[test]
fn tier_names() {
    assert_eq!(tier_name(Duration::from_secs(60)), "1m");
    assert_eq!(tier_name(Duration::from_secs(86_400)), "24h");
    assert_eq!(tier_name(Duration::from_secs(3)), "3s");
    assert_eq!(tier_name(Duration::from_millis(1500)), "1500ms");
    assert_eq!(tier_name(Duration::from_secs(2 * 86_400)), "2d");
}

#[test]
fn tiers_have_their_own_section_and_take_the_dispatcher_values_left_unset() {
    let c = load(MIN).expect("minimal");
    assert_eq!(c.tiers, c.dispatcher, "defaults are the same limits");
    let c = load(&format!(
        "{MIN}[dispatcher]\nshutdown_grace = \"5s\"\nendpoint_concurrency = 8\n[tiers]\nmax_in_flight_per_partition = 32\n"
    ))
    .expect("valid");
    assert_eq!(c.tiers.max_in_flight_per_partition, 32);
    assert_eq!(
        c.tiers.shutdown_grace,
        Duration::from_secs(5),
        "from [dispatcher]"
    );
    assert_eq!(c.tiers.endpoint_concurrency, 8, "from [dispatcher]");
    assert_eq!(c.dispatcher.max_in_flight_per_partition, 256);
    let err = load(&format!("{MIN}[tiers]\nendpoint_concurrency = 0\n")).expect_err("zero");
    assert_eq!(field_of(err), "tiers.endpoint_concurrency");
    let c = Config::from_toml_with_env(MIN, "t", env(&[("HOOKLINE_TIERS__SHUTDOWN_GRACE", "2s")]))
        .expect("override");
    assert_eq!(c.tiers.shutdown_grace, Duration::from_secs(2));
}

#[test]
fn endpoint_urls_and_secrets_are_parsed_at_load() {
    let c = load(&format!(
        "{MIN}[[endpoints]]\nid = \"a\"\nurl = \"https://x.example/hook?t=1\"\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n"
    ))
    .expect("valid");
    let ep = &c.endpoints[0];
    assert_eq!(
        ep.url.as_str(),
        "https://x.example/hook?t=1",
        "shown as written"
    );
    assert_eq!(ep.url.as_url().host_str(), Some("x.example"));
    assert_eq!(ep.secrets[0].key().len(), 24);
    for url in [
        "not a url",
        "ftp://example.com/hook",
        "mailto:ops@example.com",
        "https://u:p@x/",
    ] {
        let err = load(&format!(
            "{MIN}[[endpoints]]\nid = \"a\"\nurl = \"{url}\"\n"
        ))
        .expect_err(url);
        assert_eq!(field_of(err), "endpoints[0].url", "{url}");
    }
    let err = load(&format!(
        "{MIN}[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"whsec_!!!\"]\n"
    ))
    .expect_err("bad secret");
    assert_eq!(field_of(err), "endpoints[0].secrets[1]");
    assert!(!err_text_contains_secret(), "never echoed");
}

fn err_text_contains_secret() -> bool {
    let err = load(&format!(
        "{MIN}[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\nsecrets = [\"whsec_!!!secret\"]\n"
    ))
    .expect_err("bad secret");
    err.to_string().contains("!!!secret")
}
