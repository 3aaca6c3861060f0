//! Hostile input at scale: every class of input a broken or malicious producer sends, interleaved
//! by the hundred (two dozen of them several MB) with the mixed stream, under `run all` on the
//! cluster. Each record the envelope contract refuses must land on `<p>.invalid` with the reason
//! the contract names (whole, or as the bounded `record_too_large` copy); each one it accepts (an
//! id exactly at its limit, duplicate names where the last is valid, CR/LF in a value that never
//! becomes an HTTP header…) must be delivered, its body intact; no request may carry an injected
//! header; the process must not exit; the ledger balances. "Throughput holds" is measured, not
//! asserted: the valid events' delivery rate and end-to-end latency during the hostile phase
//! (the whole produce phase: the hostile records are spread over it) against the offered rate,
//! and the process's peak RSS.
//!
//! What decides a record's fate, in stage A's order (deduper/src/validate.rs):
//! 1. admission (common/src/kafka/recordsize.rs): a key over `input.max_key_bytes` (16 KiB), or key +
//!    value + producer headers + `HEADER_RESERVE` (32 KiB) over the smallest `max.message.bytes`
//!    on the record's way (5 MiB, set on every topic by `topics apply`) → `record_too_large`;
//! 2. the envelope (common/src/contract/envelope.rs): a value over `input.max_payload_bytes` (512 KiB) →
//!    `payload_too_large` before any parsing; then `not_json` (not UTF-8, not JSON, nesting past
//!    serde_json's 127 levels, numbers out of range), `not_object`, `missing_id`, `bad_id` (not a
//!    string, empty, over 256 bytes, anything but printable ASCII without `.`: the id becomes the
//!    `webhook-id` header, the only envelope field that does), `missing_type`, `bad_type`,
//!    `bad_tenant` (not a string of 1..=256 bytes; `null` is no tenant). Duplicate names: the last
//!    one wins (serde_json's `Value`, the contract envelope.rs states).
//!
//! The multi-MB records are as large as the events topic accepts: the broker compares each record
//! batch with the topic's `max.message.bytes` (5 MiB), so a record one byte larger is refused by
//! Kafka and never reaches hookline — the test produces one and asserts that refusal.
//!
//! Found by this test and fixed: serde_json's raw-value token let an event without an id through
//! (envelope::parse_plain); a record with ~100,000 headers lost a valid event and a non-UTF-8
//! header name crashed stage A (both now `bad_headers`, deduper/src/headers.rs).
//! Knobs: `HOOKLINE_TEST_HOSTILE_EVENTS`
//! unique events [1600], `HOOKLINE_TEST_FAULT_RATE` records per second [80],
//! `HOOKLINE_TEST_HOSTILE_COPIES` copies of each small hostile variant [3].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use hookline_common::config::InputConfig;
use hookline_common::contract::envelope::{MAX_ID_BYTES, MAX_NAME_BYTES};
use hookline_common::contract::headers as h;
use hookline_common::contract::topics::MAX_MESSAGE_BYTES;
use hookline_common::kafka::recordsize::{headers_bytes, record_bytes, HEADER_RESERVE};

use crate::harness;
use crate::ledger;
use crate::procs::Hookline;
use crate::receiver::Receiver;
use crate::scenario::{env_or, Options, Scenario};
use crate::stream::{Rec, Stream};

const MIB: usize = 1 << 20;
/// `max.message.bytes` of every topic `topics apply` creates, and hookline's producer limit: the
/// events topic's limit and the admission limit of stage A.
const LIMIT: usize = MAX_MESSAGE_BYTES;
/// Every hostile record key starts with its tag and `|`: `hx0042|`.
const KEY_HEAD: usize = 7;
/// The header name an injection would create.
const INJECTED: &str = "X-Hostile-Injected";
const TOKEN_KEY: &str = "$serde_json::private::RawValue";

const UTF8: &str = "invalid UTF-8";
const NESTING: &str = "deep nesting";
const BIG_VALUES: &str = "multi-MB values";
const BIG_KEYS: &str = "multi-MB keys";
const HEADERS: &str = "huge or many headers";
const NUMBERS: &str = "numbers where strings belong";
const DUPLICATES: &str = "duplicate JSON keys";
const CRLF: &str = "CR/LF where a value becomes an HTTP header";
const LIMITS: &str = "ids at and past every length limit";
const TOKEN: &str = "parser differential (serde_json raw-value token)";

/// What hookline's contract says becomes of a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Valid: delivered to every endpoint with this `webhook-id`, the body byte for byte.
    Deliver(String),
    /// Quarantined on `<p>.invalid` with this `hookline-invalid-reason`.
    Quarantine(&'static str),
}

impl Expect {
    /// Whether `observed` ("delivered", "quarantined <reason>", "missing") is what this allows.
    fn allows(&self, observed: &str) -> bool {
        observed == self.to_string()
    }

    /// The id it is delivered under, if it may be delivered.
    fn id(&self) -> Option<&String> {
        match self {
            Expect::Deliver(id) => Some(id),
            Expect::Quarantine(_) => None,
        }
    }
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expect::Deliver(_) => write!(f, "delivered"),
            Expect::Quarantine(r) => write!(f, "quarantined {r}"),
        }
    }
}

/// One hostile record and what must become of it.
pub struct Hostile {
    /// `hx0042`: the start of the record key (up to `|`), kept by every quarantine record.
    pub tag: String,
    pub class: &'static str,
    pub what: String,
    pub expect: Expect,
    /// A record the contract refuses but that a parser differential may let through: the id
    /// hookline would deliver it under.
    pub smuggled: Option<String>,
    /// An id that must never be delivered (a duplicate name's first value, a spoofed header).
    pub decoy: Option<String>,
    /// Key + value + header names and values.
    pub bytes: usize,
    /// The record batch the broker compares with `max.message.bytes`.
    pub wire: usize,
    /// Several MB: spread evenly through the stream.
    pub big: bool,
    /// Produced alone before the stream (the largest record the topic accepts).
    pub direct: bool,
    /// The value, kept for a record that must be delivered.
    pub body: Option<Vec<u8>>,
    /// What a whole quarantine copy must keep.
    pub original: Original,
    /// A header name that is not UTF-8 (`Rec` cannot hold one): added through librdkafka's C API.
    pub raw_header_name: Option<Vec<u8>>,
    rec: Option<Rec>,
}

/// What a quarantine copy is checked against: key and value (hashed), and the producer's
/// headers (`hookline-*` aside: stage A drops those) by number and bytes.
#[derive(Clone, Copy, Default)]
pub struct Original {
    pub key_len: usize,
    pub key_hash: u64,
    pub value_len: usize,
    pub value_hash: u64,
    pub headers: usize,
    pub headers_bytes: usize,
}

fn hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// What one generator variant builds (the key after its `<tag>|` head).
struct Case {
    key: Vec<u8>,
    value: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    expect: Expect,
    smuggled: Option<String>,
    decoy: Option<String>,
    raw_header_name: Option<Vec<u8>>,
}

fn ok(id: &str, value: Vec<u8>) -> Case {
    Case {
        key: Vec::new(),
        value,
        headers: Vec::new(),
        expect: Expect::Deliver(id.to_owned()),
        smuggled: None,
        decoy: None,
        raw_header_name: None,
    }
}

fn bad(reason: &'static str, value: Vec<u8>) -> Case {
    Case {
        expect: Expect::Quarantine(reason),
        ..ok("", value)
    }
}

impl Case {
    fn key(mut self, tail: Vec<u8>) -> Case {
        self.key = tail;
        self
    }
    fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Case {
        self.headers.push((name.into(), value.into()));
        self
    }
    fn headers(mut self, hs: Vec<(String, Vec<u8>)>) -> Case {
        self.headers.extend(hs);
        self
    }
    fn smuggles(mut self, id: &str) -> Case {
        self.smuggled = Some(id.to_owned());
        self
    }
    fn decoy(mut self, id: String) -> Case {
        self.decoy = Some(id);
        self
    }
    fn raw_header_name(mut self, name: &[u8]) -> Case {
        self.raw_header_name = Some(name.to_vec());
        self
    }
}

