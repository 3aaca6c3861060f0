//! Tests of `endpoint.rs`.

use super::*;

const A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn def() -> EndpointConfig {
    EndpointConfig {
        id: "crm".into(),
        url: EndpointUrl::parse("https://crm.example/hook").expect("url"),
        secrets: vec![Secret::parse(A).expect("secret")],
        tenant: Some("acme".into()),
        event_types: vec!["order.*".into()],
        enabled: true,
        timeout: Some(Duration::from_millis(2500)),
        max_concurrency: Some(4),
        headers: vec![],
        filter: None,
        rate_limit: None,
        burst: None,
        trace_context: true,
    }
}

#[test]
fn validation_is_the_config_files() {
    assert_eq!(validate(&def()), Ok(()));
    type Edit = Box<dyn Fn(&mut EndpointConfig)>;
    let cases: Vec<(Edit, &str)> = vec![
        // URLs and secrets cannot even be built wrong (parsed at load, `EndpointUrl`,
        // `Secret`): the API and the CLI name `url` / `secret` when parsing fails.
        (Box::new(|d| d.id = "has space".into()), "id"),
        (Box::new(|d| d.tenant = Some(String::new())), "tenant"),
        (
            Box::new(|d| d.event_types = vec![String::new()]),
            "event_types[0]",
        ),
        (
            Box::new(|d| d.timeout = Some(Duration::from_secs(600))),
            "timeout",
        ),
        (Box::new(|d| d.max_concurrency = Some(0)), "max_concurrency"),
    ];
    for (change, field) in cases {
        let mut d = def();
        change(&mut d);
        let err = validate(&d).expect_err(field);
        assert_eq!(err.field, field, "{err}");
    }
    assert!(EndpointUrl::parse("ftp://x").is_err());
    assert!(EndpointUrl::parse("https://u:p@x").is_err());
    let bad = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSX!").expect_err("bad secret");
    assert!(!bad.contains("MfKQ9r8"), "{bad}");
}

fn header(name: &str, value: &str, secret: bool) -> CustomHeader {
    CustomHeader::parse(name, value, secret).expect("valid header")
}

fn edit(name: &str, value: Option<&str>, secret: bool) -> HeaderEdit {
    HeaderEdit {
        name: name.into(),
        value: value.map(str::to_string),
        secret,
    }
}

#[test]
fn headers_validate_through_the_config_loader_and_keep_secret_values_on_edit() {
    let mut d = def();
    d.headers = vec![
        header("X-A", "1", false),
        header("Authorization", "tok", true),
    ];
    assert_eq!(validate(&d), Ok(()));
    d.headers.push(header("x-a", "2", false));
    assert_eq!(validate(&d).expect_err("dup").field, "headers[2].name");
    d.headers = (0..3)
        .map(|i| header(&format!("X-{i}"), &"v".repeat(3000), false))
        .collect();
    assert_eq!(validate(&d).expect_err("8 KiB").field, "headers");

    let current = vec![header("Authorization", "Bearer old", true)];
    let kept = resolve_headers(
        &[
            edit("authorization", None, true),
            edit("X-B", Some("b"), false),
        ],
        &current,
    )
    .expect("kept");
    assert_eq!(kept[0].value_text(), "Bearer old");
    assert_eq!(kept[1].value_text(), "b");
    let err = resolve_headers(
        &[edit("X-B", Some("b"), false), edit("X-New", None, true)],
        &current,
    )
    .expect_err("nothing to keep");
    assert_eq!(err.field, "headers[1].value");
    let err = resolve_headers(&[edit("Webhook-Id", Some("x"), false)], &[]).expect_err("ours");
    let mut d = def();
    d.filter = Some(EventFilter::compile("type == 'a'").expect("filter"));
    assert_eq!(
        validate(&d),
        Ok(()),
        "the filter goes through the loader too"
    );
    assert_eq!(err.field, "headers[0].name");
    let err = resolve_headers(&[edit("X-A", Some("a\nb"), false)], &[]).expect_err("crlf");
    assert_eq!(err.field, "headers[0].value");
    assert!(!format!("{:?}", edit("A", Some("tok-9"), true)).contains("tok-9"));
}

#[test]
fn secret_header_values_are_sealed_in_the_record() {
    let key = Keyring::generate_key();
    let k = Keyring::from_base64(Some(&key), &[]).expect("key");
    let e = Endpoint {
        headers: vec![
            header("X-Plain", "visible", false),
            header("Authorization", "Bearer tok-7", true),
        ],
        ..endpoint()
    };
    let r = e.to_record(&k).expect("seal");
    assert_eq!(r.schema, SCHEMA, "a process from before headers skips it");
    let bytes = String::from_utf8_lossy(&r.to_bytes()).into_owned();
    assert!(
        bytes.contains("visible") && !bytes.contains("tok-7"),
        "{bytes}"
    );
    assert_eq!(Endpoint::from_record(r.clone(), &k), e);
    let json = e.to_json(0).to_string();
    assert!(
        json.contains("visible") && !json.contains("tok-7"),
        "{json}"
    );
    let blind = Endpoint::from_record(r, &Keyring::empty());
    assert!(
        blind
            .problem
            .as_deref()
            .is_some_and(|p| p.contains("headers[1]")),
        "{blind:?}"
    );
    assert!(
        !blind.config_at(0).expect("parses").enabled,
        "never sent without it"
    );
    assert_eq!(endpoint().to_record(&k).expect("plain").schema, SCHEMA_V1);
    let filtered = Endpoint {
        filter: Some(EventFilter::compile("data.amount > 5").expect("filter")),
        ..endpoint()
    };
    let r = filtered.to_record(&k).expect("record");
    assert_eq!(
        (r.schema, r.filter.as_deref()),
        (SCHEMA, Some("data.amount > 5"))
    );
    assert_eq!(Endpoint::from_record(r.clone(), &k), filtered);
    let broken = EndpointRecord {
        filter: Some("data.amount >".into()),
        ..r
    };
    let e = Endpoint::from_record(broken, &k);
    assert!(
        e.problem
            .as_deref()
            .is_some_and(|p| p.starts_with("filter:")),
        "{e:?}"
    );
    assert!(
        !e.config_at(0).expect("parses").enabled,
        "never delivered past it"
    );
}

