//! The request body of `POST /v1/events`: completing it into an envelope and naming what is wrong.
//!
//! A body is the input envelope (`id`, `type`, optional `tenant`, anything else), or the same
//! without `id`: the server then assigns it. The producer's bytes are kept: a missing `id` (and,
//! for a tenant token, a missing `tenant`) is spliced in right after the opening brace, so what
//! endpoints receive is the body as sent plus those fields. The completed envelope is then
//! checked by the same [`Validator`] as stage A, so ingest accepts exactly what the pipeline
//! delivers.

use hookline_common::contract::envelope::{Invalid, InvalidReason, ValidEvent, Validator};
use serde_json::Value;

/// What a body says of itself before completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub has_id: bool,
    pub tenant: TenantField,
}

/// The body's `tenant` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantField {
    Absent,
    Str(String),
    /// `null` or not a string (validation names a non-string one; a tenant token refuses both).
    Other,
}

/// A body that cannot be an envelope, with the field to name in the 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBody {
    pub field: String,
    pub message: String,
    /// The body is over the size limit (413, not 400).
    pub too_large: bool,
}

/// Parses `body` enough to know whether it carries `id` and `tenant`.
pub fn shape(body: &[u8]) -> Result<Shape, BadBody> {
    // The envelope parser's reading (serde_json's raw-value token is a plain key), so ingest and
    // stage A agree on what the body holds.
    let value = hookline_common::contract::envelope::parse_plain(body).map_err(|e| BadBody {
        field: "body".into(),
        message: format!("the body is not JSON: {e} (send a JSON object with `type` and `data`)"),
        too_large: false,
    })?;
    let Value::Object(obj) = value else {
        return Err(BadBody {
            field: "body".into(),
            message: "the body must be a JSON object with `type` and `data`".into(),
            too_large: false,
        });
    };
    Ok(Shape {
        has_id: obj.contains_key("id"),
        tenant: match obj.get("tenant") {
            None => TenantField::Absent,
            Some(Value::String(s)) => TenantField::Str(s.clone()),
            Some(_) => TenantField::Other,
        },
    })
}

/// `body` (a JSON object) with `fields` inserted first, as `"name":"value"` pairs. Values are
/// JSON-escaped; the rest of the bytes are unchanged.
pub fn splice(body: &[u8], fields: &[(&str, &str)]) -> Vec<u8> {
    if fields.is_empty() {
        return body.to_vec();
    }
    // `shape` succeeded, so the first non-whitespace byte is `{`.
    let open = body
        .iter()
        .position(|b| *b == b'{')
        .expect("a JSON object starts with `{`");
    let empty = body[open + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'}');
    let mut out = Vec::with_capacity(body.len() + 96);
    out.extend_from_slice(&body[..=open]);
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(Value::String((*name).to_string()).to_string().as_bytes());
        out.push(b':');
        out.extend_from_slice(Value::String((*value).to_string()).to_string().as_bytes());
    }
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(&body[open + 1..]);
    out
}

/// Validates a completed envelope with stage A's rules; a rejection names its field.
pub fn validate(validator: &Validator, envelope: &[u8]) -> Result<ValidEvent, BadBody> {
    validator.validate(Some(envelope)).map_err(named)
}

fn named(invalid: Invalid) -> BadBody {
    use InvalidReason as R;
    let field = match invalid.reason {
        R::MissingId | R::BadId => "id".to_string(),
        R::MissingType | R::BadType | R::ReservedType => "type".to_string(),
        R::BadTenant => "tenant".to_string(),
        // The detail names the pointer: "dedupe key field `/data/callId` (rule for …) …".
        R::MissingDedupeField => invalid
            .detail
            .split('`')
            .nth(1)
            .unwrap_or("data")
            .to_string(),
        // `BadHeaders` is stage A's verdict on Kafka headers; the body check never gives it.
        R::PayloadTooLarge | R::RecordTooLarge | R::NotJson | R::NotObject | R::BadHeaders => {
            "body".to_string()
        }
    };
    BadBody {
        field,
        too_large: matches!(invalid.reason, R::PayloadTooLarge | R::RecordTooLarge),
        message: invalid.detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_common::config::{DedupeKeyRule, InputConfig};

    fn validator() -> Validator {
        let input: InputConfig = serde_json::from_str("{}").expect("input defaults");
        let rules = vec![DedupeKeyRule {
            type_glob: "call.*".into(),
            pointers: vec!["/data/callId".into()],
        }];
        Validator::new(&input, &rules)
    }

    #[test]
    fn splice_keeps_the_bytes_and_handles_empty_objects() {
        let out = splice(br#" {"type":"a", "data":{"x":1}}"#, &[("id", "evt_1")]);
        assert_eq!(
            out,
            br#" {"id":"evt_1","type":"a", "data":{"x":1}}"#.to_vec()
        );
        let out = splice(b"{ }", &[("id", "e"), ("tenant", "t\"q")]);
        assert_eq!(out, br#"{"id":"e","tenant":"t\"q" }"#.to_vec());
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["tenant"], "t\"q");
        assert_eq!(splice(b"{}", &[]), b"{}".to_vec());
    }

    #[test]
    fn shape_reads_id_and_tenant() {
        let s = shape(br#"{"id":"a","tenant":"acme","type":"x"}"#).unwrap();
        assert!(s.has_id);
        assert_eq!(s.tenant, TenantField::Str("acme".into()));
        let s = shape(br#"{"type":"x","tenant":null}"#).unwrap();
        assert!(!s.has_id);
        assert_eq!(s.tenant, TenantField::Other);
        assert_eq!(
            shape(br#"{"type":"x"}"#).unwrap().tenant,
            TenantField::Absent
        );
        assert_eq!(shape(b"[1]").unwrap_err().field, "body");
        assert_eq!(shape(b"nope").unwrap_err().field, "body");
    }

    #[test]
    fn validation_errors_name_their_field() {
        let v = validator();
        let bad = |body: &str| validate(&v, body.as_bytes()).unwrap_err();
        assert_eq!(bad(r#"{"id":"a"}"#).field, "type");
        assert_eq!(bad(r#"{"id":"a b","type":"x"}"#).field, "id");
        assert_eq!(bad(r#"{"id":"a","type":"x","tenant":5}"#).field, "tenant");
        assert_eq!(
            bad(r#"{"id":"a","type":"call.started","data":{}}"#).field,
            "/data/callId"
        );
        assert!(validate(&v, br#"{"id":"a","type":"x","data":{}}"#).is_ok());
    }
}
