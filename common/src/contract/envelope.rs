//! The input event contract and its validation.
//!
//! A record on `<p>.events` is a UTF-8 JSON object `{"id", "type", "data", "tenant"?, …}`.
//! [`validate`] either accepts it (computing its dedupe key) or gives the reason it goes to
//! `<p>.invalid`. The producer's bytes are never rewritten: they are what endpoints receive.

use serde_json::value::RawValue;
use serde_json::Value;

use crate::config::glob::glob_match;
use crate::config::{DedupeKeyRule, InputConfig};

/// Longest accepted envelope `id`, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Longest accepted `type` and `tenant`, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest dedupe key, in bytes (the pointers' values joined).
pub const MAX_DEDUPE_KEY_BYTES: usize = 4096;

/// Why a record was quarantined; a closed set (used as a metric label and the
/// `hookline-invalid-reason` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    /// The value is larger than `input.max_payload_bytes`.
    PayloadTooLarge,
    /// No value, not UTF-8, or not JSON.
    NotJson,
    /// JSON, but not an object.
    NotObject,
    /// No `id` field.
    MissingId,
    /// `id` is not a string, is empty, too long, or has characters unfit for an HTTP header / the
    /// Standard Webhooks signed content (only printable ASCII without `.` is accepted).
    BadId,
    /// No `type` field.
    MissingType,
    /// `type` is not a non-empty string of bounded length.
    BadType,
    /// `tenant` is present but not a non-empty string of bounded length.
    BadTenant,
    /// A dedupe-key pointer configured for this type does not resolve to a string or number.
    MissingDedupeField,
    /// The record cannot travel through the pipeline: its key is over `input.max_key_bytes`, or
    /// key + value + headers (with room for hookline's headers) exceed the smallest
    /// `max.message.bytes` on its way, or Kafka refused it as too large. Quarantined with
    /// bounded prefixes and the original sizes (see `quarantine.rs`).
    RecordTooLarge,
    /// The record's headers cannot travel through the pipeline: more than stage A's limit on
    /// their number (`MAX_HEADERS` in `deduper/src/headers.rs`, 1,000), a header name that is not
    /// UTF-8, or headers librdkafka cannot parse (more than 100,000, or malformed). Decided
    /// before anything else; quarantined with key and value whole and none of its headers.
    BadHeaders,
    /// `type` starts with `hookline.`: hookline's own events (the operational webhooks) are
    /// made by hookline only, so an endpoint subscribed to them can trust them.
    ReservedType,
}

/// The `type` prefix reserved for hookline's own events.
pub const RESERVED_TYPE_PREFIX: &str = "hookline.";

impl InvalidReason {
    pub const ALL: [InvalidReason; 12] = [
        InvalidReason::PayloadTooLarge,
        InvalidReason::NotJson,
        InvalidReason::NotObject,
        InvalidReason::MissingId,
        InvalidReason::BadId,
        InvalidReason::MissingType,
        InvalidReason::BadType,
        InvalidReason::BadTenant,
        InvalidReason::MissingDedupeField,
        InvalidReason::RecordTooLarge,
        InvalidReason::BadHeaders,
        InvalidReason::ReservedType,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            InvalidReason::PayloadTooLarge => "payload_too_large",
            InvalidReason::NotJson => "not_json",
            InvalidReason::NotObject => "not_object",
            InvalidReason::MissingId => "missing_id",
            InvalidReason::BadId => "bad_id",
            InvalidReason::MissingType => "missing_type",
            InvalidReason::BadType => "bad_type",
            InvalidReason::BadTenant => "bad_tenant",
            InvalidReason::MissingDedupeField => "missing_dedupe_field",
            InvalidReason::RecordTooLarge => "record_too_large",
            InvalidReason::BadHeaders => "bad_headers",
            InvalidReason::ReservedType => "reserved_type",
        }
    }
}

/// A rejected record: the closed reason plus a human detail (never containing payload bytes
/// beyond field names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub reason: InvalidReason,
    pub detail: String,
}

