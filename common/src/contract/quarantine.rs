//! The quarantine contract: what goes to `<p>.invalid`, written through one type,
//! [`Quarantine`] (reason, detail, source position), whoever parks the record (stage A, stage B,
//! a tier, the hop writer).
//!
//! A record is parked *whole* ([`Quarantine::whole`]: its key, value and headers plus
//! `hookline-invalid-reason`, `hookline-invalid-detail` and the source position) or, when it can
//! never be written whole (an input on `<p>.events`, a `<p>.dedupe` record, a delivery record
//! that no longer fits its tier or the DLQ), as the bounded `record_too_large` record
//! ([`too_large`]).
//!
//! Judgement call: the bounded record keeps bounded *prefixes*, not nothing. The start of a JSON
//! event usually names it (`id`, `type`), which is what an operator needs to find the producer;
//! the original sizes tell how much was cut.
//! - key: at most [`KEY_PREFIX_BYTES`] (1 KiB);
//! - value: at most [`VALUE_PREFIX_BYTES`] (64 KiB), less if the invalid topic's limit requires;
//! - the record's own headers: kept if together at most [`KEPT_HEADERS_BYTES`] (16 KiB), else
//!   dropped;
//! - plus the quarantine headers and `hookline-original-key-bytes` / `-value-bytes` /
//!   `-headers-bytes`.

use crate::contract::envelope::InvalidReason;
use crate::contract::headers as h;
use crate::kafka::produce::{owned_headers, OwnedRecord};
use crate::kafka::recordsize::{headers_bytes, record_bytes};
use rdkafka::message::Headers;

/// Longest key prefix kept.
pub const KEY_PREFIX_BYTES: usize = 1024;
/// Longest value prefix kept.
pub const VALUE_PREFIX_BYTES: usize = 64 * 1024;
/// The record's own headers are kept only if together at most this large.
pub const KEPT_HEADERS_BYTES: usize = 16 * 1024;
/// Longest detail sentence kept.
const MAX_DETAIL_BYTES: usize = 1024;

/// Every header of the contract: a parked record's own copies of them are replaced, not repeated.
pub const HEADERS: [&str; 8] = [
    h::INVALID_REASON,
    h::INVALID_DETAIL,
    h::SOURCE_TOPIC,
    h::SOURCE_PARTITION,
    h::SOURCE_OFFSET,
    h::ORIGINAL_KEY_BYTES,
    h::ORIGINAL_VALUE_BYTES,
    h::ORIGINAL_HEADERS_BYTES,
];

/// Where the record was read.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

/// Why and from where a record is parked on `<p>.invalid`.
#[derive(Debug, Clone, Copy)]
pub struct Quarantine<'a> {
    /// The closed reason (`not_json`, `bad_delivery_record`, `record_too_large`, …).
    pub reason: &'a str,
    /// A human explanation naming the field.
    pub detail: &'a str,
    pub source: Source<'a>,
}

impl Quarantine<'_> {
    /// The record whole on `invalid_topic`: its key, value and `carried` headers (any earlier
    /// quarantine headers among them replaced) plus the quarantine headers.
    pub fn whole(
        &self,
        invalid_topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        carried: &[(String, Option<Vec<u8>>)],
    ) -> OwnedRecord {
        let (partition, offset) = self.position();
        let mut pairs = not_ours(carried);
        pairs.extend(self.pairs(self.detail, &partition, &offset));
        OwnedRecord {
            topic: invalid_topic.to_string(),
            partition: None,
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            headers: owned_headers(pairs),
        }
    }

    fn position(&self) -> (String, String) {
        (
            self.source.partition.to_string(),
            self.source.offset.to_string(),
        )
    }

    /// Reason, detail and source position.
    fn pairs<'b>(
        &'b self,
        detail: &'b str,
        partition: &'b str,
        offset: &'b str,
    ) -> [(&'b str, Option<&'b [u8]>); 5] {
        [
            (h::INVALID_REASON, Some(self.reason.as_bytes())),
            (h::INVALID_DETAIL, Some(detail.as_bytes())),
            (h::SOURCE_TOPIC, Some(self.source.topic.as_bytes())),
            (h::SOURCE_PARTITION, Some(partition.as_bytes())),
            (h::SOURCE_OFFSET, Some(offset.as_bytes())),
        ]
    }
}