/// Builds the hostile records: tags in order, ids `<prefix>-<tag>`.
struct Gen {
    prefix: String,
    next: usize,
    out: Vec<Hostile>,
    big: bool,
    direct: bool,
}

impl Gen {
    fn add(&mut self, class: &'static str, what: &str, build: impl FnOnce(&str, &str) -> Case) {
        let tag = format!("hx{:04}", self.next);
        self.next += 1;
        let id = format!("{}-{tag}", self.prefix);
        let case = build(&tag, &id);
        let mut key = format!("{tag}|").into_bytes();
        key.extend(case.key);
        let rec = Rec {
            key,
            value: case.value,
            headers: case.headers,
        };
        let bytes = rec.key.len()
            + rec.value.len()
            + rec
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        let wire = batch_bytes(&rec);
        let body = case.expect.id().map(|_| rec.value.clone());
        let carried: Vec<&(String, Vec<u8>)> = rec
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with("hookline-"))
            .collect();
        let original = Original {
            key_len: rec.key.len(),
            key_hash: hash(&rec.key),
            value_len: rec.value.len(),
            value_hash: hash(&rec.value),
            headers: carried.len(),
            headers_bytes: headers_bytes(carried.iter().map(|(k, v)| (k.as_str(), v.len()))),
        };
        self.out.push(Hostile {
            tag,
            class,
            what: what.to_owned(),
            expect: case.expect,
            smuggled: case.smuggled,
            decoy: case.decoy,
            bytes,
            wire,
            big: self.big,
            direct: self.direct,
            body,
            original,
            raw_header_name: case.raw_header_name,
            rec: Some(rec),
        });
    }
}

/// A JSON string literal.
fn js(s: &str) -> String {
    serde_json::to_string(s).expect("a JSON string")
}