fn invalid(reason: InvalidReason, detail: impl Into<String>) -> Invalid {
    Invalid {
        reason,
        detail: detail.into(),
    }
}

/// What the pipeline needs of a valid event; the bytes themselves travel unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidEvent {
    pub id: String,
    pub event_type: String,
    pub tenant: Option<String>,
    /// The dedupe key: namespace (the envelope id, or the matching `dedupe.keys` rule), tenant
    /// and value(s), every variable part length-prefixed so distinct inputs never join to the
    /// same key. See [`Validator::dedupe_key`].
    pub dedupe_key: String,
}

/// Validation rules compiled from configuration.
#[derive(Debug, Clone)]
pub struct Validator {
    max_payload_bytes: usize,
    rules: Vec<DedupeKeyRule>,
}

impl Validator {
    pub fn new(input: &InputConfig, rules: &[DedupeKeyRule]) -> Self {
        Validator {
            max_payload_bytes: input.max_payload_bytes,
            rules: rules.to_vec(),
        }
    }

    /// Validates one record value. Memory is bounded: the size check runs before parsing.
    pub fn validate(&self, payload: Option<&[u8]>) -> Result<ValidEvent, Invalid> {
        let Some(bytes) = payload else {
            return Err(invalid(InvalidReason::NotJson, "record has no value"));
        };
        if bytes.len() > self.max_payload_bytes {
            return Err(invalid(
                InvalidReason::PayloadTooLarge,
                format!(
                    "value is {} bytes, limit is {}",
                    bytes.len(),
                    self.max_payload_bytes
                ),
            ));
        }
        let value = parse_plain(bytes).map_err(|e| {
            invalid(
                InvalidReason::NotJson,
                format!(
                    "not JSON: {} at line {} column {}",
                    classify(&e),
                    e.line(),
                    e.column()
                ),
            )
        })?;
        let Value::Object(obj) = &value else {
            return Err(invalid(
                InvalidReason::NotObject,
                format!("top-level JSON is {}, expected an object", kind(&value)),
            ));
        };
        let id = match obj.get("id") {
            None => return Err(invalid(InvalidReason::MissingId, "field `id` is missing")),
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(invalid(
                    InvalidReason::BadId,
                    format!("field `id` is {}, expected a string", kind(other)),
                ))
            }
        };
        check_id(id)?;
        let event_type = match obj.get("type") {
            None => {
                return Err(invalid(
                    InvalidReason::MissingType,
                    "field `type` is missing",
                ))
            }
            Some(Value::String(s)) if s.starts_with(RESERVED_TYPE_PREFIX) => {
                return Err(invalid(
                    InvalidReason::ReservedType,
                    format!(
                        "field `type` starts with `{RESERVED_TYPE_PREFIX}`, reserved for \
                         hookline's own events"
                    ),
                ))
            }
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_NAME_BYTES => s,
            Some(Value::String(_)) => {
                return Err(invalid(
                    InvalidReason::BadType,
                    format!("field `type` must be 1..={MAX_NAME_BYTES} bytes"),
                ))
            }
            Some(other) => {
                return Err(invalid(
                    InvalidReason::BadType,
                    format!("field `type` is {}, expected a string", kind(other)),
                ))
            }
        };
        let tenant = match obj.get("tenant") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_NAME_BYTES => Some(s.clone()),
            Some(_) => {
                return Err(invalid(
                    InvalidReason::BadTenant,
                    format!("field `tenant` must be a string of 1..={MAX_NAME_BYTES} bytes"),
                ))
            }
        };
        let dedupe_key = self.dedupe_key(bytes, &value, id, event_type, tenant.as_deref())?;
        Ok(ValidEvent {
            id: id.clone(),
            event_type: event_type.clone(),
            tenant,
            dedupe_key,
        })
    }

    /// `<namespace>|<tenant>|<values>`, where `lp(x)` is `<byte length>:<x>`:
    /// - namespace: `id` for the envelope id, else `rule` + ` lp(type glob)` + ` lp(pointer)`…
    ///   of the first matching rule, so two rules never share keys (`email.inbound` messageId
    ///   "42" and `email.delivery.sent` deliveryId "42" differ);
    /// - tenant: `-` without one, else `lp(tenant)`: one tenant's event never suppresses
    ///   another's with the same id;
    /// - values: `lp(id)`, or per pointer `s` + `lp(string)` / `n` + `lp(number literal)`:
    ///   numbers are keyed by their exact JSON text (18446744073709551617 and …618 differ,
    ///   where an f64 would round them together), and a string never equals a number.
    ///
    /// e.g. `id|4:acme|5:evt_1`, `rule 13:email.inbound 15:/data/messageId|-|s2:42`.
    fn dedupe_key(
        &self,
        bytes: &[u8],
        value: &Value,
        id: &str,
        event_type: &str,
        tenant: Option<&str>,
    ) -> Result<String, Invalid> {
        let tenant = match tenant {
            Some(t) => lp(t),
            None => "-".to_string(),
        };
        let Some(rule) = self
            .rules
            .iter()
            .find(|r| glob_match(&r.type_glob, event_type))
        else {
            return Ok(format!("id|{tenant}|{}", lp(id)));
        };
        let mut values = String::new();
        for pointer in &rule.pointers {
            match value.pointer(pointer) {
                Some(Value::String(s)) if !s.is_empty() => {
                    values.push('s');
                    values.push_str(&lp(s));
                }
                Some(Value::Number(_)) => {
                    // `Value` keeps integers beyond u64 only as f64: read the literal instead.
                    let literal = raw_pointer(bytes, pointer).ok_or_else(|| {
                        invalid(
                            InvalidReason::MissingDedupeField,
                            format!(
                                "dedupe key field `{pointer}` (rule for `{}`) could not be read",
                                rule.type_glob
                            ),
                        )
                    })?;
                    values.push('n');
                    values.push_str(&lp(literal));
                }
                Some(other) if !matches!(other, Value::String(_)) => {
                    return Err(invalid(
                        InvalidReason::MissingDedupeField,
                        format!(
                            "dedupe key field `{pointer}` (rule for `{}`) is {}, expected a string or number",
                            rule.type_glob,
                            kind(other)
                        ),
                    ))
                }
                _ => {
                    return Err(invalid(
                        InvalidReason::MissingDedupeField,
                        format!(
                            "dedupe key field `{pointer}` (rule for `{}`) is missing or empty",
                            rule.type_glob
                        ),
                    ))
                }
            }
        }
        if values.len() > MAX_DEDUPE_KEY_BYTES {
            return Err(invalid(
                InvalidReason::MissingDedupeField,
                format!("dedupe key is longer than {MAX_DEDUPE_KEY_BYTES} bytes"),
            ));
        }
        let mut namespace = String::from("rule ");
        namespace.push_str(&lp(&rule.type_glob));
        for pointer in &rule.pointers {
            namespace.push(' ');
            namespace.push_str(&lp(pointer));
        }
        Ok(format!("{namespace}|{tenant}|{values}"))
    }
}

