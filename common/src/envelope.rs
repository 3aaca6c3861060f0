//! The input event contract and its validation.
//!
//! A record on `<p>.events` is a UTF-8 JSON object `{"id", "type", "data", "tenant"?, …}`.
//! [`validate`] either accepts it (computing its dedupe key) or gives the reason it goes to
//! `<p>.invalid`. The producer's bytes are never rewritten: they are what endpoints receive.

use serde_json::Value;

use crate::config::{DedupeKeyRule, InputConfig};
use crate::glob::glob_match;

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
}

impl InvalidReason {
    pub const ALL: [InvalidReason; 10] = [
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
    /// The dedupe key, prefixed by its kind so keys from different rules never collide:
    /// `id:<id>` or `ptr:<len>:<value>…`.
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
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
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
        let dedupe_key = self.dedupe_key(&value, id, event_type)?;
        Ok(ValidEvent {
            id: id.clone(),
            event_type: event_type.clone(),
            tenant,
            dedupe_key,
        })
    }

    fn dedupe_key(&self, value: &Value, id: &str, event_type: &str) -> Result<String, Invalid> {
        let Some(rule) = self
            .rules
            .iter()
            .find(|r| glob_match(&r.type_glob, event_type))
        else {
            return Ok(format!("id:{id}"));
        };
        let mut key = String::from("ptr:");
        for pointer in &rule.pointers {
            let part = match value.pointer(pointer) {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
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
            };
            // Length-prefixed so ("ab","c") and ("a","bc") never join to the same key.
            key.push_str(&part.len().to_string());
            key.push(':');
            key.push_str(&part);
            key.push('|');
        }
        if key.len() > MAX_DEDUPE_KEY_BYTES {
            return Err(invalid(
                InvalidReason::MissingDedupeField,
                format!("dedupe key is longer than {MAX_DEDUPE_KEY_BYTES} bytes"),
            ));
        }
        Ok(key)
    }
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
        assert_eq!(v.dedupe_key, "id:evt_1");
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

    #[test]
    fn tenant_is_read() {
        let v = validator()
            .validate(Some(br#"{"id":"e1","type":"a","tenant":"acme"}"#))
            .expect("valid");
        assert_eq!(v.tenant.as_deref(), Some("acme"));
    }
}
