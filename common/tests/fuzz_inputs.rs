//! Property tests ("fuzzing on stable") of the inputs hookline takes from outside, through the
//! public API: the event envelope and its dedupe key (`envelope.rs`), the delivery-record headers
//! (`delivery.rs`) and the configuration with its `HOOKLINE_…` overrides (`config/`).
//!
//! Each `fuzz_*` test runs its properties on generated inputs for `HOOKLINE_TEST_FUZZ_MS`
//! milliseconds (default 1500; `HOOKLINE_TEST_FUZZ_MS=600000` for a long run). A failure prints
//! arbtest's seed and the command that replays it (`HOOKLINE_TEST_FUZZ_SEED=0x…`).

use hookline_fuzzing::{arbitrary, Unstructured};

/// The command that replays one of these tests.
const REPLAY: &str = "cargo test -p hookline-common --test fuzz_inputs";

fn fuzz(size_max: u32, properties: &[(&str, hookline_fuzzing::Property)]) {
    hookline_fuzzing::fuzz(REPLAY, size_max, properties);
}

/// A JSON string literal of `s`, with a random choice of characters written as `\u` escapes
/// (surrogate pairs beyond the BMP): the decoded value is `s` whatever the spelling.
fn json_literal(u: &mut Unstructured<'_>, s: &str) -> arbitrary::Result<String> {
    use std::fmt::Write as _;
    let mut out = String::from("\"");
    for c in s.chars() {
        if matches!(c, '"' | '\\') || (c as u32) < 0x20 || u.ratio(1, 8)? {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
    Ok(out)
}

mod envelope {
    use std::collections::HashMap;

    use hookline_common::config::glob::glob_match;
    use hookline_common::config::{DedupeKeyRule, InputConfig};
    use hookline_common::contract::envelope::{InvalidReason, ValidEvent, Validator};
    use hookline_fuzzing::{arbitrary, Unstructured};
    use serde_json::Value;

    use super::{fuzz, json_literal};

    #[test]
    fn fuzz_envelope() {
        fuzz(
            16 * 1024,
            &[
                ("arbitrary bytes", arbitrary_bytes),
                ("JSON-shaped values", json_shaped),
                ("the id rule", id_rule),
                ("dedupe keys of a batch", dedupe_keys),
            ],
        );
    }

    fn input(max_payload_bytes: usize) -> InputConfig {
        InputConfig {
            max_payload_bytes,
            max_key_bytes: 1024,
        }
    }

    /// The envelope id contract, written independently of `envelope.rs`: 1..=256 bytes of
    /// printable ASCII (0x21..=0x7e: no space, no control character) without `.`.
    fn id_obeys_contract(id: &str) -> bool {
        (1..=256).contains(&id.len()) && id.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'.')
    }

    /// Fields under `data` that the generated dedupe rules point at: `/`, `~`, spaces and the
    /// key's own separators (`|`, `:`) included.
    const FIELDS: &[&str] = &[
        "messageId",
        "callId",
        "event",
        "a/b",
        "m~n",
        "",
        "x y",
        "1:x|",
    ];
    const GLOBS: &[&str] = &[
        "email.inbound",
        "email.*",
        "call.*",
        "*",
        "*.sent",
        "x|y",
        "1:a",
        "order.*",
        "nothing.matches",
    ];
    const TYPES: &[&str] = &[
        "email.inbound",
        "email.delivery.sent",
        "call.started",
        "order.paid",
        "x|y",
        "1:a",
        "plain",
    ];
    /// Pointers beyond `/data/<field>` for the shape-only properties: array indexes (with the
    /// forms `Value::pointer` refuses), the envelope's own fields, the root, not-a-pointer.
    const ODD_POINTERS: &[&str] = &[
        "/data/list/1",
        "/data/list/01",
        "/data/list/+1",
        "/data/list/-1",
        "/data/list/18446744073709551616",
        "/data/a~1b/0",
        "/id",
        "/type",
        "",
        "/",
        "data",
        "/data/~2",
        "/data/~",
    ];

    fn pointer(field: &str) -> String {
        format!("/data/{}", field.replace('~', "~0").replace('/', "~1"))
    }

    fn field_of(pointer_text: &str) -> Option<&'static str> {
        FIELDS.iter().copied().find(|f| pointer(f) == pointer_text)
    }

    fn rules(u: &mut Unstructured<'_>, odd: bool) -> arbitrary::Result<Vec<DedupeKeyRule>> {
        let mut rules = Vec::new();
        for _ in 0..u.int_in_range(0..=4)? {
            let mut pointers = Vec::new();
            for _ in 0..u.int_in_range(1..=3)? {
                pointers.push(if odd && u.ratio(1, 4)? {
                    u.choose(ODD_POINTERS)?.to_string()
                } else {
                    pointer(u.choose(FIELDS)?)
                });
            }
            rules.push(DedupeKeyRule {
                type_glob: u.choose(GLOBS)?.to_string(),
                pointers,
            });
        }
        Ok(rules)
    }

    /// The properties every validation has, whatever the input:
    /// - the size check comes first: over `max` bytes is `payload_too_large`, never otherwise;
    /// - accepted: the id obeys the contract, type and tenant are 1..=256 bytes, and all three
    ///   are what a JSON parser reads from the bytes (the last of duplicate names);
    /// - validating again, or with another validator of the same rules, gives the same result.
    fn check(
        rules: &[DedupeKeyRule],
        max: usize,
        bytes: &[u8],
    ) -> Result<ValidEvent, InvalidReason> {
        let v = Validator::new(&input(max), rules);
        let result = v.validate(Some(bytes));
        let shown = || String::from_utf8_lossy(bytes).into_owned();
        match &result {
            Err(e) if bytes.len() > max => {
                assert_eq!(e.reason, InvalidReason::PayloadTooLarge, "{}", shown())
            }
            Ok(_) if bytes.len() > max => panic!("accepted over the limit of {max}: {}", shown()),
            Err(e) => {
                assert_ne!(e.reason, InvalidReason::PayloadTooLarge, "{}", shown());
                assert!(!e.detail.is_empty(), "{e:?}");
            }
            Ok(ev) => {
                assert!(id_obeys_contract(&ev.id), "accepted id {:?}", ev.id);
                assert!((1..=256).contains(&ev.event_type.len()), "{ev:?}");
                assert!(ev
                    .tenant
                    .as_ref()
                    .is_none_or(|t| (1..=256).contains(&t.len())));
                let doc: Value = serde_json::from_slice(bytes).expect("accepted bytes are JSON");
                assert_eq!(doc["id"].as_str(), Some(ev.id.as_str()), "{}", shown());
                assert_eq!(doc["type"].as_str(), Some(ev.event_type.as_str()));
                assert_eq!(
                    doc.get("tenant").and_then(Value::as_str),
                    ev.tenant.as_deref()
                );
                assert!(
                    ev.dedupe_key.starts_with("id|") || ev.dedupe_key.starts_with("rule "),
                    "{ev:?}"
                );
            }
        }
        assert_eq!(v.validate(Some(bytes)), result, "not deterministic");
        let again = Validator::new(&input(max), rules).validate(Some(bytes));
        assert_eq!(again, result, "another validator disagrees");
        result.map_err(|e| e.reason)
    }

    /// Random bytes, and JSON-shaped text with a few bytes flipped, inserted or removed.
    fn arbitrary_bytes(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let rules = rules(u, true)?;
        let max = u.int_in_range(1..=4096)?;
        let mut bytes: Vec<u8> = if u.ratio(1, 2)? {
            u.arbitrary()?
        } else {
            envelope_text(u, true)?.into_bytes()
        };
        for _ in 0..u.int_in_range(0..=4)? {
            if bytes.is_empty() {
                break;
            }
            let at = u.choose_index(bytes.len())?;
            match u.int_in_range(0..=2)? {
                0 => bytes[at] = u.arbitrary()?,
                1 => bytes.insert(at, u.arbitrary()?),
                _ => {
                    bytes.remove(at);
                }
            }
        }
        check(&rules, max, &bytes).ok();
        let none = Validator::new(&input(max), &rules).validate(None);
        assert_eq!(none.map_err(|e| e.reason), Err(InvalidReason::NotJson));
        Ok(())
    }

    /// Generated JSON (mostly envelope-like), against limits just below, at and above its size.
    fn json_shaped(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let rules = rules(u, true)?;
        let loose = u.ratio(1, 3)?;
        let text = if u.ratio(3, 4)? {
            envelope_text(u, loose)?
        } else {
            let mut out = String::new();
            value(u, &mut out, 4, loose)?;
            out
        };
        let len = text.len();
        let max = *u.choose(&[len.saturating_sub(1).max(1), len.max(1), len + 1, 1 << 20])?;
        check(&rules, max, text.as_bytes()).ok();
        Ok(())
    }

    /// Ids around the contract's edges (lengths 0, 1, 255..=257; `.`, space, controls, non-ASCII),
    /// spelled with random `\u` escapes: accepted exactly when they obey it, as written.
    fn id_rule(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let len = if u.ratio(1, 2)? {
            *u.choose(&[0usize, 1, 2, 255, 256, 257])?
        } else {
            u.int_in_range(0..=300)?
        };
        let bad = [
            '.',
            ' ',
            '\t',
            '\n',
            '\0',
            '\x7f',
            'é',
            '\u{a0}',
            '\u{2028}',
            '\u{10ffff}',
        ];
        let clean = u.ratio(1, 2)?;
        let mut id = String::new();
        while id.len() < len {
            let c = if u.ratio(1, 40)? {
                *u.choose(&bad)?
            } else {
                char::from(u.int_in_range(0x21u8..=0x7e)?)
            };
            id.push(if clean && c == '.' { '_' } else { c });
        }
        let doc = format!(r#"{{"id":{},"type":"t"}}"#, json_literal(u, &id)?);
        match Validator::new(&input(1 << 20), &[]).validate(Some(doc.as_bytes())) {
            Ok(ev) => {
                assert!(id_obeys_contract(&id), "accepted id {id:?}");
                assert_eq!(ev.id, id);
            }
            Err(e) => {
                assert!(!id_obeys_contract(&id), "refused id {id:?}: {e:?}");
                assert_eq!(e.reason, InvalidReason::BadId, "{id:?}");
            }
        }
        Ok(())
    }

    /// What a field under `data` holds, as the dedupe key must see it.
    #[derive(Debug, Clone, PartialEq)]
    enum Held {
        Str(String),
        /// A number, by its exact JSON text.
        Num(String),
        Other,
    }

    /// The identity a dedupe key stands for, computed independently: the namespace (the
    /// envelope id, or the first matching rule's glob and pointers), the tenant and the values.
    #[derive(Debug, Clone, PartialEq)]
    enum Expected {
        Key {
            rule: Option<(String, Vec<String>)>,
            tenant: Option<String>,
            values: Vec<Held>,
        },
        Invalid(InvalidReason),
    }

    /// Small pools full of the key's separators (`|`, `:`, `-`, digits), so that a key that
    /// merely joined its parts would collide often.
    fn tricky(
        u: &mut Unstructured<'_>,
        pool: &[&str],
        min_len: usize,
    ) -> arbitrary::Result<String> {
        if u.ratio(1, 2)? {
            return Ok(u.choose(pool)?.to_string());
        }
        let mut s = String::new();
        for _ in 0..u.int_in_range(min_len..=4)? {
            s.push(*u.choose(&['a', 'b', '1', '2', ':', '|', '-', 's', 'n'])?);
        }
        Ok(s)
    }

    fn data_value(u: &mut Unstructured<'_>) -> arbitrary::Result<(String, Held)> {
        const STRINGS: &[&str] = &[
            "42", "4", "2", "1:x", "x|", "", "a|1:b", "-", "s2:42", "n2:42",
        ];
        const NUMBERS: &[&str] = &[
            "42",
            "42.0",
            "4.2e1",
            "-0",
            "0",
            "2",
            "18446744073709551617",
            "18446744073709551618",
            "1e2",
            "100",
        ];
        Ok(match u.int_in_range(0..=9)? {
            0..=4 => {
                let s = u.choose(STRINGS)?;
                (json_literal(u, s)?, Held::Str(s.to_string()))
            }
            5..=7 => {
                let n = u.choose(NUMBERS)?;
                let pad = *u.choose(&["", " ", "\n\t "])?;
                (format!("{pad}{n}{pad}"), Held::Num(n.to_string()))
            }
            _ => {
                let other = u.choose(&["{}", "[]", "true", "null", r#"{"a":1}"#, "[42]"])?;
                (other.to_string(), Held::Other)
            }
        })
    }

    /// A batch of events from small pools (ids, tenants, types, rule values) validated by one
    /// validator: each result is the one the contract gives, and two keys are equal exactly when
    /// they stand for the same (namespace, tenant, values): different (id, tenant) pairs and
    /// different rules never share a key.
    fn dedupe_keys(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        const IDS: &[&str] = &[
            "e1", "e2", "1:e", "e|1", "2:e1", "-", "a|b", "42", "x:y|z", "s2:42",
        ];
        const TENANTS: &[&str] = &["a", "acme", "1:a", "a|", "|a", "-", "a|1:b", "2:a|", "id"];
        let rules = rules(u, false)?;
        let v = Validator::new(&input(1 << 20), &rules);
        let mut accepted: Vec<(Expected, String, String)> = Vec::new();
        for _ in 0..u.int_in_range(2..=12)? {
            let id = tricky(u, IDS, 1)?;
            let event_type = *u.choose(TYPES)?;
            let (tenant_json, tenant) = match u.int_in_range(0..=5)? {
                0 => (None, None),
                1 => (Some("null".to_string()), None),
                _ => {
                    let t = tricky(u, TENANTS, 0)?;
                    (Some(json_literal(u, &t)?), Some(t))
                }
            };
            let mut data = Vec::new();
            let mut held: HashMap<&str, Held> = HashMap::new();
            for field in FIELDS {
                if u.ratio(1, 3)? {
                    continue;
                }
                if u.ratio(1, 5)? {
                    // A duplicate name before the real one: the last one wins.
                    data.push(format!("{}:{}", json_literal(u, field)?, data_value(u)?.0));
                }
                let (text, value) = data_value(u)?;
                data.push(format!("{}:{text}", json_literal(u, field)?));
                held.insert(*field, value);
            }
            let mut members = vec![
                format!(r#""id":{}"#, json_literal(u, &id)?),
                format!(r#""type":{}"#, json_literal(u, event_type)?),
                format!(r#""data":{{{}}}"#, data.join(",")),
            ];
            if let Some(t) = tenant_json {
                members.push(format!(r#""tenant":{t}"#));
            }
            let first = u.choose_index(members.len())?;
            members.swap(0, first);
            let doc = format!("{{{}}}", members.join(","));

            let expected = if tenant.as_deref() == Some("") {
                Expected::Invalid(InvalidReason::BadTenant)
            } else if let Some(rule) = rules.iter().find(|r| glob_match(&r.type_glob, event_type)) {
                let values: Vec<Held> = rule
                    .pointers
                    .iter()
                    .map(|p| {
                        field_of(p)
                            .and_then(|f| held.get(f))
                            .cloned()
                            .unwrap_or(Held::Other)
                    })
                    .collect();
                if values.iter().all(|h| {
                    matches!(h, Held::Num(_)) || matches!(h, Held::Str(s) if !s.is_empty())
                }) {
                    Expected::Key {
                        rule: Some((rule.type_glob.clone(), rule.pointers.clone())),
                        tenant: tenant.clone(),
                        values,
                    }
                } else {
                    Expected::Invalid(InvalidReason::MissingDedupeField)
                }
            } else {
                Expected::Key {
                    rule: None,
                    tenant: tenant.clone(),
                    values: vec![Held::Str(id.clone())],
                }
            };
            match (v.validate(Some(doc.as_bytes())), &expected) {
                (Ok(ev), Expected::Key { .. }) => {
                    assert_eq!(
                        (ev.id.as_str(), ev.tenant.as_deref()),
                        (id.as_str(), tenant.as_deref())
                    );
                    accepted.push((expected.clone(), ev.dedupe_key, doc));
                }
                (Err(e), Expected::Invalid(reason)) => assert_eq!(e.reason, *reason, "{doc}"),
                (got, _) => panic!("{doc}\nrules {rules:?}\nexpected {expected:?}\ngot {got:?}"),
            }
        }
        for (i, (a, key_a, doc_a)) in accepted.iter().enumerate() {
            for (b, key_b, doc_b) in &accepted[i + 1..] {
                assert_eq!(
                    key_a == key_b,
                    a == b,
                    "keys {key_a:?} and {key_b:?}\nof {doc_a}\nand {doc_b}\nstand for {a:?}\nand {b:?}\nrules {rules:?}"
                );
            }
        }
        Ok(())
    }

    /// An envelope-like JSON object: the envelope's fields (or not, or twice, or of the wrong
    /// kind) in random order, `data` with the rules' fields, and unrelated members. `loose`:
    /// anything JSON-like (invalid whitespace, escapes, numbers, nesting past the depth limit);
    /// else valid JSON with `id`, `type` and `data`, so that most documents reach the dedupe key.
    fn envelope_text(u: &mut Unstructured<'_>, loose: bool) -> arbitrary::Result<String> {
        let mut members = Vec::new();
        let mut kinds: Vec<u8> = if loose { Vec::new() } else { vec![0, 1, 3] };
        for _ in 0..u.int_in_range(0..=6)? {
            kinds.push(u.int_in_range(0..=5)?);
        }
        for kind in kinds {
            let member = match kind {
                0 => {
                    let id = if u.ratio(3, 4)? {
                        u.choose(&["evt_1", "e1", "a|b", "x".repeat(256).as_str()])?
                            .to_string()
                    } else {
                        u.arbitrary::<String>()?
                    };
                    format!(r#""id":{}"#, json_literal(u, &id)?)
                }
                1 => {
                    let event_type = *u.choose(TYPES)?;
                    format!(r#""type":{}"#, json_literal(u, event_type)?)
                }
                2 => {
                    let t = if u.ratio(1, 2)? {
                        "acme".to_string()
                    } else {
                        u.arbitrary()?
                    };
                    format!(r#""tenant":{}"#, json_literal(u, &t)?)
                }
                3 => {
                    let mut data = Vec::new();
                    for name in FIELDS.iter().chain(&["list"]) {
                        if u.ratio(1, 4)? {
                            continue;
                        }
                        let v = if u.ratio(3, 4)? {
                            data_value(u)?.0
                        } else {
                            let mut v = String::new();
                            value(u, &mut v, 2, loose)?;
                            v
                        };
                        data.push(format!("{}:{v}", json_literal(u, name)?));
                    }
                    format!(r#""data":{{{}}}"#, data.join(","))
                }
                4 => {
                    let name = *u.choose(&["id", "type", "tenant", "data"])?;
                    let mut v = String::new();
                    value(u, &mut v, 2, loose)?;
                    format!(r#""{name}":{v}"#)
                }
                _ => {
                    let mut k = String::new();
                    string(u, &mut k, loose)?;
                    let mut v = String::new();
                    value(u, &mut v, 3, loose)?;
                    format!("{k}:{v}")
                }
            };
            members.push(member);
        }
        for i in (1..members.len()).rev() {
            let j = u.int_in_range(0..=i)?;
            members.swap(i, j);
        }
        let mut out = String::from("{");
        for (i, m) in members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            whitespace(u, &mut out, loose)?;
            out.push_str(m);
            whitespace(u, &mut out, loose)?;
        }
        out.push('}');
        Ok(out)
    }

    fn whitespace(
        u: &mut Unstructured<'_>,
        out: &mut String,
        loose: bool,
    ) -> arbitrary::Result<()> {
        if u.ratio(1, 4)? {
            let all = [" ", "\n", "\t", "\r\n  ", "\u{a0}", "\u{feff}"];
            out.push_str(u.choose(if loose { &all[..] } else { &all[..4] })?);
        }
        Ok(())
    }

    /// A JSON-like value: numbers at the edges of every numeric type, strings with escapes of
    /// every kind, nesting, duplicate names; `loose` adds what is not JSON (numbers out of
    /// range or misspelt, raw control characters, lone surrogates, bad escapes, misspelt
    /// keywords) and nesting around serde_json's depth limit.
    fn value(
        u: &mut Unstructured<'_>,
        out: &mut String,
        depth: u32,
        loose: bool,
    ) -> arbitrary::Result<()> {
        const NUMBERS: &[&str] = &[
            "0",
            "-0",
            "1",
            "-1",
            "0.0",
            "-0.0",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "1.7976931348623157e308",
            "5e-324",
            "123456789012345678901234567890123456789",
            "1E+2",
            "1e-2",
            // Not JSON, or out of range.
            "1e400",
            "-1e400",
            "1.7976931348623159e308",
            "01",
            "1.",
            "-",
            ".5",
            "+1",
            "NaN",
            "Infinity",
            "0x10",
        ];
        const VALID_NUMBERS: usize = 15;
        whitespace(u, out, loose)?;
        let kind = match (depth, loose) {
            (0, _) => u.int_in_range(0..=3)?,
            (_, false) => u.int_in_range(0..=5)?,
            (_, true) => u.int_in_range(0..=6)?,
        };
        match kind {
            0 => {
                let words = ["null", "true", "false", "nul", "True"];
                out.push_str(u.choose(if loose { &words[..] } else { &words[..3] })?);
            }
            1 => {
                if u.ratio(1, 2)? {
                    let numbers = if loose {
                        NUMBERS
                    } else {
                        &NUMBERS[..VALID_NUMBERS]
                    };
                    out.push_str(u.choose(numbers)?);
                } else if u.ratio(1, 2)? {
                    out.push_str(&u.arbitrary::<i64>()?.to_string());
                } else {
                    let f: f64 = u.arbitrary()?;
                    let f = if loose || f.is_finite() { f } else { 0.5 };
                    out.push_str(&if u.ratio(1, 2)? {
                        format!("{f:?}")
                    } else {
                        format!("{f:e}")
                    });
                }
            }
            2 | 3 => string(u, out, loose)?,
            4 => {
                out.push('[');
                for i in 0..u.int_in_range(0..=4)? {
                    if i > 0 {
                        out.push(',');
                    }
                    value(u, out, depth - 1, loose)?;
                }
                out.push(']');
            }
            5 => {
                out.push('{');
                for i in 0..u.int_in_range(0..=4)? {
                    if i > 0 {
                        out.push(',');
                    }
                    let key =
                        *u.choose(&["id", "type", "tenant", "data", "messageId", "a/b", "", "n"])?;
                    out.push_str(&format!("\"{key}\":"));
                    value(u, out, depth - 1, loose)?;
                }
                out.push('}');
            }
            _ => {
                // Nesting around serde_json's depth limit (128).
                let n = u.int_in_range(100..=160)?;
                let object = u.ratio(1, 2)?;
                for _ in 0..n {
                    out.push_str(if object { r#"{"data":"# } else { "[" });
                }
                value(u, out, 0, loose)?;
                for _ in 0..n {
                    out.push(if object { '}' } else { ']' });
                }
            }
        }
        whitespace(u, out, loose)
    }

    fn string(u: &mut Unstructured<'_>, out: &mut String, loose: bool) -> arbitrary::Result<()> {
        const ESCAPES: &[&str] = &[
            "\\n",
            "\\t",
            "\\\"",
            "\\\\",
            "\\/",
            "\\b",
            "\\f",
            "\\r",
            "\\u0000",
            "\\u001f",
            "\\u002e",
            "\\u0020",
            "\\ud83d\\ude00",
            "\\uD83D\\uDE00",
            // Not JSON: lone surrogates, bad escapes.
            "\\ud800",
            "\\udc00",
            "\\x",
            "\\u12",
            "\\",
        ];
        const VALID_ESCAPES: usize = 14;
        out.push('"');
        for _ in 0..u.int_in_range(0..=12)? {
            match u.int_in_range(0..=9)? {
                0 => {
                    let c = u.int_in_range(0u8..=0x1f)?;
                    if loose {
                        out.push(char::from(c));
                    } else {
                        out.push_str(&format!("\\u{c:04x}"));
                    }
                }
                1 => {
                    let escapes = if loose {
                        ESCAPES
                    } else {
                        &ESCAPES[..VALID_ESCAPES]
                    };
                    out.push_str(u.choose(escapes)?);
                }
                2 => match u.arbitrary::<char>()? {
                    c @ ('"' | '\\') => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 && !loose => {
                        out.push_str(&format!("\\u{:04x}", c as u32))
                    }
                    c => out.push(c),
                },
                3 => out.push_str(
                    u.choose(&["|", ":", ".", " ", "-", "1:", "é", "\u{2028}", "\u{feff}"])?,
                ),
                _ => out.push(char::from(u.int_in_range(b'a'..=b'z')?)),
            }
        }
        out.push('"');
        Ok(())
    }
}

mod delivery_headers {
    use std::collections::{HashMap, HashSet};

    use hookline_common::contract::delivery::{self as d, AttemptRecord, DeadReason, DeliveryMeta};
    use hookline_common::contract::headers as h;
    use hookline_fuzzing::{arbitrary, Unstructured};
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

    use super::fuzz;

    /// Every header the codec reads.
    const NAMES: [&str; 13] = [
        d::ENDPOINT_ID,
        h::EVENT_ID,
        h::EVENT_TYPE,
        h::TENANT,
        d::ATTEMPT,
        d::DEFERRALS,
        d::FIRST_ATTEMPT_MS,
        d::DUE_MS,
        d::HISTORY,
        d::DEAD_REASON,
        d::DEAD_AT_MS,
        d::REPLAY_KEY,
        d::TRACE,
    ];
    const REASONS: [DeadReason; 5] = [
        DeadReason::Exhausted,
        DeadReason::EndpointRemoved,
        DeadReason::EndpointDisabled,
        DeadReason::EndpointUnsubscribed,
        DeadReason::RecordTooLarge,
    ];

    #[test]
    fn fuzz_delivery_headers() {
        fuzz(
            8 * 1024,
            &[
                ("round trip", round_trip),
                ("one header changed", one_header_changed),
                ("arbitrary headers", arbitrary_headers),
                ("arbitrary Kafka headers", arbitrary_kafka_headers),
            ],
        );
    }

    /// Any text, or one of the values at a parser's edges.
    fn text(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
        const EDGES: &[&str] = &[
            "",
            " ",
            "0",
            "-0",
            "-1",
            "+1",
            "1 ",
            " 1",
            "1e3",
            "0x10",
            "1000",
            "1001",
            "4294967296",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "null",
            "[]",
            "[{}]",
            "{}",
            "exhausted",
            "EXHAUSTED",
            "exhausted ",
            "\0",
            "é",
            "\u{feff}1",
            r#"[{"n":1,"at_ms":0,"duration_ms":0,"class":"ok"}]"#,
            r#"[{"n":1,"at_ms":0,"duration_ms":0,"class":"ok","status":null,"snippet":""}]"#,
            r#"[{"n":-1,"at_ms":0,"duration_ms":0,"class":"ok"}]"#,
            r#"[{"n":1,"at_ms":1e3,"duration_ms":0,"class":"ok"}]"#,
            r#"[{"n":1,"at_ms":0,"duration_ms":0,"class":"ok","status":65536}]"#,
            r#"[{"n":1,"at_ms":0,"duration_ms":0,"class":"ok","extra":[1]}]"#,
        ];
        if u.ratio(1, 3)? {
            Ok(u.choose(EDGES)?.to_string())
        } else {
            u.arbitrary()
        }
    }

    fn option<T>(
        u: &mut Unstructured<'_>,
        f: impl FnOnce(&mut Unstructured<'_>) -> arbitrary::Result<T>,
    ) -> arbitrary::Result<Option<T>> {
        Ok(if u.arbitrary()? { Some(f(u)?) } else { None })
    }

    fn attempt_record(u: &mut Unstructured<'_>) -> arbitrary::Result<AttemptRecord> {
        Ok(AttemptRecord {
            n: u.arbitrary()?,
            at_ms: u.arbitrary()?,
            duration_ms: u.arbitrary()?,
            status: u.arbitrary()?,
            class: text(u)?,
            snippet: text(u)?,
        })
    }

    /// A DeliveryMeta the codec accepts: attempt 1..=1000, deferrals 0..=1000, anything else.
    fn meta(u: &mut Unstructured<'_>) -> arbitrary::Result<DeliveryMeta> {
        let mut history = Vec::new();
        for _ in 0..u.int_in_range(0..=20)? {
            history.push(attempt_record(u)?);
        }
        Ok(DeliveryMeta {
            endpoint_id: text(u)?,
            event_id: text(u)?,
            event_type: text(u)?,
            tenant: option(u, text)?,
            attempt: u.int_in_range(1..=1000)?,
            deferrals: if u.arbitrary()? {
                0
            } else {
                u.int_in_range(0..=1000)?
            },
            first_attempt_ms: u.arbitrary()?,
            due_ms: u.arbitrary()?,
            history,
            dead_reason: option(u, |u| u.choose(&REASONS).copied())?,
            dead_at_ms: option(u, |u| u.arbitrary())?,
            replay_key: option(u, text)?,
            trace: option(u, text)?,
        })
    }

    /// A value the codec accepts for `name`, or any text.
    fn header_value(u: &mut Unstructured<'_>, name: &str) -> arbitrary::Result<String> {
        if u.ratio(1, 2)? {
            text(u)
        } else {
            valid_value(u, name)
        }
    }

    /// A value the codec accepts for `name` (any text for the free-form headers).
    fn valid_value(u: &mut Unstructured<'_>, name: &str) -> arbitrary::Result<String> {
        Ok(match name {
            d::ATTEMPT => u.int_in_range(1..=1000)?.to_string(),
            d::DEFERRALS => u.int_in_range(0..=1000)?.to_string(),
            d::FIRST_ATTEMPT_MS | d::DUE_MS | d::DEAD_AT_MS => u.arbitrary::<i64>()?.to_string(),
            d::HISTORY => {
                let mut history = Vec::new();
                for _ in 0..u.int_in_range(0..=3)? {
                    history.push(attempt_record(u)?);
                }
                serde_json::to_string(&history).expect("history serialises")
            }
            d::DEAD_REASON => u.choose(&REASONS)?.as_str().to_string(),
            _ => text(u)?,
        })
    }

    fn decode(map: &HashMap<&str, String>) -> Result<DeliveryMeta, d::MetaError> {
        DeliveryMeta::from_headers(|k| map.get(k).map(String::as_str))
    }

    /// A decoded meta encodes to headers that decode to it again.
    fn reencodes(m: &DeliveryMeta) {
        let map: HashMap<&str, String> = m.to_headers().into_iter().collect();
        assert_eq!(
            decode(&map).as_ref().ok(),
            Some(m),
            "{m:?} does not round-trip"
        );
    }

    fn message(headers: OwnedHeaders) -> OwnedMessage {
        OwnedMessage::new(
            None,
            None,
            "t".into(),
            Timestamp::NotAvailable,
            0,
            0,
            Some(headers),
        )
    }

    /// Valid meta → headers → meta is the identity, through a lookup function and through the
    /// Kafka headers of a record (with its dedupe key).
    fn round_trip(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let m = meta(u)?;
        let headers = m.to_headers();
        let names: HashSet<&str> = headers.iter().map(|(k, _)| *k).collect();
        assert_eq!(names.len(), headers.len(), "a header twice: {headers:?}");
        assert!(names.iter().all(|n| NAMES.contains(n)), "{names:?}");
        let map: HashMap<&str, String> = headers.into_iter().collect();
        assert_eq!(decode(&map).unwrap_or_else(|e| panic!("{m:?}: {e}")), m);
        let key = option(u, text)?;
        let msg = message(m.kafka_headers(key.as_deref()));
        let back = DeliveryMeta::from_message(&msg).unwrap_or_else(|e| panic!("{m:?}: {e}"));
        assert_eq!(back, m);
        assert_eq!(DeliveryMeta::dedupe_key_of(&msg), key);
        Ok(())
    }

    /// One header of a valid record removed or replaced: decoding fails naming exactly that
    /// header, or succeeds with every other header unchanged.
    fn one_header_changed(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let m = meta(u)?;
        let original: HashMap<&str, String> = m.to_headers().into_iter().collect();
        let mut map = original.clone();
        let name = *u.choose(&NAMES)?;
        if u.ratio(1, 3)? {
            map.remove(name);
        } else {
            map.insert(name, header_value(u, name)?);
        }
        match decode(&map) {
            Err(e) => {
                assert_eq!(e.header, name, "{e} for {:?} = {:?}", name, map.get(name));
                assert!(e.to_string().contains(name), "{e}");
            }
            Ok(back) => {
                let again: HashMap<&str, String> = back.to_headers().into_iter().collect();
                for other in NAMES.iter().filter(|n| **n != name) {
                    assert_eq!(again.get(other), original.get(other), "{other} changed");
                }
                reencodes(&back);
            }
        }
        Ok(())
    }

    /// Any set of headers: `Ok`, or an error naming one of the codec's headers.
    fn arbitrary_headers(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let mut all: HashMap<String, String> = HashMap::new();
        for name in NAMES {
            if u.ratio(9, 10)? {
                let value = if u.ratio(4, 5)? {
                    valid_value(u, name)?
                } else {
                    text(u)?
                };
                all.insert(name.to_string(), value);
            }
        }
        for junk in u.arbitrary::<Vec<String>>()? {
            all.entry(junk.clone()).or_insert(junk);
        }
        match DeliveryMeta::from_headers(|k| all.get(k).map(String::as_str)) {
            Err(e) => {
                assert!(NAMES.contains(&e.header), "{e}");
                assert!(e.to_string().contains(e.header), "{e}");
            }
            Ok(m) => {
                assert!(
                    (1..=1000).contains(&m.attempt) && m.deferrals <= 1000,
                    "{m:?}"
                );
                reencodes(&m);
            }
        }
        Ok(())
    }

    /// Kafka headers with names repeated, values missing or not UTF-8: decoding a record reads
    /// the first header of each name, like a lookup of those values.
    fn arbitrary_kafka_headers(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let mut entries: Vec<(String, Option<Vec<u8>>)> = Vec::new();
        for _ in 0..u.int_in_range(0..=20)? {
            let name = if u.ratio(5, 6)? {
                u.choose(&NAMES)?.to_string()
            } else {
                u.arbitrary()?
            };
            let value = match u.int_in_range(0..=5)? {
                0 => None,
                1 => Some(u.arbitrary::<Vec<u8>>()?),
                _ => Some(header_value(u, &name)?.into_bytes()),
            };
            entries.push((name, value));
        }
        let mut headers = OwnedHeaders::new();
        for (key, value) in &entries {
            headers = headers.insert(Header {
                key,
                value: value.as_deref(),
            });
        }
        let msg = message(headers);
        let mut first: HashMap<&str, Option<&str>> = HashMap::new();
        for (key, value) in &entries {
            first
                .entry(key.as_str())
                .or_insert_with(|| value.as_deref().and_then(|v| std::str::from_utf8(v).ok()));
        }
        let expected = DeliveryMeta::from_headers(|k| first.get(k).copied().flatten());
        match (DeliveryMeta::from_message(&msg), expected) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(a), Err(b)) => {
                assert_eq!(a.header, b.header);
                assert!(NAMES.contains(&a.header), "{a}");
            }
            (a, b) => panic!("from_message {a:?}, from the first headers {b:?}: {entries:?}"),
        }
        Ok(())
    }
}

mod config {
    use hookline_common::config::{Config, ConfigError};
    use hookline_fuzzing::{arbitrary, Unstructured};

    use super::fuzz;

    const EXAMPLE: &str = include_str!("../../config/hookline.example.toml");
    const MIN: &str = "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";
    const ORIGIN: &str = "fuzz.toml";

    /// The real sections and their keys; `[]` marks an array of tables.
    const SECTIONS: &[(&str, &[&str])] = &[
        (
            "kafka",
            &[
                "bootstrap_servers",
                "options",
                "group_prefix",
                "instance_id",
            ],
        ),
        (
            "kafka.options",
            &["sasl.password", "security.protocol", "x"],
        ),
        (
            "topics",
            &[
                "prefix",
                "partitions",
                "replication_factor",
                "min_insync_replicas",
                "flow_retention",
                "tier_retention_margin",
                "dedupe_state_retention_margin",
            ],
        ),
        ("input", &["max_payload_bytes", "max_key_bytes"]),
        (
            "dedupe",
            &[
                "window",
                "keys",
                "batch_interval",
                "batch_max_records",
                "direct",
            ],
        ),
        ("[dedupe.keys]", &["type", "pointers"]),
        ("retry", &["schedule"]),
        (
            "http",
            &[
                "timeout",
                "max_response_body_bytes",
                "allow_cidrs",
                "user_agent",
            ],
        ),
        (
            "dispatcher",
            &[
                "max_in_flight_per_partition",
                "endpoint_concurrency",
                "shutdown_grace",
            ],
        ),
        (
            "tiers",
            &[
                "max_in_flight_per_partition",
                "endpoint_concurrency",
                "shutdown_grace",
            ],
        ),
        ("server", &["listen", "liveness_bound"]),
        ("log", &["format", "level"]),
        ("admin", &["listen", "tokens", "idempotency_keys"]),
        ("[admin.tokens]", &["name", "sha256", "scope"]),
        (
            "control",
            &[
                "attempts_retention",
                "attempt_log_buffer",
                "secret_rotation_grace",
                "health_window",
                "health_window_attempts",
                "health_lookback",
                "auto_disable_after",
                "failing_after",
                "operational_retention",
                "metrics_endpoint_limit",
                "delivery_log",
            ],
        ),
        (
            "[endpoints]",
            &[
                "id",
                "url",
                "secrets",
                "tenant",
                "event_types",
                "enabled",
                "timeout",
                "max_concurrency",
            ],
        ),
    ];

    #[test]
    fn fuzz_config() {
        fuzz(
            16 * 1024,
            &[
                ("arbitrary text", arbitrary_text),
                ("the example file edited", edited_example),
                ("TOML in the real sections", real_sections),
                ("HOOKLINE_ overrides", overrides),
            ],
        );
    }

    /// Loading never panics; an error names the input (a syntax error) or a field: a dotted
    /// path starting at a section or at a key of the input, an environment variable, or the
    /// root with the field's name in backquotes.
    fn check(text: &str, env: &[(String, String)]) {
        match Config::from_toml_with_env(text, ORIGIN, env.to_vec()) {
            Ok(config) => config.validate().expect("a loaded config validates"),
            Err(ConfigError::Syntax { path, message }) => {
                assert_eq!(path, ORIGIN);
                assert!(!message.is_empty());
            }
            Err(e @ ConfigError::Field { .. }) => {
                let shown = e.to_string();
                let ConfigError::Field { field, reason } = e else {
                    unreachable!()
                };
                assert!(shown.contains(&field), "{shown}");
                assert!(!reason.trim().is_empty(), "{shown}");
                let head = field.split(['.', '[']).next().unwrap_or_default();
                let named = if field == "(root)" {
                    reason.contains('`')
                } else {
                    !head.is_empty()
                        && (SECTIONS.iter().any(|(s, _)| {
                            s.trim_matches(['[', ']']).split('.').next() == Some(head)
                        }) || field.starts_with("HOOKLINE_")
                            || text.contains(head)
                            || env
                                .iter()
                                .any(|(k, _)| k.to_ascii_lowercase().contains(head)))
                };
                assert!(
                    named,
                    "the error names no field: {shown}\n--- text:\n{text}\n--- env: {env:?}"
                );
            }
            Err(e @ ConfigError::Read { .. }) => panic!("read error without a file: {e}"),
        }
    }

    /// Found by `fuzz_config`: a `HOOKLINE_…` key 20,000 levels deep (60 KB) overflowed the
    /// stack while its nested tables were dropped, aborting the process.
    #[test]
    fn a_deep_override_is_refused_not_a_crash() {
        for levels in [9, 20_000, 43_000] {
            let key = format!("HOOKLINE_KAFKA{}", "__A".repeat(levels - 1));
            let err = Config::from_toml_with_env(MIN, ORIGIN, vec![(key, "1".to_string())])
                .expect_err("too deep");
            assert!(err.to_string().contains("HOOKLINE_KAFKA__A__A"), "{err}");
            assert!(err.to_string().len() < 400, "{err}");
        }
        let key = format!("HOOKLINE_KAFKA{}", "__OPTIONS".repeat(7));
        let err = Config::from_toml_with_env(MIN, ORIGIN, vec![(key, "1".to_string())])
            .expect_err("8 levels: no such key, but not too deep");
        assert!(err.to_string().contains("kafka.options"), "{err}");
    }

    fn arbitrary_text(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let text: String = if u.ratio(1, 2)? {
            u.arbitrary()?
        } else {
            String::from_utf8_lossy(u.arbitrary::<&[u8]>()?).into_owned()
        };
        check(&text, &[]);
        check(&format!("{MIN}{text}"), &[]);
        Ok(())
    }

    /// A TOML value literal: scalars at the edges of what the fields take, arrays, inline
    /// tables, dates, nesting past the parser's depth limit, or any text.
    fn literal(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
        const LITERALS: &[&str] = &[
            "0",
            "1",
            "-1",
            "2",
            "3",
            "32",
            "33",
            "1000",
            "10000",
            "10001",
            "100000",
            "100001",
            "1048576",
            "1048577",
            "4194304",
            "4194305",
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "0x7fffffffffffffff",
            "0o17",
            "1_000",
            "1.5",
            "-0.0",
            "nan",
            "+inf",
            "-inf",
            "1e308",
            "true",
            "false",
            "1979-05-27T07:32:00Z",
            "07:32:00",
            "1979-05-27",
            "[]",
            "{}",
            "[1, \"a\"]",
            "{ a = 1 }",
            "[[]]",
            "\"\"",
            "''",
        ];
        Ok(match u.int_in_range(0..=9)? {
            0..=2 => u.choose(LITERALS)?.to_string(),
            3..=5 => quoted(&string(u)?),
            6 => {
                let mut items = Vec::new();
                for _ in 0..u.int_in_range(0..=4)? {
                    items.push(if u.ratio(3, 4)? {
                        quoted(&string(u)?)
                    } else {
                        literal(u)?
                    });
                }
                format!("[{}]", items.join(", "))
            }
            7 => {
                let n = u.int_in_range(1..=200)?;
                let (open, close) = if u.arbitrary()? {
                    ("[", "]")
                } else {
                    ("{ a = ", " }")
                };
                format!("{}1{}", open.repeat(n), close.repeat(n))
            }
            8 => format!(
                "{{ {} = {} }}",
                key(u, "x")?,
                u.choose(&["1", "\"s\"", "[]"])?
            ),
            _ => u.arbitrary()?,
        })
    }

    /// A string for a string field: durations, addresses, CIDRs, URLs, secrets, scopes, globs
    /// and pointers at their edges, or any text.
    fn string(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
        const STRINGS: &[&str] = &[
            "",
            " ",
            "0s",
            "1ms",
            "999us",
            "1ns",
            "1s",
            "5s",
            "59s",
            "1m",
            "5m",
            "24h",
            "7d",
            "1y",
            "18446744073709551615s",
            "18446744073709551615s 999ms",
            "584942417355y",
            "1.5s",
            "-1s",
            "10 seconds",
            "127.0.0.1:9092",
            "[::1]:80",
            "0.0.0.0:0",
            "localhost",
            "127.0.0.0/8",
            "::ffff:0:0/96",
            "10.0.0.1/33",
            "https://example.com/hook",
            "http://[::1]:8080/x",
            "ftp://x",
            "https://u:p@x/",
            "http://",
            "https://x y",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_",
            "whsec_!!!",
            "admin",
            "tenant:acme",
            "tenant:",
            "tenant: x",
            "json",
            "pretty",
            "info,hookline=debug",
            "/data/x",
            "data/x",
            "*",
            "a.*",
            "é",
            "\0",
            "webhooks",
            "a..b",
            "0000000000000000000000000000000000000000000000000000000000000000",
        ];
        if u.ratio(3, 4)? {
            Ok(u.choose(STRINGS)?.to_string())
        } else {
            u.arbitrary()
        }
    }

    /// `s` as a TOML string.
    fn quoted(s: &str) -> String {
        toml::Value::String(s.to_string()).to_string()
    }

    fn key(u: &mut Unstructured<'_>, real: &str) -> arbitrary::Result<String> {
        Ok(match u.int_in_range(0..=9)? {
            0 => quoted(&u.arbitrary::<String>()?),
            1 => "\"\"".to_string(),
            2 => format!("{real}.x"),
            _ => real.to_string(),
        })
    }

    /// A file of the real sections (some twice, some as the wrong kind of table), real keys
    /// (and others) with values from [`literal`]; `[kafka]` is usually valid so that the
    /// sections after it are reached.
    fn real_sections(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let mut text = String::new();
        if u.ratio(4, 5)? {
            text.push_str(MIN);
        }
        for _ in 0..u.int_in_range(0..=6)? {
            let (section, keys) = *u.choose(SECTIONS)?;
            let header = if u.ratio(1, 10)? {
                section.trim_matches(['[', ']']).to_string()
            } else {
                section.to_string()
            };
            text.push_str(&format!("[{header}]\n"));
            for _ in 0..u.int_in_range(0..=5)? {
                let real = *u.choose(keys)?;
                let k = key(u, real)?;
                text.push_str(&format!("{k} = {}\n", literal(u)?));
            }
        }
        check(&text, &[]);
        Ok(())
    }

    /// The example file with lines dropped, doubled or given other values, sections inserted,
    /// or cut anywhere.
    fn edited_example(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let mut lines: Vec<String> = EXAMPLE.lines().map(str::to_string).collect();
        for _ in 0..u.int_in_range(1..=4)? {
            let at = u.choose_index(lines.len())?;
            match u.int_in_range(0..=5)? {
                0 => {
                    lines.remove(at);
                }
                1 => {
                    let line = lines[at].clone();
                    lines.insert(at, line);
                }
                2 | 3 => {
                    if let Some((k, _)) = lines[at].split_once('=') {
                        lines[at] = format!("{k}= {}", literal(u)?);
                    }
                }
                4 => {
                    let (section, keys) = *u.choose(SECTIONS)?;
                    let line = format!("[{section}]\n{} = {}", u.choose(keys)?, literal(u)?);
                    lines.insert(at, line);
                }
                _ => {
                    let cut = u.choose_index(lines[at].len() + 1)?;
                    let line = &lines[at];
                    let cut = (0..=cut)
                        .rev()
                        .find(|i| line.is_char_boundary(*i))
                        .unwrap_or(0);
                    lines[at].truncate(cut);
                }
            }
            if lines.is_empty() {
                break;
            }
        }
        check(&lines.join("\n"), &[]);
        Ok(())
    }

    /// `HOOKLINE_…` variables: real section and key names (in any case), kafka options,
    /// single underscores, empty and deep paths, Kubernetes service links, reserved names,
    /// with values from [`literal`] and [`string`], on the example file or the minimal one.
    fn overrides(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let base = if u.arbitrary()? { EXAMPLE } else { MIN };
        let mut env = Vec::new();
        for _ in 0..u.int_in_range(1..=6)? {
            let key = match u.int_in_range(0..=9)? {
                0 => format!("HOOKLINE_{}", u.arbitrary::<String>()?),
                1 => u
                    .choose(&[
                        "HOOKLINE_SERVICE_HOST",
                        "HOOKLINE_PORT",
                        "HOOKLINE_DISPATCHER_PORT_9464_TCP_ADDR",
                        "HOOKLINE_KAFKA_BOOTSTRAP_SERVERS",
                        "HOOKLINE_KAFKA_OPTIONS_SASL_PASSWORD",
                        "HOOKLINE_CONFIG",
                        "HOOKLINE_TEST_X",
                        "HOOKLINE_SECRETS_KEY",
                        "HOOKLINE_",
                        "HOOKLINE___",
                        "HOOKLINE_KAFKA__",
                        "HOOKLINE___KAFKA",
                    ])?
                    .to_string(),
                _ => {
                    let (section, keys) = *u.choose(SECTIONS)?;
                    let mut segments: Vec<String> =
                        vec![section.trim_matches(['[', ']']).replace('.', "__")];
                    for _ in 0..u.int_in_range(0..=3)? {
                        segments.push(u.choose(keys)?.replace('.', "_"));
                    }
                    if u.ratio(1, 10)? {
                        segments.push(u.arbitrary()?);
                    }
                    if u.ratio(1, 20)? {
                        // Deep: up to the longest variable Linux takes (128 KiB).
                        let levels = if u.arbitrary()? {
                            u.int_in_range(4..=12)?
                        } else {
                            u.int_in_range(1_000..=40_000)?
                        };
                        segments.extend(std::iter::repeat_n("A".to_string(), levels));
                    }
                    let joined = segments.join(if u.ratio(1, 10)? { "_" } else { "__" });
                    let joined = if u.arbitrary()? {
                        joined.to_ascii_uppercase()
                    } else {
                        joined
                    };
                    format!("HOOKLINE_{joined}")
                }
            };
            let value = if u.arbitrary()? {
                literal(u)?
            } else {
                string(u)?
            };
            env.push((key, value));
        }
        check(base, &env);
        Ok(())
    }
}
