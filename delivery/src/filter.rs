//! Payload filters: whether an endpoint's `filter` (a CEL expression, compiled at load:
//! `hookline_common::config::filter`) admits an event. Asked at fan-out and again before every
//! later attempt (retry, replay), like the subscription: a filter changed since fan-out is
//! honoured. An evaluation error (a missing field, a type mismatch) is a no-match — the endpoint
//! asked for events its expression can judge.
//!
//! The event's `data` is parsed from the body once per [`EventView`] and shared by every filter
//! evaluated on it (one fan-out: every endpoint of the event).

use std::cell::OnceCell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use hookline_common::config::filter::EventFilter;
use hookline_common::config::EndpointConfig;
use hookline_common::contract::delivery::DeliveryMeta;

/// The standard CEL environment, built once.
static ENV: LazyLock<Arc<cel::Env>> = LazyLock::new(|| Arc::new(cel::Env::stdlib()));

/// What a filter made of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Match,
    /// The expression is false (or not a boolean).
    NoMatch,
    /// The expression could not be evaluated on this event: treated as a no-match. The text
    /// names what went wrong, never a value of the event.
    Error(String),
}

impl Verdict {
    pub fn admits(&self) -> bool {
        matches!(self, Verdict::Match)
    }

    /// The `result` label of `hookline_delivery_filtered_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Match => "match",
            Verdict::NoMatch => "no_match",
            Verdict::Error(_) => "error",
        }
    }
}

/// An event as filters see it: `id`, `type`, `tenant` (null when absent) and `data` (parsed
/// from the body on first use; null when the body has none).
pub struct EventView<'a> {
    id: &'a str,
    event_type: &'a str,
    tenant: Option<&'a str>,
    body: &'a [u8],
    data: OnceCell<Result<cel::Value, String>>,
}

impl<'a> EventView<'a> {
    pub fn new(id: &'a str, event_type: &'a str, tenant: Option<&'a str>, body: &'a [u8]) -> Self {
        EventView {
            id,
            event_type,
            tenant,
            body,
            data: OnceCell::new(),
        }
    }

    /// The event of a delivery record (a retry, a dead letter): its metadata and the body.
    pub fn of_delivery(meta: &'a DeliveryMeta, body: &'a [u8]) -> Self {
        EventView::new(
            &meta.event_id,
            &meta.event_type,
            meta.tenant.as_deref(),
            body,
        )
    }

    /// Whether `endpoint`'s filter (if any) admits this event; nothing counted.
    pub fn admitted_by(&self, endpoint: &EndpointConfig) -> bool {
        endpoint
            .filter
            .as_ref()
            .is_none_or(|f| self.evaluate(f).admits())
    }

    fn data(&self) -> &Result<cel::Value, String> {
        self.data.get_or_init(|| {
            #[derive(serde::Deserialize)]
            struct Body {
                #[serde(default)]
                data: serde_json::Value,
            }
            let body: Body = serde_json::from_slice(self.body)
                .map_err(|e| format!("the event body is not a JSON object: {e}"))?;
            cel::to_value(body.data).map_err(|e| format!("`data` cannot be read: {e}"))
        })
    }

    /// Evaluates `filter` on this event.
    pub fn evaluate(&self, filter: &EventFilter) -> Verdict {
        let data = if !filter.uses_data() {
            cel::Value::Null
        } else {
            match self.data() {
                Ok(data) => data.clone(),
                Err(e) => return Verdict::Error(e.clone()),
            }
        };
        let mut context = cel::Context::with_env(ENV.clone());
        context.add_variable_from_value("id", self.id);
        context.add_variable_from_value("type", self.event_type);
        context.add_variable_from_value(
            "tenant",
            self.tenant.map_or(cel::Value::Null, cel::Value::from),
        );
        context.add_variable_from_value("data", data);
        match filter.program().execute(&context) {
            Ok(cel::Value::Bool(true)) => Verdict::Match,
            Ok(_) => Verdict::NoMatch,
            Err(e) => Verdict::Error(describe(&e)),
        }
    }
}

