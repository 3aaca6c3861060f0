//! Kafka header names written and read by hookline. Part of the record contracts
//! (docs/contracts.md); each contract is written and read through one type:
//! [`crate::contract::event_headers::EventHeaders`], [`crate::contract::delivery::DeliveryMeta`],
//! [`crate::contract::quarantine::Quarantine`].

use rdkafka::message::{Headers, Message};

/// The UTF-8 value of the first header named `name`.
pub fn get<'a, M: Message>(msg: &'a M, name: &str) -> Option<&'a str> {
    msg.headers()?
        .iter()
        .find(|hd| hd.key == name)
        .and_then(|hd| hd.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// On `<p>.invalid`: the closed reason (`not_json`, `missing_id`, …).
pub const INVALID_REASON: &str = "hookline-invalid-reason";
/// On `<p>.invalid`: a human explanation naming the field.
pub const INVALID_DETAIL: &str = "hookline-invalid-detail";
/// On `<p>.invalid`: where the record came from.
pub const SOURCE_TOPIC: &str = "hookline-source-topic";
pub const SOURCE_PARTITION: &str = "hookline-source-partition";
pub const SOURCE_OFFSET: &str = "hookline-source-offset";

/// On `<p>.dedupe` and later: facts of the validated envelope, so later stages need not re-parse.
pub const EVENT_ID: &str = "hookline-event-id";
pub const EVENT_TYPE: &str = "hookline-event-type";
pub const TENANT: &str = "hookline-tenant";
pub const DEDUPE_KEY: &str = "hookline-dedupe-key";

/// On a `record_too_large` quarantine record: the sizes of the original key, value and
/// producer headers (the record itself carries bounded prefixes).
pub const ORIGINAL_KEY_BYTES: &str = "hookline-original-key-bytes";
pub const ORIGINAL_VALUE_BYTES: &str = "hookline-original-value-bytes";
pub const ORIGINAL_HEADERS_BYTES: &str = "hookline-original-headers-bytes";