/// Length-prefixed: `<byte length>:<text>`, so joined parts are never ambiguous.
fn lp(text: &str) -> String {
    format!("{}:{text}", text.len())
}

/// The exact JSON text at `pointer` (RFC 6901, as `Value::pointer` reads it) in `bytes`, which
/// must be valid JSON. Only the containers on the path are re-read, as raw slices.
fn raw_pointer<'a>(bytes: &'a [u8], pointer: &str) -> Option<&'a str> {
    let mut current: &'a RawValue = serde_json::from_slice(bytes).ok()?;
    if pointer.is_empty() {
        return Some(current.get().trim());
    }
    for token in pointer.strip_prefix('/')?.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        let text: &'a str = current.get().trim_start();
        current = if text.starts_with('{') {
            // Duplicate names: the last one wins, as in `Value`.
            let mut object: std::collections::HashMap<String, &'a RawValue> =
                serde_json::from_str(text).ok()?;
            object.remove(&token)?
        } else if text.starts_with('[') {
            let array: Vec<&'a RawValue> = serde_json::from_str(text).ok()?;
            // `Value::pointer`'s index rule: no sign, no leading zero.
            if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
                return None;
            }
            let index: usize = token.parse().ok()?;
            array.get(index).copied()?
        } else {
            return None;
        };
    }
    Some(current.get().trim())
}