/// Evaluation errors are logged once per endpoint and minute: a filter that fails on every event
/// of a busy stream would otherwise flood the log.
#[derive(Debug, Default)]
pub struct ErrorLog {
    /// Endpoint id → the minute (unix ms / 60,000) of its last logged error.
    last: Mutex<HashMap<String, i64>>,
}

impl ErrorLog {
    /// Whether an error of `endpoint` at `now_ms` is the first of its minute (then it is noted).
    pub fn first_this_minute(&self, endpoint: &str, now_ms: i64) -> bool {
        let minute = now_ms.div_euclid(60_000);
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.get(endpoint) == Some(&minute) {
            return false;
        }
        if last.len() >= 10_000 {
            // Bounded: forget every endpoint that has not failed this minute.
            last.retain(|_, m| *m == minute);
        }
        last.insert(endpoint.to_string(), minute);
        true
    }
}

/// What went wrong, without the event's values (they may be personal data and reach a log).
fn describe(e: &cel::ExecutionError) -> String {
    use cel::ExecutionError as E;
    match e {
        E::NoSuchKey(key) => format!("no such key `{key}`"),
        E::UndeclaredReference(name) => format!("unknown name `{name}`"),
        E::UnexpectedType { got, want } => format!("expected {want}, got {got}"),
        E::InvalidArgumentCount { expected, actual } => {
            format!("{actual} arguments where {expected} were expected")
        }
        E::FunctionError { function, .. } => format!("`{function}` failed"),
        other => {
            // Variants carrying values print them: keep only the variant's name.
            let text = format!("{other:?}");
            let name: String = text
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            format!("evaluation error ({name})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(text: &str) -> EventFilter {
        EventFilter::compile(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn view(body: &str) -> EventView<'_> {
        EventView::new("evt_1", "order.paid", Some("acme"), body.as_bytes())
    }

    #[test]
    fn filters_see_the_event_fields_and_data() {
        let body = r#"{"id":"evt_1","type":"order.paid","data":{"amount":250,"region":"eu-west",
            "customer":{"tier":"gold"},"items":[{"sku":"A1"},{"sku":"B2"}]}}"#;
        let v = view(body);
        for (text, want) in [
            (
                "type == 'order.paid' && tenant == 'acme' && id == 'evt_1'",
                true,
            ),
            ("data.amount > 100", true),
            ("data.amount > 1000", false),
            ("data.region.matches('^eu-')", true),
            ("data.customer.tier in ['gold', 'platinum']", true),
            ("data.items.exists(i, i.sku.startsWith('B'))", true),
            ("data.items.all(i, i.sku.startsWith('A'))", false),
            ("has(data.coupon)", false),
            ("size(data.items) == 2", true),
        ] {
            assert_eq!(v.evaluate(&filter(text)).admits(), want, "{text}");
        }
        // Not a boolean: no match. A missing key: an error, never a match.
        assert_eq!(v.evaluate(&filter("data.amount")), Verdict::NoMatch);
        let missing = v.evaluate(&filter("data.coupon.code == 'X'"));
        assert!(
            matches!(&missing, Verdict::Error(e) if e.contains("coupon")),
            "{missing:?}"
        );
        let typed = v.evaluate(&filter("data.region > 5"));
        assert!(
            matches!(&typed, Verdict::Error(e) if !e.contains("eu-west")),
            "{typed:?}"
        );
    }

    #[test]
    fn errors_are_logged_once_per_endpoint_and_minute() {
        let log = ErrorLog::default();
        assert!(log.first_this_minute("a", 60_000));
        assert!(!log.first_this_minute("a", 119_999));
        assert!(log.first_this_minute("b", 119_999));
        assert!(log.first_this_minute("a", 120_000));
    }

    #[test]
    fn no_tenant_is_null_and_a_bad_body_is_an_error() {
        let v = EventView::new("e", "t", None, br#"{"data":null}"#);
        assert!(v.evaluate(&filter("tenant == null")).admits());
        assert!(v.evaluate(&filter("data == null")).admits());
        let bad = EventView::new("e", "t", None, b"not json");
        assert!(matches!(
            bad.evaluate(&filter("data.a == 1")),
            Verdict::Error(_)
        ));
        // A filter that never reads `data` never parses the body.
        assert!(bad.evaluate(&filter("id == 'e'")).admits());
    }
}