#[test]
fn rotation_keeps_the_old_secret_for_the_grace_period() {
    let grace = Duration::from_secs(86_400);
    let one = vec![SigningSecret {
        secret: "a".into(),
        expires_at_ms: None,
    }];
    let two = rotated(&one, "b".into(), 1_000, grace);
    assert_eq!(two[0].expires_at_ms, None);
    assert_eq!(two[1].expires_at_ms, Some(1_000 + 86_400_000));
    let e = Endpoint {
        secrets: two.clone(),
        ..endpoint()
    };
    assert_eq!(e.signing_secrets_at(2_000), ["b", "a"]);
    assert_eq!(e.signing_secrets_at(1_000 + 86_400_000), ["b"]);
    // Rotating again within the grace keeps the earlier expiry; expired ones are dropped.
    let three = rotated(&two, "c".into(), 5_000, grace);
    let got: Vec<(&str, Option<i64>)> = three
        .iter()
        .map(|s| (s.secret.as_str(), s.expires_at_ms))
        .collect();
    assert_eq!(
        got,
        [
            ("c", None),
            ("b", Some(5_000 + 86_400_000)),
            ("a", Some(1_000 + 86_400_000))
        ]
    );
    let later = rotated(&three, "d".into(), 1_000 + 86_400_000, grace);
    assert_eq!(later.len(), 3, "a expired: {later:?}");
}

pub(crate) fn endpoint() -> Endpoint {
    Endpoint {
        id: "crm".into(),
        url: "https://crm.example/hook".into(),
        tenant: None,
        event_types: vec![],
        enabled: true,
        timeout: None,
        max_concurrency: None,
        headers: vec![],
        filter: None,
        rate_limit: None,
        burst: None,
        trace_context: true,
        secrets: vec![],
        managed_by: ManagedBy::Api,
        disabled_reason: None,
        failing_since_ms: None,
        created_at_ms: 0,
        updated_at_ms: 0,
        version: 1,
        problem: None,
        needs_reencryption: false,
    }
}

#[test]
fn trace_context_is_stored_only_when_off() {
    let k = Keyring::empty();
    let on = endpoint();
    let r = on.to_record(&k).expect("record");
    assert_eq!((r.trace_context, r.schema), (None, SCHEMA_V1));
    let v: Value = serde_json::from_slice(&r.to_bytes()).expect("json");
    assert!(
        v.get("trace_context").is_none(),
        "a default record is unchanged: {v}"
    );
    assert!(Endpoint::from_record(r, &k).trace_context);
    assert_eq!(on.to_json(0)["trace_context"], true);

    let off = Endpoint {
        trace_context: false,
        ..endpoint()
    };
    let bytes = off.to_record(&k).expect("record").to_bytes();
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(v["trace_context"], false);
    let back = EndpointRecord::parse("crm", &bytes).expect("parses");
    assert_eq!(back.trace_context, Some(false));
    assert_eq!(Endpoint::from_record(back, &k), off);
    assert!(!off.config_at(0).expect("parses").trace_context);
    assert!(!off.definition().expect("parses").trace_context);
    assert_eq!(off.to_json(0)["trace_context"], false);

    let d = EndpointConfig {
        trace_context: false,
        ..def()
    };
    assert_eq!(validate(&d), Ok(()));
    let made = Endpoint::from_definition(&d, ManagedBy::Api, None, 0);
    assert!(!made.trace_context);

    // A record from before the field: on.
    let old = br#"{"schema":1,"id":"crm","url":"https://crm.example/hook","enabled":true,
        "managed_by":"api","created_at_ms":0,"updated_at_ms":0,"version":1}"#;
    let r = EndpointRecord::parse("crm", old).expect("parses");
    assert!(Endpoint::from_record(r, &k).trace_context);
}

#[test]
fn records_round_trip_and_unopenable_secrets_disable() {
    let key = Keyring::generate_key();
    let k = Keyring::from_base64(Some(&key), &[]).expect("key");
    let e = Endpoint {
        secrets: vec![SigningSecret {
            secret: A.into(),
            expires_at_ms: None,
        }],
        ..endpoint()
    };
    let r = e.to_record(&k).expect("seal");
    assert!(!String::from_utf8_lossy(&r.to_bytes()).contains("MfKQ9r8"));
    assert_eq!(Endpoint::from_record(r.clone(), &k), e);
    let blind = Endpoint::from_record(r, &Keyring::empty());
    assert!(blind
        .problem
        .as_deref()
        .is_some_and(|p| p.contains("secrets[0]")));
    assert!(
        !blind.config_at(0).expect("parses").enabled,
        "never sent unsigned"
    );
    assert!(!format!("{:?}", e).contains("MfKQ9r8"));
    assert!(generate_secret().starts_with("whsec_"));
    assert_eq!(
        hookline_common::contract::secret::decode_secret(&generate_secret()).map(|b| b.len()),
        Ok(32)
    );
}