/// `{"id":…,"type":…,<members>}`.
fn ev_with(id: &str, ty: &str, members: &str) -> Vec<u8> {
    format!(r#"{{"id":{},"type":{},{members}}}"#, js(id), js(ty)).into_bytes()
}

fn ev(id: &str, ty: &str) -> Vec<u8> {
    ev_with(id, ty, r#""data":{}"#)
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// An event whose `data` string holds `raw` bytes as they are.
fn raw_in_data(id: &str, raw: &[u8]) -> Vec<u8> {
    cat(&[
        format!(r#"{{"id":{},"type":"hostile.utf8","data":""#, js(id)).as_bytes(),
        raw,
        br#""}"#,
    ])
}

/// `open` n times, `leaf`, `close` n times.
fn nested(open: &str, leaf: &str, close: &str, n: usize) -> String {
    format!("{}{leaf}{}", open.repeat(n), close.repeat(n))
}

/// Arrays `brackets` deep around an object whose only name is serde_json's raw-value token and
/// whose value is the same structure as a string, `levels` times: a JSON parser sees
/// `brackets` + 1 levels and a string; serde_json's `Value` reads each string as JSON again, each
/// with a fresh depth budget.
fn token_nest(levels: usize, brackets: usize) -> String {
    let mut inner = nested("[", "", "]", brackets);
    for _ in 0..levels {
        inner = nested(
            "[",
            &format!("{{{}:{}}}", js(TOKEN_KEY), js(&inner)),
            "]",
            brackets,
        );
    }
    inner
}

/// `n` pseudo-random bytes: hex digits (`hex`, incompressible for lz4) or any byte (not UTF-8).
fn noise(n: usize, hex: bool, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if hex {
            out.extend(format!("{x:016x}").bytes());
        } else {
            out.extend(x.to_le_bytes());
        }
    }
    out.truncate(n);
    if !hex && n > 0 {
        out[0] = 0xff;
    }
    out
}

/// A valid event of exactly `len` bytes, `data` a string of filler.
fn event_of_len(id: &str, ty: &str, len: usize, hex: bool) -> Vec<u8> {
    let head = format!(r#"{{"id":{},"type":{},"data":""#, js(id), js(ty));
    let pad = len - head.len() - 2;
    let fill = if hex {
        noise(pad, true, len as u64)
    } else {
        vec![b'x'; pad]
    };
    cat(&[head.as_bytes(), &fill, b"\"}"])
}

/// `s` padded with `c` to `len` bytes.
fn pad(s: &str, len: usize, c: char) -> String {
    let mut s = s.to_owned();
    while s.len() < len {
        s.push(c);
    }
    s
}

fn varint_len(n: usize) -> usize {
    let mut z = (n as u64) << 1;
    let mut len = 1;
    while z >= 0x80 {
        z >>= 7;
        len += 1;
    }
    len
}

/// The bytes of an uncompressed record batch (format v2) holding only a record of these sizes:
/// what the broker compares with the topic's `max.message.bytes`. 61 bytes of batch header; the
/// record: its length, attributes, timestamp and offset deltas (0), key, value, headers.
fn batch_len(key: usize, value: usize, headers: &[(usize, usize)]) -> usize {
    let mut body = 3 + varint_len(key) + key + varint_len(value) + value;
    body += varint_len(headers.len());
    for (k, v) in headers {
        body += varint_len(*k) + k + varint_len(*v) + v;
    }
    61 + varint_len(body) + body
}

fn batch_bytes(rec: &Rec) -> usize {
    let hs: Vec<(usize, usize)> = rec
        .headers
        .iter()
        .map(|(k, v)| (k.len(), v.len()))
        .collect();
    batch_len(rec.key.len(), rec.value.len(), &hs)
}

/// What stage A's admission counts (producer headers as `headers` bytes, `hookline-*` aside).
fn admission_len(key: usize, value: usize, headers: usize) -> usize {
    record_bytes(key, value, headers) + HEADER_RESERVE
}

/// The largest `n` with `f(n) <= limit` (`f` nondecreasing, `f(0) <= limit`).
fn largest(limit: usize, f: impl Fn(usize) -> usize) -> usize {
    let (mut lo, mut hi) = (0, limit);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if f(mid) <= limit {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The length of the largest valid-JSON event value the events topic accepts under a
/// `KEY_HEAD`-byte key and no headers.
fn topic_value_len() -> usize {
    largest(LIMIT, |v| batch_len(KEY_HEAD, v, &[]))
}

/// The hostile records: the small variants `copies` times, the multi-MB ones once.
pub fn generate(prefix: &str, copies: usize) -> Vec<Hostile> {
    let mut g = Gen {
        prefix: prefix.to_owned(),
        next: 0,
        out: Vec::new(),
        big: true,
        direct: false,
    };
    big(&mut g);
    g.big = false;
    for copy in 0..copies {
        small(&mut g, copy);
    }
    g.out
}

/// The multi-MB records (and the largest the topic accepts, produced alone first).
fn big(g: &mut Gen) {
    let t = "hostile.big";
    let topic_value = topic_value_len();
    g.direct = true;
    g.add(
        BIG_VALUES,
        "largest event the events topic accepts (batch = max.message.bytes), produced alone",
        |_, id| bad("record_too_large", event_of_len(id, t, topic_value, false)),
    );
    g.add(
        HEADERS,
        "a header name that is not UTF-8 (x-\\xFF\\xFE), valid event, produced alone",
        |_, id| bad("bad_headers", ev(id, t)).raw_header_name(b"x-\xff\xfe"),
    );
    g.direct = false;
    g.add(BIG_VALUES, "1 MiB event", |_, id| {
        bad("payload_too_large", event_of_len(id, t, MIB, false))
    });
    g.add(BIG_VALUES, "2 MiB event, incompressible", |_, id| {
        bad("payload_too_large", event_of_len(id, t, 2 * MIB, true))
    });
    g.add(BIG_VALUES, "3 MiB of random bytes (not UTF-8)", |_, _| {
        bad("payload_too_large", noise(3 * MIB, false, 3))
    });
    g.add(BIG_VALUES, "4 MiB event", |_, id| {
        bad("payload_too_large", event_of_len(id, t, 4 * MIB, false))
    });
    g.add(BIG_VALUES, "4.5 MiB event, incompressible", |_, id| {
        bad("payload_too_large", event_of_len(id, t, 9 * MIB / 2, true))
    });
    let admitted = largest(LIMIT, |v| admission_len(KEY_HEAD, v, 0));
    g.add(
        BIG_VALUES,
        "largest event admitted (record + header reserve = 5 MiB): whole on <p>.invalid",
        |_, id| bad("payload_too_large", event_of_len(id, t, admitted, false)),
    );
    g.add(BIG_VALUES, "one byte past admission", |_, id| {
        bad("record_too_large", event_of_len(id, t, admitted + 1, false))
    });
    g.add(
        BIG_VALUES,
        "largest event the events topic accepts, incompressible",
        |_, id| bad("record_too_large", event_of_len(id, t, topic_value, true)),
    );
    g.add(
        BIG_VALUES,
        "largest value the events topic accepts, random bytes",
        |_, _| bad("record_too_large", noise(topic_value, false, 7)),
    );
    g.add(NESTING, "2 MiB of '['", |_, _| {
        bad("payload_too_large", vec![b'['; 2 * MIB])
    });

    for (what, len) in [("1 MiB key", MIB), ("3 MiB key", 3 * MIB)] {
        g.add(BIG_KEYS, &format!("{what}, valid event"), |_, id| {
            bad("record_too_large", ev(id, t)).key(vec![b'k'; len - KEY_HEAD])
        });
    }
    g.add(
        BIG_KEYS,
        "largest key the events topic accepts, valid event",
        |_, id| {
            let value = ev(id, t);
            let key = largest(LIMIT, |k| batch_len(k, value.len(), &[]));
            bad("record_too_large", value).key(vec![b'k'; key - KEY_HEAD])
        },
    );
    g.add(BIG_KEYS, "2 MiB key and a 2 MiB event", |_, id| {
        bad("record_too_large", event_of_len(id, t, 2 * MIB, false)).key(vec![b'k'; 2 * MIB])
    });

    for (what, len) in [("one 1 MiB header", MIB), ("one 4 MiB header", 4 * MIB)] {
        g.add(HEADERS, &format!("{what}, valid event"), |_, id| {
            ok(id, ev(id, t)).header("x-big", noise(len, true, len as u64))
        });
    }
    g.add(
        HEADERS,
        "one header making the largest record admitted, valid event (travels every hop)",
        |_, id| {
            let value = ev(id, t);
            let h = largest(LIMIT, |h| {
                admission_len(KEY_HEAD, value.len(), headers_bytes([("x-pad", h)]))
            });
            ok(id, value).header("x-pad", noise(h, true, 11))
        },
    );
    g.add(HEADERS, "one byte more", |_, id| {
        let value = ev(id, t);
        let h = largest(LIMIT, |h| {
            admission_len(KEY_HEAD, value.len(), headers_bytes([("x-pad", h)]))
        });
        bad("record_too_large", value).header("x-pad", noise(h + 1, true, 11))
    });
    g.add(
        HEADERS,
        "one header as large as the events topic accepts, valid event",
        |_, id| {
            let value = ev(id, t);
            let h = largest(LIMIT, |h| batch_len(KEY_HEAD, value.len(), &[(5, h)]));
            bad("record_too_large", value).header("x-pad", vec![b'h'; h])
        },
    );
    g.add(
        HEADERS,
        "3 MiB header and a 600 KB event: whole on <p>.invalid",
        |_, id| {
            bad("payload_too_large", event_of_len(id, t, 600_000, false))
                .header("x-big", vec![b'h'; 3 * MIB])
        },
    );
    // librdkafka reads at most 100,000 headers of a consumed record; stage A adds 3 (id, type,
    // dedupe key) to an event without a tenant, a quarantine 5.
    let many = |n: usize| -> Vec<(String, Vec<u8>)> {
        (0..n).map(|i| (format!("h{i}"), b"v".to_vec())).collect()
    };
    // Stage A carries at most 1,000 headers (deduper/src/headers.rs); librdkafka cannot parse
    // more than 100,000 at all. Headers are judged before anything else.
    g.add(HEADERS, "1,000 headers, valid event", |_, id| {
        ok(id, ev(id, t)).headers(many(1_000))
    });
    g.add(HEADERS, "1,001 headers, valid event", |_, id| {
        bad("bad_headers", ev(id, t)).headers(many(1_001))
    });
    g.add(HEADERS, "99,998 headers, valid event", |_, id| {
        bad("bad_headers", ev(id, t)).headers(many(99_998))
    });
    g.add(
        HEADERS,
        "100,001 headers, valid event (librdkafka cannot parse them)",
        |_, id| bad("bad_headers", ev(id, t)).headers(many(100_001)),
    );
    g.add(HEADERS, "99,996 headers, not JSON", |_, _| {
        bad("bad_headers", b"{not json".to_vec()).headers(many(99_996))
    });
    g.add(HEADERS, "150,000 headers, not JSON", |_, _| {
        bad("bad_headers", b"{not json".to_vec()).headers(many(150_000))
    });
}

/// The small variants, one copy.
fn small(g: &mut Gen, copy: usize) {
    let input = InputConfig::default();
    let t = "hostile.small";

    // Invalid UTF-8: never JSON (serde_json insists on UTF-8, in strings and out).
    for (what, raw) in [
        ("0xFF 0xFE inside a string", &b"\xff\xfe"[..]),
        ("overlong encoding C0 AF", b"a\xc0\xafb"),
        ("UTF-8-encoded surrogate ED A0 80", b"\xed\xa0\x80"),
        ("truncated sequence E2 82", b"\xe2\x82"),
        ("5-byte lead F8", b"\xf8\x88\x80\x80\x80"),
    ] {
        g.add(UTF8, what, |_, id| bad("not_json", raw_in_data(id, raw)));
    }
    g.add(UTF8, "invalid byte inside the id", |_, id| {
        bad(
            "not_json",
            cat(&[
                br#"{"id":""#,
                id.as_bytes(),
                b"\xff",
                br#"","type":"hostile.utf8","data":{}}"#,
            ]),
        )
    });
    g.add(UTF8, "Latin-1 byte in the type", |_, id| {
        bad(
            "not_json",
            cat(&[
                format!(r#"{{"id":{},"type":"caf"#, js(id)).as_bytes(),
                b"\xe9",
                br#"","data":{}}"#,
            ]),
        )
    });
    g.add(UTF8, "UTF-16LE with a BOM", |_, id| {
        let text = String::from_utf8(ev(id, t)).expect("utf-8");
        let mut v = vec![0xff, 0xfe];
        for u in text.encode_utf16() {
            v.extend(u.to_le_bytes());
        }
        bad("not_json", v)
    });
    g.add(UTF8, "UTF-8 BOM before a valid event", |_, id| {
        bad("not_json", cat(&[b"\xef\xbb\xbf", &ev(id, t)]))
    });
    g.add(UTF8, "escaped lone surrogate \\ud800", |_, id| {
        bad("not_json", ev_with(id, t, r#""data":"\ud800x""#))
    });
    g.add(UTF8, "raw NUL byte between members", |_, id| {
        bad(
            "not_json",
            cat(&[
                format!(r#"{{"id":{},"#, js(id)).as_bytes(),
                b"\x00",
                br#""type":"hostile.utf8"}"#,
            ]),
        )
    });
    g.add(UTF8, "empty value", |_, _| bad("not_json", Vec::new()));
    g.add(
        UTF8,
        "valid: invalid UTF-8 in the record key and a header value",
        |_, id| {
            ok(id, ev(id, t))
                .key(b"\xff\xfe\xc0".to_vec())
                .header("x-binary", b"\xff\x00\xfe".to_vec())
        },
    );
    g.add(
        UTF8,
        "valid: escaped non-ASCII (\\u00e9, a surrogate pair) in type and data",
        |_, id| {
            ok(
                id,
                format!(
                    r#"{{"id":{},"type":"hostile.caf\u00e9","data":"\ud83d\ude00"}}"#,
                    js(id)
                )
                .into_bytes(),
            )
        },
    );

    // Deep nesting: serde_json stops at 127 levels (a recursion limit, not a stack overflow).
    g.add(NESTING, "valid: depth 127, the parser's limit", |_, id| {
        ok(
            id,
            ev_with(id, t, &format!(r#""data":{}"#, nested("[", "", "]", 126))),
        )
    });
    for (what, n) in [
        ("depth 128", 127),
        ("10,000 nested arrays", 10_000),
        ("200,000 nested arrays (400 KB)", 200_000),
    ] {
        g.add(NESTING, what, |_, id| {
            bad(
                "not_json",
                ev_with(id, t, &format!(r#""data":{}"#, nested("[", "", "]", n))),
            )
        });
    }
    g.add(NESTING, "80,000 nested objects (480 KB)", |_, id| {
        bad(
            "not_json",
            ev_with(
                id,
                t,
                &format!(r#""data":{}"#, nested(r#"{"a":"#, "0", "}", 80_000)),
            ),
        )
    });
    g.add(NESTING, "top-level array 1,000 deep", |_, _| {
        bad("not_json", nested("[", "", "]", 1_000).into_bytes())
    });
    g.add(NESTING, "the id nested 300 deep", |_, _| {
        bad(
            "not_json",
            format!(
                r#"{{"id":{},"type":"hostile.nesting"}}"#,
                nested("[", "\"x\"", "]", 300)
            )
            .into_bytes(),
        )
    });
    g.add(
        NESTING,
        "valid: ~2,000 levels for serde_json via the raw-value token (126 for JSON; 267 KB)",
        |_, id| {
            ok(
                id,
                ev_with(id, t, &format!(r#""data":{}"#, token_nest(16, 124))),
            )
        },
    );

    // Huge or many headers (the small ones; the multi-MB ones are in `big`).
    g.add(HEADERS, "valid: 1,000 headers of one name", |_, id| {
        ok(id, ev(id, t)).headers(
            (0..1_000)
                .map(|i| ("x-same".to_owned(), format!("{i}").into_bytes()))
                .collect(),
        )
    });
    g.add(
        HEADERS,
        "valid: spoofed hookline-event-id / -invalid-reason / -dedupe-key headers",
        |_, id| {
            let spoof = format!("{id}-spoofed");
            ok(id, ev(id, t))
                .header(h::EVENT_ID, spoof.clone())
                .header(h::INVALID_REASON, "spoofed")
                .header(h::DEDUPE_KEY, "id|-|5:spoof")
                .decoy(spoof)
        },
    );
    g.add(
        HEADERS,
        "valid: Hookline-Event-Id spoofed in another case",
        |_, id| {
            let spoof = format!("{id}-spoofed");
            ok(id, ev(id, t))
                .header("Hookline-Event-Id", spoof.clone())
                .decoy(spoof)
        },
    );
    g.add(
        HEADERS,
        "spoofed hookline-invalid-reason on an event without a type",
        |_, id| {
            bad(
                "missing_type",
                format!(r#"{{"id":{},"data":{{}}}}"#, js(id)).into_bytes(),
            )
            .header(h::INVALID_REASON, "spoofed")
        },
    );
    g.add(
        HEADERS,
        "20 KiB of headers on an event without a type",
        |_, id| {
            bad(
                "missing_type",
                format!(r#"{{"id":{},"data":{{}}}}"#, js(id)).into_bytes(),
            )
            .headers(
                (0..20)
                    .map(|i| (format!("x-{i}"), vec![b'h'; 1024]))
                    .collect(),
            )
        },
    );

    // Numbers (and other non-strings) where strings belong.
    for (what, lit, reason) in [
        ("id 7", "7", "bad_id"),
        ("id -1.5e10", "-1.5e10", "bad_id"),
        ("id 18446744073709551617", "18446744073709551617", "bad_id"),
        ("id 1e400 (out of range)", "1e400", "not_json"),
        ("id true", "true", "bad_id"),
        ("id null", "null", "bad_id"),
        ("id [\"x\"]", r#"["x"]"#, "bad_id"),
        ("id {}", "{}", "bad_id"),
    ] {
        g.add(NUMBERS, what, |_, _| {
            bad(
                reason,
                format!(r#"{{"id":{lit},"type":"hostile.numbers","data":{{}}}}"#).into_bytes(),
            )
        });
    }
    for (what, lit) in [
        ("type 3", "3"),
        ("type null", "null"),
        ("type 1.0", "1.0"),
        ("type {\"a\":1}", r#"{"a":1}"#),
    ] {
        g.add(NUMBERS, what, |_, id| {
            bad(
                "bad_type",
                format!(r#"{{"id":{},"type":{lit},"data":{{}}}}"#, js(id)).into_bytes(),
            )
        });
    }
    for (what, lit) in [
        ("tenant 5", "5"),
        ("tenant 0", "0"),
        ("tenant false", "false"),
    ] {
        g.add(NUMBERS, what, |_, id| {
            bad(
                "bad_tenant",
                ev_with(id, t, &format!(r#""tenant":{lit},"data":{{}}"#)),
            )
        });
    }
    g.add(NUMBERS, "valid: tenant null (no tenant)", |_, id| {
        ok(id, ev_with(id, t, r#""tenant":null,"data":{}"#))
    });
    g.add(NUMBERS, "valid: an id of digits (a string)", |tag, _| {
        let digits = format!("90{}", &tag[2..]);
        ok(&digits, ev(&digits, t))
    });

    // Duplicate names: the last one wins (serde_json's `Value`; envelope.rs says so).
    g.add(
        DUPLICATES,
        "valid: id twice, a decoy id first (the last wins)",
        |_, id| {
            let decoy = format!("{id}-decoy");
            ok(
                id,
                format!(
                    r#"{{"id":{},"id":{},"type":"hostile.duplicates","data":{{}}}}"#,
                    js(&decoy),
                    js(id)
                )
                .into_bytes(),
            )
            .decoy(decoy)
        },
    );
    g.add(DUPLICATES, "valid: id 7, then a string id", |_, id| {
        ok(
            id,
            format!(r#"{{"id":7,"id":{},"type":"hostile.duplicates"}}"#, js(id)).into_bytes(),
        )
    });
    g.add(DUPLICATES, "a string id, then id 7", |_, id| {
        bad(
            "bad_id",
            format!(r#"{{"id":{},"id":7,"type":"hostile.duplicates"}}"#, js(id)).into_bytes(),
        )
    });
    g.add(DUPLICATES, "type twice, the last empty", |_, id| {
        bad(
            "bad_type",
            format!(
                r#"{{"id":{},"type":"hostile.duplicates","type":""}}"#,
                js(id)
            )
            .into_bytes(),
        )
    });
    g.add(DUPLICATES, "valid: type twice, both valid", |_, id| {
        ok(
            id,
            format!(
                r#"{{"id":{},"type":"hostile.duplicates","type":"hostile.duplicates.last"}}"#,
                js(id)
            )
            .into_bytes(),
        )
    });
    g.add(DUPLICATES, "tenant twice, the last a number", |_, id| {
        bad(
            "bad_tenant",
            ev_with(id, t, r#""tenant":"acme","tenant":5"#),
        )
    });
    g.add(
        DUPLICATES,
        "valid: an invalid id, then a valid one",
        |_, id| {
            ok(
                id,
                format!(
                    r#"{{"id":"bad.id","id":{},"type":"hostile.duplicates"}}"#,
                    js(id)
                )
                .into_bytes(),
            )
        },
    );
    g.add(DUPLICATES, "a valid id, then an invalid one", |_, id| {
        bad(
            "bad_id",
            format!(
                r#"{{"id":{},"id":"bad.id","type":"hostile.duplicates"}}"#,
                js(id)
            )
            .into_bytes(),
        )
    });
    g.add(DUPLICATES, "valid: data 10,000 times", |_, id| {
        let members: Vec<String> = (0..10_000).map(|i| format!(r#""data":{i}"#)).collect();
        ok(id, ev_with(id, t, &members.join(",")))
    });

    // CR/LF and other bytes where a value becomes an HTTP header: only the id does
    // (`webhook-id`); type, tenant, Kafka headers and the key never reach an HTTP header.
    for (what, tail) in [
        (
            "id with CR LF and a header line",
            format!("\r\n{INJECTED}: 1"),
        ),
        ("id with LF and a header line", format!("\n{INJECTED}:1")),
        ("id with a trailing CR", "\r".to_owned()),
        ("id with NUL", "\u{0}x".to_owned()),
        ("id with a tab", "\tx".to_owned()),
        ("id with a space", " x".to_owned()),
        ("id with DEL", "\u{7f}".to_owned()),
        ("id with NEL (U+0085)", "\u{85}".to_owned()),
        ("id with U+2028", "\u{2028}".to_owned()),
        ("id with a dot", ".x".to_owned()),
    ] {
        g.add(CRLF, what, |_, id| {
            bad("bad_id", ev(&format!("{id}{tail}"), t))
        });
    }
    g.add(CRLF, "raw CR LF bytes inside the id string", |_, id| {
        bad(
            "not_json",
            cat(&[
                br#"{"id":""#,
                id.as_bytes(),
                format!("\r\n{INJECTED}: 1").as_bytes(),
                br#"","type":"hostile.crlf"}"#,
            ]),
        )
    });
    g.add(
        CRLF,
        "id with CR LF through the raw-value token",
        |_, id| {
            let inner = js(&format!("{id}\r\n{INJECTED}: 1"));
            bad(
                "bad_id",
                format!(
                    r#"{{"id":{{{}:{}}},"type":"hostile.crlf"}}"#,
                    js(TOKEN_KEY),
                    js(&inner)
                )
                .into_bytes(),
            )
        },
    );
    g.add(
        CRLF,
        "valid: id with a percent-encoded CR LF (printable ASCII)",
        |_, id| {
            let id = format!("{id}%0D%0A{INJECTED}:1");
            ok(&id, ev(&id, t))
        },
    );
    g.add(CRLF, "valid: type with CR LF and a header line", |_, id| {
        ok(id, ev(id, &format!("hostile.crlf\r\n{INJECTED}: 1")))
    });
    g.add(
        CRLF,
        "valid: tenant with CR LF and a header line",
        |_, id| {
            ok(
                id,
                ev_with(
                    id,
                    t,
                    &format!(
                        r#""tenant":{},"data":{{}}"#,
                        js(&format!("acme\r\n{INJECTED}: 1"))
                    ),
                ),
            )
        },
    );
    g.add(
        CRLF,
        "valid: Kafka header name and value with CR LF",
        |_, id| {
            ok(id, ev(id, t)).header(
                format!("x-crlf\r\n{INJECTED}"),
                format!("v\r\n{INJECTED}: 1"),
            )
        },
    );
    g.add(CRLF, "valid: record key with CR LF", |_, id| {
        ok(id, ev(id, t)).key(format!("\r\n{INJECTED}: 1").into_bytes())
    });

    // Lengths at and past every limit.
    g.add(LIMITS, "valid: id of 256 bytes (the limit)", |_, id| {
        let id = pad(&format!("{id}-"), MAX_ID_BYTES, 'i');
        ok(&id, ev(&id, t))
    });
    g.add(LIMITS, "id of 257 bytes", |_, id| {
        bad(
            "bad_id",
            ev(&pad(&format!("{id}-"), MAX_ID_BYTES + 1, 'i'), t),
        )
    });
    if copy < 26 {
        g.add(LIMITS, "valid: id of 1 byte", |_, _| {
            let id = char::from(b'A' + copy as u8).to_string();
            ok(&id, ev(&id, t))
        });
    }
    g.add(LIMITS, "empty id", |_, _| bad("bad_id", ev("", t)));
    g.add(LIMITS, "id of 64 KiB", |_, id| {
        bad("bad_id", ev(&pad(id, 64 * 1024, 'i'), t))
    });
    g.add(LIMITS, "id of 256 bytes ending in a dot", |_, id| {
        bad(
            "bad_id",
            ev(&format!("{}.", pad(id, MAX_ID_BYTES - 1, 'i')), t),
        )
    });
    g.add(LIMITS, "id of 256 bytes of 'é'", |_, _| {
        bad("bad_id", ev(&"é".repeat(MAX_ID_BYTES / 2), t))
    });
    g.add(LIMITS, "valid: type of 256 bytes", |_, id| {
        ok(id, ev(id, &pad("hostile.limits.", MAX_NAME_BYTES, 't')))
    });
    g.add(LIMITS, "type of 257 bytes", |_, id| {
        bad(
            "bad_type",
            ev(id, &pad("hostile.limits.", MAX_NAME_BYTES + 1, 't')),
        )
    });
    g.add(LIMITS, "empty type", |_, id| bad("bad_type", ev(id, "")));
    for (what, len, reason) in [
        ("valid: tenant of 256 bytes", MAX_NAME_BYTES, None),
        (
            "tenant of 257 bytes",
            MAX_NAME_BYTES + 1,
            Some("bad_tenant"),
        ),
        ("empty tenant", 0, Some("bad_tenant")),
    ] {
        g.add(LIMITS, what, |_, id| {
            let value = ev_with(
                id,
                t,
                &format!(r#""tenant":{},"data":{{}}"#, js(&pad("", len, 'n'))),
            );
            match reason {
                None => ok(id, value),
                Some(r) => bad(r, value),
            }
        });
    }
    g.add(
        LIMITS,
        "valid: id, type and tenant of 256 bytes each",
        |_, id| {
            let id = pad(&format!("{id}-"), MAX_ID_BYTES, 'a');
            let value = ev_with(
                &id,
                &pad("hostile.limits.", MAX_NAME_BYTES, 't'),
                &format!(
                    r#""tenant":{},"data":{{}}"#,
                    js(&pad("", MAX_NAME_BYTES, 'n'))
                ),
            );
            ok(&id, value)
        },
    );
    g.add(
        LIMITS,
        "valid: record key of 16,384 bytes (input.max_key_bytes)",
        |_, id| ok(id, ev(id, t)).key(vec![b'k'; input.max_key_bytes - KEY_HEAD]),
    );
    g.add(LIMITS, "record key of 16,385 bytes", |_, id| {
        bad("record_too_large", ev(id, t)).key(vec![b'k'; input.max_key_bytes + 1 - KEY_HEAD])
    });
    g.add(
        LIMITS,
        "valid: event of 524,288 bytes (input.max_payload_bytes)",
        |_, id| ok(id, event_of_len(id, t, input.max_payload_bytes, false)),
    );
    g.add(LIMITS, "event of 524,289 bytes", |_, id| {
        bad(
            "payload_too_large",
            event_of_len(id, t, input.max_payload_bytes + 1, false),
        )
    });
    g.add(LIMITS, "524,288 bytes, not JSON", |_, _| {
        let mut v = vec![b'x'; input.max_payload_bytes];
        v[0] = b'{';
        bad("not_json", v)
    });

    // The raw-value token: what a JSON parser reads is not what serde_json's `Value` reads.
    let inner = |id: &str| js(&String::from_utf8(ev(id, "hostile.token")).expect("utf-8"));
    g.add(
        TOKEN,
        "an object whose only name is the token: no id for a JSON parser",
        |_, id| {
            bad(
                "missing_id",
                format!("{{{}:{}}}", js(TOKEN_KEY), inner(id)).into_bytes(),
            )
            .smuggles(id)
        },
    );
    g.add(TOKEN, "the same, the name escaped (\\u0024…)", |_, id| {
        bad(
            "missing_id",
            format!(r#"{{"\u0024serde_json::private::RawValue":{}}}"#, inner(id)).into_bytes(),
        )
        .smuggles(id)
    });
    g.add(TOKEN, "id an object holding the token", |_, id| {
        bad(
            "bad_id",
            format!(
                r#"{{"id":{{{}:{}}},"type":"hostile.token"}}"#,
                js(TOKEN_KEY),
                js(&js(id))
            )
            .into_bytes(),
        )
        .smuggles(id)
    });
    g.add(TOKEN, "type an object holding the token", |_, id| {
        bad(
            "bad_type",
            format!(
                r#"{{"id":{},"type":{{{}:{}}}}}"#,
                js(id),
                js(TOKEN_KEY),
                js(&js("hostile.token"))
            )
            .into_bytes(),
        )
        .smuggles(id)
    });
    g.add(TOKEN, "tenant an object holding the token", |_, id| {
        bad(
            "bad_tenant",
            ev_with(
                id,
                "hostile.token",
                &format!(r#""tenant":{{{}:{}}}"#, js(TOKEN_KEY), js(&js("acme"))),
            ),
        )
        .smuggles(id)
    });
}

/// Produces `rec` alone with a plain producer (not idempotent) allowing 16 MB messages: the
/// broker alone decides whether it fits the topic.
async fn produce_alone(topic: &str, rec: &Rec) -> Result<(), KafkaError> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", harness::bootstrap())
        .set("acks", "all")
        .set("message.max.bytes", "16000000")
        .create()
        .expect("producer");
    producer
        .send(
            FutureRecord::to(topic)
                .key(&rec.key)
                .payload(&rec.value)
                .headers(rec.kafka_headers()),
            Duration::from_secs(60),
        )
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
}

/// `rec` with one more header named `name` (not UTF-8: `Header::key` is a `&str`, so it is added
/// with librdkafka's `rd_kafka_header_add`), produced alone.
async fn produce_with_raw_header_name(
    topic: &str,
    rec: &Rec,
    name: &[u8],
) -> Result<(), KafkaError> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", harness::bootstrap())
        .set("acks", "all")
        .create()
        .expect("producer");
    let headers = OwnedHeaders::new();
    // `as_borrowed` is the librdkafka headers object `headers` owns, cast; librdkafka copies the
    // name and the value.
    let raw = headers.as_borrowed() as *const rdkafka::message::BorrowedHeaders
        as *mut rdkafka::bindings::rd_kafka_headers_t;
    let err = unsafe {
        rdkafka::bindings::rd_kafka_header_add(
            raw,
            name.as_ptr().cast(),
            name.len() as isize,
            b"v".as_ptr().cast(),
            1,
        )
    };
    assert_eq!(
        err,
        rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
    );
    producer
        .send(
            FutureRecord::to(topic)
                .key(&rec.key)
                .payload(&rec.value)
                .headers(headers),
            Duration::from_secs(60),
        )
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
}

/// The stream's share of the hostile records, the multi-MB ones evenly spaced among the others.
fn spread(hostile: &mut [Hostile]) -> Vec<Rec> {
    let (mut big, mut small) = (Vec::new(), Vec::new());
    for x in hostile.iter_mut().filter(|x| !x.direct) {
        let rec = x.rec.take().expect("a record");
        if x.big {
            big.push(rec);
        } else {
            small.push(rec);
        }
    }
    let total = big.len() + small.len();
    let every = (total / big.len().max(1)).max(1);
    let (mut big, mut small) = (big.into_iter(), small.into_iter());
    (0..total)
        .filter_map(|i| {
            if i % every == every / 2 {
                big.next().or_else(|| small.next())
            } else {
                small.next().or_else(|| big.next())
            }
        })
        .collect()
}

/// The first arrival (Unix ms) of every `webhook-id` at `path`.
fn first_arrivals(rx: &Receiver, path: &str) -> HashMap<String, i64> {
    let mut first: HashMap<String, i64> = HashMap::new();
    for r in rx.requests(path) {
        if let Some(id) = r.headers.get("webhook-id") {
            let at = first.entry(id.clone()).or_insert(r.at_ms);
            *at = (*at).min(r.at_ms);
        }
    }
    first
}

/// The produce time (the record's CreateTime, Unix ms) of every record on `topic` keyed by one
/// of `keys`, read without keeping the records (the topic holds the multi-MB ones).
fn produce_times(topic: &str, keys: &BTreeSet<String>) -> HashMap<String, i64> {
    let consumer = harness::reader_from_start(topic);
    let start = Instant::now();
    let mut out = HashMap::new();
    while out.len() < keys.len() && start.elapsed() < Duration::from_secs(120) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let key = m.key().and_then(|k| std::str::from_utf8(k).ok());
            if let (Some(k), Some(ts)) = (key, m.timestamp().to_millis()) {
                if keys.contains(k) {
                    out.entry(k.to_owned()).or_insert(ts);
                }
            }
        }
    }
    out
}

/// The `p` quantile of sorted values.
fn pct(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// What is wrong with the quarantine copy `m` of `x`, quarantined for `reason`: a
/// `record_too_large` copy has bounded prefixes and the original sizes, any other is whole (key,
/// value and the producer's headers).
fn copy_problem(m: &rdkafka::message::OwnedMessage, x: &Hostile, reason: &str) -> Option<String> {
    let o = &x.original;
    let key = m.key().unwrap_or_default();
    let value = m.payload().unwrap_or_default();
    if reason == "record_too_large" {
        let size = |name: &str| harness::header(m, name).and_then(|v| v.parse::<usize>().ok());
        let sizes = (size(h::ORIGINAL_KEY_BYTES), size(h::ORIGINAL_VALUE_BYTES));
        if sizes != (Some(o.key_len), Some(o.value_len)) {
            return Some(format!(
                "original sizes {sizes:?}, produced key {} and value {}",
                o.key_len, o.value_len
            ));
        }
        if key.len() > 1024 || value.len() > 64 * 1024 {
            return Some(format!(
                "bounded copy with a {}-byte key and a {}-byte value",
                key.len(),
                value.len()
            ));
        }
        // The record's own headers: kept up to 16 KiB, else their size is stated.
        let kept = own_headers(m);
        let ok = if o.headers_bytes > 16 * 1024 {
            kept == 0 && size(h::ORIGINAL_HEADERS_BYTES) == Some(o.headers_bytes)
        } else {
            kept == o.headers
        };
        return (!ok).then(|| {
            format!(
                "bounded copy keeps {kept} of {} headers ({} bytes), original-headers-bytes {:?}",
                o.headers,
                o.headers_bytes,
                size(h::ORIGINAL_HEADERS_BYTES)
            )
        });
    }
    if reason.is_empty() {
        return None; // the table names it
    }
    if (key.len(), hash(key), value.len(), hash(value))
        != (o.key_len, o.key_hash, o.value_len, o.value_hash)
    {
        return Some(format!(
            "the quarantine copy is not whole: key {} / value {} bytes, produced {} / {}",
            key.len(),
            value.len(),
            o.key_len,
            o.value_len
        ));
    }
    let own = own_headers(m);
    // A `bad_headers` copy carries none of the record's headers (they are what is wrong).
    let expected = if reason == "bad_headers" {
        0
    } else {
        o.headers
    };
    (own != expected).then(|| {
        format!("the quarantine copy has {own} of the record's headers, expected {expected}")
    })
}

/// The headers of `m` that are not hookline's.
fn own_headers(m: &rdkafka::message::OwnedMessage) -> usize {
    m.headers().map_or(0, |hs| {
        hs.iter()
            .filter(|hd| !hd.key.starts_with("hookline-"))
            .count()
    })
}

/// Peak and current resident memory of process `pid`.
fn memory(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or("?".to_owned(), |v| v.trim().to_owned())
    };
    format!(
        "hookline (pid {pid}) peak RSS (VmHWM) {}, RSS now {}",
        get("VmHWM:"),
        get("VmRSS:")
    )
}

/// `run all` under the mixed stream with several hundred hostile records interleaved (two dozen of
/// them several MB). Every record refused by the contract is on `<p>.invalid` with its reason;
/// every record it accepts is delivered, body intact; no request carries an injected header; the
/// ledger balances; the process never exits. Prints the valid events' delivery rate and
/// latency during the hostile phase against the offered rate, and the process's peak RSS.
#[test]
fn hostile_input_at_scale_is_quarantined_while_throughput_holds() {
    crate::require_cluster();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sc = Scenario::new("hostile", &rt, Options::default());
    let events = format!("{}.events", sc.prefix);
    let unique: usize = env_or("HOOKLINE_TEST_HOSTILE_EVENTS", 1600);
    let rate: f64 = env_or("HOOKLINE_TEST_FAULT_RATE", 80.0);
    let copies: usize = env_or("HOOKLINE_TEST_HOSTILE_COPIES", 3);
    let mut hostile = generate(&sc.prefix, copies);
    let multi_mb = hostile.iter().filter(|x| x.bytes >= MIB).count();
    let hostile_bytes: usize = hostile.iter().map(|x| x.bytes).sum();
    let mut hookline = Hookline::all(&sc.config);

    // Both sides of the events topic's limit, each produced alone: the largest record it accepts
    // (quarantined like the rest), and one byte more, which Kafka refuses: that one never
    // reaches hookline, whatever it holds. And the header name that is not UTF-8.
    let mut largest_rec = None;
    for x in hostile.iter_mut().filter(|x| x.direct) {
        let rec = x.rec.take().expect("a record");
        match &x.raw_header_name {
            Some(name) => {
                let sent = rt.block_on(produce_with_raw_header_name(&events, &rec, name));
                sent.unwrap_or_else(|e| panic!("{} {}: {e}", x.tag, x.what));
            }
            None => largest_rec = Some(rec),
        }
    }
    let largest_rec = largest_rec.expect("the largest record");
    let mut above = largest_rec.clone();
    above.value.push(b' ');
    rt.block_on(async {
        if let Err(e) = produce_alone(&events, &largest_rec).await {
            panic!(
                "the largest record the events topic accepts ({} bytes as a batch) was \
                 refused: {e}",
                batch_bytes(&largest_rec)
            );
        }
        let refused = produce_alone(&events, &above).await;
        assert!(
            matches!(
                refused,
                Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::MessageSizeTooLarge
                ))
            ),
            "a record one byte over the events topic's max.message.bytes ({} bytes as a batch) \
             must be refused by Kafka, got {refused:?}",
            batch_bytes(&above)
        );
    });
    sc.say(&format!(
        "events topic: a {}-byte batch accepted, a {}-byte one refused by the broker \
         (max.message.bytes {LIMIT})",
        batch_bytes(&largest_rec),
        batch_bytes(&above)
    ));
    drop((largest_rec, above));

    let mut stream = Stream::mixed(&sc.prefix, unique, 30);
    let mixed_ids = stream.ids.clone();
    let mixed_invalid = stream.invalid;
    stream.interleave_invalid(spread(&mut hostile));
    let records = stream.len();
    sc.say(&format!(
        "{} hostile records ({multi_mb} of 1 MiB or more; {:.0} MB in all), {} classes, among \
         {} unique events and {mixed_invalid} invalid ones: {records} records at {rate}/s",
        hostile.len(),
        hostile_bytes as f64 / 1e6,
        hostile
            .iter()
            .map(|x| x.class)
            .collect::<BTreeSet<_>>()
            .len(),
        mixed_ids.len(),
    ));
    let started = Instant::now();
    let producing = stream.start(&sc.prefix, rate);
    while !producing.is_finished() {
        hookline.assert_running("the hostile stream");
        std::thread::sleep(Duration::from_millis(200));
    }
    producing.join().expect("producer thread");
    let produce_secs = started.elapsed().as_secs_f64();
    let produced_at = Instant::now();
    sc.say(&format!(
        "stream produced in {produce_secs:.1}s ({:.1} records/s)",
        records as f64 / produce_secs
    ));

    // What landed on <p>.invalid, by hostile tag (the key up to `|`).
    let quarantines = hostile
        .iter()
        .filter(|x| matches!(x.expect, Expect::Quarantine(_)))
        .count();
    let may_pass = hostile.iter().filter(|x| x.smuggled.is_some()).count();
    let invalid = harness::read_all_quiet(
        &format!("{}.invalid", sc.prefix),
        mixed_invalid + quarantines - may_pass,
        Duration::from_secs(120),
        Duration::from_secs(5),
    );
    hookline.assert_running("the quarantine");
    let mut by_tag: HashMap<String, Vec<String>> = HashMap::new();
    let mut problems: Vec<String> = Vec::new();
    let tags: HashMap<&str, &Hostile> = hostile.iter().map(|x| (x.tag.as_str(), x)).collect();
    for m in &invalid {
        let key = m
            .key()
            .map(|k| String::from_utf8_lossy(&k[..k.len().min(96)]).into_owned())
            .unwrap_or_default();
        let reason = harness::header(m, h::INVALID_REASON)
            .unwrap_or("")
            .to_owned();
        if harness::header(m, h::INVALID_DETAIL).is_none_or(str::is_empty) {
            problems.push(format!("{key:?}: quarantined without a detail"));
        }
        if harness::header(m, h::SOURCE_TOPIC) != Some(events.as_str()) {
            problems.push(format!("{key:?}: quarantined without its source topic"));
        }
        match key.split_once('|') {
            Some((tag, _)) if tag.starts_with("hx") => {
                if let Some(x) = tags.get(tag) {
                    if let Some(p) = copy_problem(m, x, &reason) {
                        problems.push(format!("{tag} [{}] {}: {p}", x.class, x.what));
                    }
                }
                by_tag.entry(tag.to_owned()).or_default().push(reason);
            }
            _ if key.starts_with(&sc.prefix) && key.ends_with("-bad") => {
                if reason != "missing_type" {
                    problems.push(format!("{key}: expected missing_type, got {reason:?}"));
                }
            }
            _ => problems.push(format!(
                "unexpected record on <p>.invalid: key {key:?}, reason {reason:?}"
            )),
        }
    }

    // The ledger's split follows what was observed (a record that went the wrong way is named
    // below); every record expected valid must then reach every endpoint.
    let mut ids = mixed_ids.clone();
    let mut invalid_expected = mixed_invalid;
    for x in &hostile {
        let quarantined = by_tag.contains_key(&x.tag);
        match (&x.expect, &x.smuggled) {
            (Expect::Deliver(id), _) if !quarantined => {
                ids.insert(id.clone());
            }
            (Expect::Quarantine(_), Some(id)) if !quarantined => {
                ids.insert(id.clone());
            }
            _ => invalid_expected += 1,
        }
    }
    let deadline = Instant::now() + Duration::from_secs(150);
    let healthy = loop {
        hookline.assert_running("the deliveries");
        let first = first_arrivals(&sc.rx, "/healthy");
        if ids.iter().all(|id| first.contains_key(id)) || Instant::now() > deadline {
            break first;
        }
        std::thread::sleep(Duration::from_secs(1));
    };

    // Throughput: the unique events of the mixed stream, produced (CreateTime) and first
    // delivered at the healthy endpoint. The hostile records are spread over the whole stream:
    // the hostile phase is the produce phase.
    let produced = produce_times(&events, &mixed_ids);
    let mut lat: Vec<(i64, i64)> = produced
        .iter()
        .filter_map(|(id, t)| healthy.get(id).map(|at| (*t, at - t)))
        .collect();
    lat.sort_unstable();
    let phase_start = produced.values().copied().min().unwrap_or(0);
    let phase_end = produced.values().copied().max().unwrap_or(0);
    let phase_secs = ((phase_end - phase_start) as f64 / 1000.0).max(0.001);
    let in_phase = produced
        .keys()
        .filter(|id| healthy.get(*id).is_some_and(|at| *at <= phase_end))
        .count();
    let mut all: Vec<i64> = lat.iter().map(|(_, l)| *l).collect();
    all.sort_unstable();
    sc.say(&format!(
        "valid events during the hostile phase ({phase_secs:.1}s): offered {:.1}/s, delivered \
         {:.1}/s ({in_phase} of {} by the phase's end); end-to-end latency p50 {} ms, p90 {} ms, \
         p99 {} ms, max {} ms ({} delivered)",
        produced.len() as f64 / phase_secs,
        in_phase as f64 / phase_secs,
        produced.len(),
        pct(&all, 0.5),
        pct(&all, 0.9),
        pct(&all, 0.99),
        all.last().copied().unwrap_or(0),
        all.len(),
    ));
    let mut buckets: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for (t, l) in &lat {
        buckets
            .entry((t - phase_start) / 5000)
            .or_default()
            .push(*l);
    }
    for (b, ls) in &mut buckets {
        ls.sort_unstable();
        eprintln!(
            "    {:>3}-{:>3}s: {:>4} events, latency p50 {:>5} ms, p99 {:>5} ms, max {:>5} ms",
            *b * 5,
            *b * 5 + 5,
            ls.len(),
            pct(ls, 0.5),
            pct(ls, 0.99),
            ls.last().copied().unwrap_or(0)
        );
    }
    sc.say(&memory(hookline.pid()));

    // The table: each variant, what the contract says, what happened.
    let mut mismatches = Vec::new();
    let mut rows: Vec<((&str, &str), Vec<&Hostile>)> = Vec::new();
    for x in &hostile {
        match rows
            .iter_mut()
            .find(|(k, _)| *k == (x.class, x.what.as_str()))
        {
            Some((_, v)) => v.push(x),
            None => rows.push(((x.class, x.what.as_str()), vec![x])),
        }
    }
    let observed = |x: &Hostile| -> String {
        match by_tag.get(&x.tag) {
            Some(rs) => format!("quarantined {}", rs.join("+")),
            None => {
                let id = x.expect.id().or(x.smuggled.as_ref());
                match id {
                    Some(id) if healthy.contains_key(id) => "delivered".to_owned(),
                    _ => "missing".to_owned(),
                }
            }
        }
    };
    eprintln!("--- hostile records: class | variant | n | bytes | batch | expected | observed");
    for ((class, what), xs) in &rows {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut row_ok = true;
        for x in xs {
            let o = observed(x);
            if !x.expect.allows(&o) {
                row_ok = false;
                let as_id = match (&x.smuggled, o.as_str()) {
                    (Some(id), "delivered") => format!(" (webhook-id {id:?})"),
                    _ => String::new(),
                };
                mismatches.push(format!(
                    "{} [{class}] {what}: expected {}, observed {o}{as_id}",
                    x.tag, x.expect
                ));
            }
            *seen.entry(o).or_default() += 1;
        }
        let seen: Vec<String> = seen.iter().map(|(o, n)| format!("{n}x {o}")).collect();
        eprintln!(
            "{class} | {what} | {} | {} | {} | {} | {}{}",
            xs.len(),
            xs[0].bytes,
            xs[0].wire,
            xs[0].expect,
            seen.join(", "),
            if row_ok { "" } else { "  <-- MISMATCH" }
        );
    }
    for m in &mismatches {
        sc.say(&format!("MISMATCH {m}"));
    }
    for p in &problems {
        sc.say(&format!("PROBLEM {p}"));
    }
    let printed = problems.len();

    let summary = ledger::settle(
        &sc,
        &ids,
        invalid_expected,
        ledger::one_percent(&ids),
        || hookline.assert_running("the settling"),
    );
    sc.say(&format!(
        "ledger balanced {:.1}s after the stream's end: {summary}",
        produced_at.elapsed().as_secs_f64()
    ));

    // At the receiver: no injected header, nothing delivered that is no valid event, every
    // valid hostile body byte for byte.
    let requests = sc.rx.all_requests();
    let mut delivered_ids: BTreeSet<&str> = BTreeSet::new();
    for r in &requests {
        for (k, v) in &r.headers {
            if k.eq_ignore_ascii_case(INJECTED) || v.contains(['\r', '\n']) {
                problems.push(format!(
                    "a request to {} carried header {k:?}: {v:?}",
                    r.path
                ));
            }
        }
        match r.headers.get("webhook-id") {
            Some(id) => {
                delivered_ids.insert(id);
            }
            None => problems.push(format!("a request to {} without webhook-id", r.path)),
        }
    }
    for id in &delivered_ids {
        if !ids.contains(*id) {
            problems.push(format!("delivered, but no valid event: webhook-id {id:?}"));
        }
    }
    for x in &hostile {
        if let Some(d) = &x.decoy {
            if delivered_ids.contains(d.as_str()) {
                problems.push(format!("{} {}: decoy id {d:?} delivered", x.tag, x.what));
            }
        }
        if let (Some(id), Some(body)) = (x.expect.id(), &x.body) {
            for r in requests
                .iter()
                .filter(|r| r.headers.get("webhook-id") == Some(id))
            {
                if &r.body != body {
                    problems.push(format!(
                        "{} {}: delivered body differs ({} bytes, produced {})",
                        x.tag,
                        x.what,
                        r.body.len(),
                        body.len()
                    ));
                }
            }
        }
    }
    for p in &problems[printed..] {
        sc.say(&format!("PROBLEM {p}"));
    }

    // The log's warnings and errors beyond the routine ones (quarantines, retries, dead letters).
    let routine = [
        "event quarantined to the invalid topic",
        "delivery failed, handed to retry tier",
        "delivery is dead, moved to the dead-letter topic",
    ];
    let mut unusual: BTreeMap<(String, String), (usize, String)> = BTreeMap::new();
    for line in hookline.log_text().lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let level = v["level"].as_str().unwrap_or("").to_owned();
        let message = v["message"].as_str().unwrap_or("").to_owned();
        if (level == "WARN" || level == "ERROR") && !routine.contains(&message.as_str()) {
            let e = unusual
                .entry((level, message.chars().take(120).collect()))
                .or_insert((0, line.chars().take(400).collect()));
            e.0 += 1;
        }
    }
    sc.say(&format!(
        "hookline log: {} kinds of unusual warnings/errors",
        unusual.len()
    ));
    for ((level, message), (n, sample)) in unusual.iter().take(12) {
        eprintln!("    {n}x {level} {message}\n      e.g. {sample}");
    }
    sc.say(&memory(hookline.pid()));
    hookline.stop();
    assert!(
        mismatches.is_empty() && problems.is_empty(),
        "{} hostile records not handled as the contract says, {} other problems:\n{}\n{}",
        mismatches.len(),
        problems.len(),
        mismatches.join("\n"),
        problems.join("\n")
    );
}

/// The generator's expectations against stage A's own admission and validator, offline (no
/// cluster): a wrong expectation fails here in a second, not after a cluster round. Headers are
/// judged first, as stage A does (`hookline_deduper::headers`).
#[test]
fn hostile_expectations_match_stage_a_offline() {
    let input = InputConfig::default();
    let validator = hookline_common::contract::envelope::Validator::new(&input, &[]);
    let hostile = generate("t-offline", 1);
    let mut wrong = Vec::new();
    for x in &hostile {
        let rec = x.rec.as_ref().expect("a record");
        let carried = headers_bytes(
            rec.headers
                .iter()
                .filter(|(k, _)| !k.starts_with("hookline-"))
                .map(|(k, v)| (k.as_str(), v.len())),
        );
        let bad_headers = x.raw_header_name.is_some()
            || rec.headers.len() > hookline_deduper::headers::MAX_HEADERS;
        let verdict = hookline_common::kafka::recordsize::admit(
            rec.key.len(),
            rec.value.len(),
            carried,
            input.max_key_bytes,
            LIMIT,
        )
        .and_then(|()| validator.validate(Some(&rec.value)));
        let got = match verdict {
            _ if bad_headers => Expect::Quarantine("bad_headers"),
            Ok(ev) => Expect::Deliver(ev.id),
            Err(why) => Expect::Quarantine(why.reason.as_str()),
        };
        if got != x.expect {
            wrong.push(format!(
                "{} [{}] {}: expected {:?}, stage A says {got:?}",
                x.tag, x.class, x.what, x.expect
            ));
        }
        assert!(
            x.wire <= LIMIT,
            "{} {}: {} bytes as a batch, over the events topic's limit",
            x.tag,
            x.what,
            x.wire
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