fn check_id(id: &str) -> Result<(), Invalid> {
    if id.is_empty() {
        return Err(invalid(InvalidReason::BadId, "field `id` is empty"));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(invalid(
            InvalidReason::BadId,
            format!("field `id` is {} bytes, limit is {MAX_ID_BYTES}", id.len()),
        ));
    }
    // It becomes the `webhook-id` header and the first part of the signed content `{id}.{ts}.{body}`.
    if let Some(c) = id.chars().find(|c| !c.is_ascii_graphic() || *c == '.') {
        return Err(invalid(
            InvalidReason::BadId,
            format!(
                "field `id` contains {:?}; allowed: printable ASCII except `.` and space",
                c
            ),
        ));
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn classify(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Io => "read error",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Data => "data error",
        serde_json::error::Category::Eof => "unexpected end of input",
    }
}

/// Parses JSON the way every other JSON parser does. The workspace enables serde_json's
/// `raw_value` feature (for the dedupe-key pointers), and with it `serde_json::Value` reads an
/// object whose first key is serde_json's private raw-value token as the JSON text in that
/// key's string: `{"$serde_json::private::RawValue":"{\"id\":\"x\",…}"}` would become an event
/// with an id that no receiver's parser sees (found by the hostile-input fault test). This
/// visitor builds the same `Value` with every object key a plain key. serde_json's recursion
/// limit (128) still applies; duplicate keys keep the last value, as `Value` does.
pub fn parse_plain(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    use serde::de::DeserializeSeed as _;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = PlainValue.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

#[derive(Clone, Copy)]
struct PlainValue;

impl<'de> serde::de::DeserializeSeed<'de> for PlainValue {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for PlainValue {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = seq.next_element_seed(PlainValue)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(PlainValue)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validator() -> Validator {
        Validator::new(
            &InputConfig {
                max_payload_bytes: 1024,
                max_key_bytes: 1024,
            },
            &[
                DedupeKeyRule {
                    type_glob: "email.inbound".into(),
                    pointers: vec!["/data/messageId".into()],
                },
                DedupeKeyRule {
                    type_glob: "call.*".into(),
                    pointers: vec!["/data/callId".into(), "/data/event".into()],
                },
                DedupeKeyRule {
                    type_glob: "email.delivery.*".into(),
                    pointers: vec!["/data/deliveryId".into()],
                },
                DedupeKeyRule {
                    type_glob: "order.*".into(),
                    pointers: vec!["/data/items/1/n".into(), "/data/a~1b~0c".into()],
                },
            ],
        )
    }

    fn reason(payload: &[u8]) -> InvalidReason {
        validator()
            .validate(Some(payload))
            .expect_err("should be invalid")
            .reason
    }

    #[test]
    fn accepts_minimal_event_and_keeps_unknown_fields_irrelevant() {
        let v = validator()
            .validate(Some(
                br#"{"id":"evt_1","type":"message.created","data":{},"x":1}"#,
            ))
            .expect("valid");
        assert_eq!(v.id, "evt_1");
        assert_eq!(v.event_type, "message.created");
        assert_eq!(v.tenant, None);
        assert_eq!(v.dedupe_key, "id|-|5:evt_1");
    }

    #[test]
    fn each_bad_input_has_its_reason() {
        use InvalidReason::*;
        assert_eq!(validator().validate(None).unwrap_err().reason, NotJson);
        assert_eq!(reason(&[b' '; 2000]), PayloadTooLarge);
        assert_eq!(reason(b"{not json"), NotJson);
        assert_eq!(reason(&[0xff, 0xfe]), NotJson);
        assert_eq!(reason(b"[1,2]"), NotObject);
        assert_eq!(reason(br#"{"type":"a"}"#), MissingId);
        assert_eq!(reason(br#"{"id":7,"type":"a"}"#), BadId);
        assert_eq!(reason(br#"{"id":"","type":"a"}"#), BadId);
        assert_eq!(reason(br#"{"id":"a.b","type":"a"}"#), BadId);
        assert_eq!(
            reason(br#"{"id":"a","type":"hookline.endpoint.disabled"}"#),
            ReservedType
        );
        assert_eq!(reason(br#"{"id":"a b","type":"a"}"#), BadId);
        let long = format!(r#"{{"id":"{}","type":"a"}}"#, "x".repeat(257));
        assert_eq!(reason(long.as_bytes()), BadId);
        assert_eq!(reason(br#"{"id":"e1"}"#), MissingType);
        assert_eq!(reason(br#"{"id":"e1","type":""}"#), BadType);
        assert_eq!(reason(br#"{"id":"e1","type":3}"#), BadType);
        assert_eq!(reason(br#"{"id":"e1","type":"a","tenant":5}"#), BadTenant);
        assert_eq!(
            reason(br#"{"id":"e1","type":"email.inbound","data":{}}"#),
            MissingDedupeField
        );
        assert_eq!(
            reason(br#"{"id":"e1","type":"call.started","data":{"callId":"c","event":{}}}"#),
            MissingDedupeField
        );
    }

    #[test]
    fn serde_json_raw_value_token_is_a_plain_key() {
        use InvalidReason::*;
        // serde_json::Value (raw_value feature) would read these as the JSON text in the string.
        let wrapped = br#"{"$serde_json::private::RawValue":"{\"id\":\"x\",\"type\":\"a\"}"}"#;
        assert_eq!(reason(wrapped), MissingId);
        let escaped = br#"{"\u0024serde_json::private::RawValue":"{\"id\":\"x\",\"type\":\"a\"}"}"#;
        assert_eq!(reason(escaped), MissingId);
        let id = br#"{"id":{"$serde_json::private::RawValue":"\"x\""},"type":"a"}"#;
        assert_eq!(reason(id), BadId);
        let ty = br#"{"id":"x","type":{"$serde_json::private::RawValue":"\"a\""}}"#;
        assert_eq!(reason(ty), BadType);
        let tenant =
            br#"{"id":"x","type":"a","tenant":{"$serde_json::private::RawValue":"\"t\""}}"#;
        assert_eq!(reason(tenant), BadTenant);
        // The plain parser agrees with serde_json on ordinary JSON.
        let text = br#"{"a":[1,-2,3.5,true,null,"s",{"b":{}}],"a":1e3,"c":18446744073709551615}"#;
        assert_eq!(
            parse_plain(text).expect("json"),
            serde_json::from_slice::<Value>(text).expect("json")
        );
        assert!(parse_plain(b"{} x").is_err());
    }

    #[test]
    fn id_of_exactly_256_bytes_is_accepted() {
        let ok = format!(r#"{{"id":"{}","type":"a"}}"#, "x".repeat(256));
        assert!(validator().validate(Some(ok.as_bytes())).is_ok());
    }

    #[test]
    fn per_type_keys_collapse_different_ids() {
        let v = validator();
        let a = v
            .validate(Some(
                br#"{"id":"e1","type":"email.inbound","data":{"messageId":"m-1"}}"#,
            ))
            .expect("valid");
        let b = v
            .validate(Some(
                br#"{"id":"e2","type":"email.inbound","data":{"messageId":"m-1"}}"#,
            ))
            .expect("valid");
        assert_eq!(a.dedupe_key, b.dedupe_key);
        let c1 = v
            .validate(Some(
                br#"{"id":"e3","type":"call.x","data":{"callId":"ab","event":"c"}}"#,
            ))
            .expect("valid");
        let c2 = v
            .validate(Some(
                br#"{"id":"e4","type":"call.x","data":{"callId":"a","event":"bc"}}"#,
            ))
            .expect("valid");
        assert_ne!(
            c1.dedupe_key, c2.dedupe_key,
            "joined keys must not be ambiguous"
        );
    }

    fn key(payload: &str) -> String {
        validator()
            .validate(Some(payload.as_bytes()))
            .unwrap_or_else(|e| panic!("{payload}: {e:?}"))
            .dedupe_key
    }

    #[test]
    fn keys_of_different_rules_never_collide() {
        let inbound = key(r#"{"id":"e1","type":"email.inbound","data":{"messageId":"42"}}"#);
        let sent = key(r#"{"id":"e2","type":"email.delivery.sent","data":{"deliveryId":"42"}}"#);
        assert_ne!(inbound, sent);
        assert_eq!(inbound, "rule 13:email.inbound 15:/data/messageId|-|s2:42");
        // Nor with the envelope id namespace.
        assert_ne!(key(r#"{"id":"42","type":"x"}"#), inbound);
        // Two types under one rule share it (the rule is the namespace, not the type).
        assert_eq!(
            sent,
            key(r#"{"id":"e3","type":"email.delivery.bounced","data":{"deliveryId":"42"}}"#)
        );
    }

    #[test]
    fn tenant_is_part_of_the_key() {
        let acme = key(r#"{"id":"e1","type":"x","tenant":"acme"}"#);
        let globex = key(r#"{"id":"e1","type":"x","tenant":"globex"}"#);
        let none = key(r#"{"id":"e1","type":"x"}"#);
        assert_eq!(acme, "id|4:acme|2:e1");
        assert_ne!(acme, globex);
        assert_ne!(acme, none);
        assert_eq!(
            acme,
            key(r#"{"id":"e1","type":"x","tenant":"acme","data":{"v":2}}"#)
        );
        let by_rule = |t: &str| {
            key(&format!(
                r#"{{"id":"e","type":"email.inbound","tenant":"{t}","data":{{"messageId":"m"}}}}"#
            ))
        };
        assert_ne!(by_rule("acme"), by_rule("globex"));
    }

    #[test]
    fn numbers_are_keyed_by_their_exact_text() {
        let order = |n: &str| {
            key(&format!(
                r#"{{"id":"o","type":"order.paid","data":{{"items":[{{}},{{"n": {n} }}],"a/b~c":"x"}}}}"#
            ))
        };
        let a = order("18446744073709551617");
        let b = order("18446744073709551618");
        assert_ne!(a, b, "2^64+1 and 2^64+2 must differ");
        assert!(a.ends_with("|-|n20:18446744073709551617s1:x"), "{a}");
        assert_eq!(a, order("18446744073709551617"));
        assert_ne!(order("1.0"), order("1"));
        assert_ne!(order("-0"), order("0"));
        let s = key(r#"{"id":"e","type":"email.inbound","data":{"messageId":"42"}}"#);
        let n = key(r#"{"id":"e","type":"email.inbound","data":{"messageId":42}}"#);
        assert_ne!(s, n, "a string never equals a number");
    }

    #[test]
    fn raw_pointer_reads_like_value_pointer() {
        let doc = br#"{"a":{"b/c":[10, 2.50e3 ,{"~x":18446744073709551617}]},"a":{"b/c":[1,2]}}"#;
        // Duplicate names: the last wins, as in `Value`.
        assert_eq!(raw_pointer(doc, "/a/b~1c/1"), Some("2"));
        let doc = br#"{"a":{"b/c":[10, 2.50e3 ,{"~x":18446744073709551617}]}}"#;
        assert_eq!(raw_pointer(doc, "/a/b~1c/1"), Some("2.50e3"));
        assert_eq!(
            raw_pointer(doc, "/a/b~1c/2/~0x"),
            Some("18446744073709551617")
        );
        assert_eq!(raw_pointer(doc, "/a/b~1c/01"), None);
        assert_eq!(raw_pointer(doc, "/a/b~1c/+1"), None);
        assert_eq!(raw_pointer(doc, "/a/b~1c/9"), None);
        assert_eq!(raw_pointer(doc, "/nope"), None);
        assert_eq!(raw_pointer(doc, "a"), None);
    }

    #[test]
    fn tenant_is_read() {
        let v = validator()
            .validate(Some(br#"{"id":"e1","type":"a","tenant":"acme"}"#))
            .expect("valid");
        assert_eq!(v.tenant.as_deref(), Some("acme"));
    }
}