/// `headers` without the quarantine contract's own.
fn not_ours(headers: &[(String, Option<Vec<u8>>)]) -> Vec<(&str, Option<&[u8]>)> {
    headers
        .iter()
        .filter(|(k, _)| !HEADERS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_deref()))
        .collect()
}

/// A consumed record's headers as owned (name, value) pairs, as [`Quarantine::whole`] and
/// [`too_large`] take them (none when it has none).
pub fn header_pairs<H: Headers>(headers: Option<&H>) -> Vec<(String, Option<Vec<u8>>)> {
    headers.map_or_else(Vec::new, |hs| {
        hs.iter()
            .map(|hd| (hd.key.to_string(), hd.value.map(<[u8]>::to_vec)))
            .collect()
    })
}

/// The quarantine record of a record that cannot be written whole, sized to fit `limit` (the
/// invalid topic's limit). `headers` are the record's own headers (any earlier quarantine
/// headers among them are replaced).
pub fn too_large(
    invalid_topic: &str,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(String, Option<Vec<u8>>)],
    detail: &str,
    source: Source<'_>,
    limit: usize,
) -> OwnedRecord {
    let carried = not_ours(headers);
    let carried_bytes = headers_bytes(carried.iter().map(|(k, v)| (*k, v.map_or(0, <[u8]>::len))));
    let keep_headers = carried_bytes <= KEPT_HEADERS_BYTES;

    let key_len = key.map_or(0, <[u8]>::len);
    let value_len = value.map_or(0, <[u8]>::len);
    let key_prefix = key.map(|k| &k[..k.len().min(KEY_PREFIX_BYTES)]);
    let quarantine = Quarantine {
        reason: InvalidReason::RecordTooLarge.as_str(),
        detail,
        source,
    };
    let detail = crate::contract::delivery::truncate(detail, MAX_DETAIL_BYTES);
    let (partition, offset) = quarantine.position();
    let (key_s, value_s, headers_s) = (
        key_len.to_string(),
        value_len.to_string(),
        carried_bytes.to_string(),
    );
    let mut pairs: Vec<(&str, Option<&[u8]>)> = if keep_headers { carried } else { Vec::new() };
    pairs.extend(quarantine.pairs(&detail, &partition, &offset));
    pairs.extend([
        (h::ORIGINAL_KEY_BYTES, Some(key_s.as_bytes())),
        (h::ORIGINAL_VALUE_BYTES, Some(value_s.as_bytes())),
    ]);
    if !keep_headers {
        pairs.push((h::ORIGINAL_HEADERS_BYTES, Some(headers_s.as_bytes())));
    }
    let headers_len = headers_bytes(pairs.iter().map(|(k, v)| (*k, v.map_or(0, <[u8]>::len))));

    // The value gets what is left under the limit (with the same margin as any record).
    let fixed = record_bytes(key_prefix.map_or(0, <[u8]>::len), 0, headers_len);
    let room = limit.saturating_sub(fixed) * 128 / 129;
    let value_prefix = value.map(|v| &v[..v.len().min(VALUE_PREFIX_BYTES).min(room)]);

    OwnedRecord {
        topic: invalid_topic.to_string(),
        partition: None,
        key: key_prefix.map(<[u8]>::to_vec),
        value: value_prefix.map(<[u8]>::to_vec),
        headers: owned_headers(pairs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Headers;

    fn get(r: &OwnedRecord, name: &str) -> Option<String> {
        r.headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    const SRC: Source<'static> = Source {
        topic: "p.events",
        partition: 2,
        offset: 41,
    };

    #[test]
    fn a_huge_value_is_cut_to_a_prefix_with_its_original_size() {
        let value = vec![b'v'; 8_000_000];
        let headers = vec![("x-trace".to_string(), Some(b"t1".to_vec()))];
        let r = too_large(
            "p.invalid",
            Some(b"k"),
            Some(&value),
            &headers,
            "too big",
            SRC,
            5 << 20,
        );
        assert_eq!(r.topic, "p.invalid");
        assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r.value.as_ref().map(Vec::len), Some(VALUE_PREFIX_BYTES));
        assert_eq!(
            get(&r, h::INVALID_REASON).as_deref(),
            Some("record_too_large")
        );
        assert_eq!(get(&r, h::ORIGINAL_VALUE_BYTES).as_deref(), Some("8000000"));
        assert_eq!(get(&r, h::ORIGINAL_KEY_BYTES).as_deref(), Some("1"));
        assert_eq!(get(&r, h::SOURCE_OFFSET).as_deref(), Some("41"));
        assert_eq!(get(&r, "x-trace").as_deref(), Some("t1"));
        assert!(get(&r, h::ORIGINAL_HEADERS_BYTES).is_none());
        assert!(r.size() <= 5 << 20);
    }

    #[test]
    fn a_huge_key_is_cut_and_a_small_value_kept_whole() {
        let key = vec![b'k'; 3_000_000];
        let r = too_large(
            "p.invalid",
            Some(&key),
            Some(b"{}"),
            &[],
            "key",
            SRC,
            5 << 20,
        );
        assert_eq!(r.key.as_ref().map(Vec::len), Some(KEY_PREFIX_BYTES));
        assert_eq!(r.value.as_deref(), Some(&b"{}"[..]));
        assert_eq!(get(&r, h::ORIGINAL_KEY_BYTES).as_deref(), Some("3000000"));
    }

    #[test]
    fn the_record_fits_a_small_invalid_topic_and_huge_headers_are_dropped() {
        let value = vec![b'v'; 100_000];
        let headers = vec![
            ("x-big".to_string(), Some(vec![b'h'; 50_000])),
            // An earlier quarantine's reason is replaced, not repeated.
            (h::INVALID_REASON.to_string(), Some(b"not_json".to_vec())),
        ];
        let r = too_large("p.invalid", None, Some(&value), &headers, "d", SRC, 8_192);
        assert!(r.size() <= 8_192, "size {}", r.size());
        assert!(r.value.as_ref().is_some_and(|v| !v.is_empty()));
        assert!(get(&r, "x-big").is_none());
        assert_eq!(get(&r, h::ORIGINAL_HEADERS_BYTES).as_deref(), Some("50015"));
        let reasons = r
            .headers
            .iter()
            .filter(|h| h.key == h::INVALID_REASON)
            .count();
        assert_eq!(reasons, 1);
    }

    #[test]
    fn a_whole_record_keeps_its_own_headers_and_replaces_quarantine_ones() {
        let carried = vec![
            ("x-trace".to_string(), Some(b"t1".to_vec())),
            (h::INVALID_REASON.to_string(), Some(b"not_json".to_vec())),
        ];
        let q = Quarantine {
            reason: "bad_delivery_record",
            detail: "header `hookline-attempt`: missing",
            source: SRC,
        };
        let r = q.whole("p.invalid", Some(b"k"), Some(b"{}"), &carried);
        assert_eq!(r.value.as_deref(), Some(&b"{}"[..]));
        assert_eq!(get(&r, "x-trace").as_deref(), Some("t1"));
        assert_eq!(
            get(&r, h::INVALID_REASON).as_deref(),
            Some("bad_delivery_record")
        );
        assert_eq!(get(&r, h::SOURCE_PARTITION).as_deref(), Some("2"));
        let reasons = r
            .headers
            .iter()
            .filter(|h| h.key == h::INVALID_REASON)
            .count();
        assert_eq!(reasons, 1);
    }
}
