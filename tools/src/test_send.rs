//! A test send: one signed `hookline.test` event to an endpoint, to check it before real traffic
//! (`POST /v1/endpoints/{id}/test`, `hookline endpoints test ID`).
//!
//! It goes through the delivery engine every attempt uses — the endpoint's secrets sign it, the
//! SSRF guard checks the address, the endpoint's timeout and concurrency cap apply — and into the
//! endpoint's delivery log (stage `test`), but not through the retry tiers: the attempt's outcome
//! is the answer, so a failed test send is reported, never retried. It is sent whether or not the
//! endpoint is enabled or subscribes to `hookline.test` (checking a disabled endpoint before
//! enabling it is the point); nothing is written to the event topics.

use bytes::Bytes;
use rand::Rng as _;
use serde_json::{json, Value};

use hookline_common::runtime::clock::now_ms;
use hookline_delivery::{AttemptEvent, AttemptResult};

use crate::replay::Replays;

/// The event type of a test send.
pub const TEST_EVENT_TYPE: &str = "hookline.test";

/// How a test send went.
#[derive(Debug, Clone)]
pub struct TestSend {
    pub endpoint_id: String,
    /// The id of the test event (`webhook-id`): `test_` and 32 hex digits.
    pub event_id: String,
    pub delivered: bool,
    /// The response status, when one arrived.
    pub status: Option<u16>,
    /// The failure class (`http_status`, `timeout`, `connect`, `tls`, `io`, `blocked`,
    /// `invalid_url`), `None` when delivered.
    pub failure_class: Option<&'static str>,
    pub duration_ms: u64,
    /// The start of the response body or the error text of a failure (never the URL).
    pub detail: Option<String>,
}

impl TestSend {
    /// The answer of the admin API and of `--json`.
    pub fn to_json(&self) -> Value {
        json!({
            "endpoint_id": self.endpoint_id,
            "event_id": self.event_id,
            "event_type": TEST_EVENT_TYPE,
            "delivered": self.delivered,
            "status": self.status,
            "failure_class": self.failure_class,
            "duration_ms": self.duration_ms,
            "detail": self.detail,
        })
    }

    /// One line for the command line.
    pub fn line(&self) -> String {
        let status = self
            .status
            .map_or_else(|| "no response".to_string(), |s| format!("status {s}"));
        match (self.delivered, self.failure_class) {
            (true, _) | (false, None) => format!(
                "delivered: {} got test event {} ({status}, {} ms)",
                self.endpoint_id, self.event_id, self.duration_ms
            ),
            (false, Some(class)) => format!(
                "failed: {} did not take test event {} ({class}, {status}, {} ms){}",
                self.endpoint_id,
                self.event_id,
                self.duration_ms,
                self.detail
                    .as_deref()
                    .filter(|d| !d.is_empty())
                    .map_or_else(String::new, |d| format!(": {d}"))
            ),
        }
    }
}

/// The body of a test event for `endpoint_id` (its tenant's, if it has one).
pub fn test_event(event_id: &str, endpoint_id: &str, tenant: Option<&str>) -> Value {
    let mut event = json!({
        "id": event_id,
        "type": TEST_EVENT_TYPE,
        "data": {
            "message": "A test event sent by hookline to check this endpoint.",
            "endpoint_id": endpoint_id,
            "sent_at_ms": now_ms(),
        },
    });
    if let Some(t) = tenant {
        event["tenant"] = json!(t);
    }
    event
}

impl Replays {
    /// Sends a test event to the live endpoint `endpoint_id` and returns the attempt's outcome;
    /// `None` if no such endpoint exists.
    pub async fn test_send(&self, endpoint_id: &str) -> Option<TestSend> {
        let endpoint = self.plane().live_endpoints().current().get(endpoint_id)?;
        let event_id = format!("test_{:032x}", rand::thread_rng().gen::<u128>());
        let body = test_event(&event_id, &endpoint.id, endpoint.tenant.as_deref());
        let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        let outcome = self.engine().deliver(&endpoint, &event_id, bytes, 1).await;
        self.plane().observer().attempted(&AttemptEvent {
            event_id: &event_id,
            endpoint_id: &endpoint.id,
            tenant: endpoint.tenant.as_deref(),
            event_type: TEST_EVENT_TYPE,
            stage: "test",
            outcome: &outcome,
            next: None,
            waited_ms: 0,
        });
        let (delivered, status, failure_class, detail) = match &outcome.result {
            AttemptResult::Delivered { status } => (true, Some(*status), None, None),
            AttemptResult::Failed {
                class,
                status,
                snippet,
            } => (false, *status, Some(class.as_str()), Some(snippet.clone())),
        };
        Some(TestSend {
            endpoint_id: endpoint.id.clone(),
            event_id,
            delivered,
            status,
            failure_class,
            duration_ms: outcome.duration.as_millis() as u64,
            detail,
        })
    }
}
