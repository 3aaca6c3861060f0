//! The headers of one delivery request (DESIGN.md, "Delivery to an endpoint"):
//! `content-type: application/json`, Standard Webhooks `webhook-id` (the event id, the same on
//! every attempt), `webhook-timestamp` (per attempt), `webhook-signature` (one `v1,` per active
//! secret, omitted without secrets) and `webhook-attempt`.

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};

use crate::signing;

const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
const WEBHOOK_ATTEMPT: HeaderName = HeaderName::from_static("webhook-attempt");

/// The request headers, signed with every key over `{id}.{timestamp}.{body}`; `None` when the
/// event id is not a valid header value (the deduper rejects such ids).
pub(crate) fn webhook_headers(
    event_id: &str,
    timestamp: i64,
    attempt: u32,
    keys: &[impl AsRef<[u8]>],
    body: &[u8],
) -> Option<HeaderMap> {
    let id_value = HeaderValue::from_str(event_id).ok()?;
    let mut headers = HeaderMap::with_capacity(7);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(WEBHOOK_ID, id_value);
    headers.insert(WEBHOOK_TIMESTAMP, HeaderValue::from(timestamp));
    headers.insert(WEBHOOK_ATTEMPT, HeaderValue::from(attempt));
    if !keys.is_empty() {
        let signature = signing::sign(keys, event_id, timestamp, body);
        if let Ok(value) = HeaderValue::from_str(&signature) {
            headers.insert(WEBHOOK_SIGNATURE, value);
        }
    }
    Some(headers)
}
