//! Dead deliveries: reading `<p>.dlq`, the filters shared with `replay`, and `hookline dead
//! list/show`.
//!
//! A dead letter is the delivery record as it was when it died: value = the producer's event
//! bytes, key = the original key, headers = the delivery metadata (endpoint, event id/type/tenant,
//! every attempt, dead reason and time; see `hookline_common::contract::delivery`).

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::bail;
use bytes::Bytes;
use rdkafka::message::{Headers, Message, OwnedMessage};
use serde_json::{json, Value};

use hookline_common::config::glob::glob_match;
use hookline_common::config::Config;
use hookline_common::contract::delivery::{self, DeliveryMeta};
use hookline_common::contract::replays::ReplayRecord;
use hookline_common::contract::topics::Topics;

use crate::read::{Range, TopicReader};

/// Bytes of the body shown by `dead show`.
const BODY_PREVIEW: usize = 1024;

/// One record of `<p>.dlq`.
#[derive(Debug, Clone)]
pub struct DeadRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Bytes,
    pub dedupe_key: Option<String>,
    /// The delivery metadata, or why it cannot be read.
    pub meta: Result<DeliveryMeta, String>,
    /// Headers that are not delivery metadata (carried from the producer), for `dead show`.
    pub other_headers: Vec<(String, String)>,
}

impl DeadRecord {
    pub fn from_message(m: &OwnedMessage) -> DeadRecord {
        let meta = DeliveryMeta::from_message(m).map_err(|e| e.to_string());
        let other_headers = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .filter(|hd| !hd.key.starts_with("hookline-"))
                    .map(|hd| {
                        (
                            hd.key.to_string(),
                            String::from_utf8_lossy(hd.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        DeadRecord {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
            dedupe_key: DeliveryMeta::dedupe_key_of(m),
            meta,
            other_headers,
        }
    }

    /// `<partition>:<offset>`, how records are named on the command line.
    pub fn position(&self) -> String {
        format!("{}:{}", self.partition, self.offset)
    }

    /// The intent-derived key of replaying this record: `dlq:<partition>:<offset>`.
    pub fn replay_key(&self) -> String {
        replay_key(self.partition, self.offset)
    }
}

/// `dlq:<partition>:<offset>`.
pub fn replay_key(partition: i32, offset: i64) -> String {
    format!("dlq:{partition}:{offset}")
}

/// Attempts made (the number of the last one).
pub fn attempts_made(meta: &DeliveryMeta) -> u32 {
    // A deferral is recorded in the history with the number of the attempt it did not make.
    meta.history
        .iter()
        .rev()
        .find(|a| a.class != delivery::DEFERRED)
        .map_or(meta.attempt.saturating_sub(1), |a| a.n)
}

/// Class (and status) of the last attempt: `http_status 503`, `timeout`, `-` when none.
pub fn last_error(meta: &DeliveryMeta) -> String {
    match meta.history.last() {
        None => "-".into(),
        Some(a) => match a.status {
            Some(s) => format!("{} {s}", a.class),
            None => a.class.clone(),
        },
    }
}

/// RFC 3339 (UTC, milliseconds) of a unix-ms time.
pub fn rfc3339_ms(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
}

fn rfc3339_s(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Which dead letters a command applies to. Every set field must match.
#[derive(Debug, Clone, Default)]
pub struct DeadFilter {
    pub endpoint: Option<String>,
    /// Glob on the event type (`message.*`).
    pub event_type: Option<String>,
    pub tenant: Option<String>,
    pub event_id: Option<String>,
    /// Dead at or after (unix ms).
    pub dead_after_ms: Option<i64>,
    /// Dead before (unix ms).
    pub dead_before_ms: Option<i64>,
    pub partition: Option<i32>,
    /// First DLQ offset (in every selected partition).
    pub from_offset: Option<i64>,
    /// Last DLQ offset, inclusive.
    pub to_offset: Option<i64>,
}

impl DeadFilter {
    /// True when no field is set (every dead letter matches).
    pub fn is_unrestricted(&self) -> bool {
        let DeadFilter {
            endpoint,
            event_type,
            tenant,
            event_id,
            dead_after_ms,
            dead_before_ms,
            partition,
            from_offset,
            to_offset,
        } = self;
        endpoint.is_none()
            && event_type.is_none()
            && tenant.is_none()
            && event_id.is_none()
            && dead_after_ms.is_none()
            && dead_before_ms.is_none()
            && partition.is_none()
            && from_offset.is_none()
            && to_offset.is_none()
    }

    pub(crate) fn range(&self) -> Range {
        Range {
            partitions: self.partition.map(|p| vec![p]),
            from_offset: self.from_offset,
            to_offset: self.to_offset,
        }
    }

    /// Whether `r` is selected. A record whose metadata cannot be read matches only filters on
    /// position.
    pub fn matches(&self, r: &DeadRecord) -> bool {
        if self.partition.is_some_and(|p| p != r.partition)
            || self.from_offset.is_some_and(|o| r.offset < o)
            || self.to_offset.is_some_and(|o| r.offset > o)
        {
            return false;
        }
        let meta = match &r.meta {
            Ok(meta) => meta,
            Err(_) => {
                return self.endpoint.is_none()
                    && self.event_type.is_none()
                    && self.tenant.is_none()
                    && self.event_id.is_none()
                    && self.dead_after_ms.is_none()
                    && self.dead_before_ms.is_none()
            }
        };
        let dead_at = meta.dead_at_ms;
        self.endpoint
            .as_ref()
            .is_none_or(|e| *e == meta.endpoint_id)
            && self
                .event_type
                .as_ref()
                .is_none_or(|g| glob_match(g, &meta.event_type))
            && self
                .tenant
                .as_ref()
                .is_none_or(|t| meta.tenant.as_ref() == Some(t))
            && self.event_id.as_ref().is_none_or(|i| *i == meta.event_id)
            && self
                .dead_after_ms
                .is_none_or(|t| dead_at.is_some_and(|d| d >= t))
            && self
                .dead_before_ms
                .is_none_or(|t| dead_at.is_some_and(|d| d < t))
    }
}

/// Output format of `dead list/show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    #[default]
    Table,
    /// One JSON object per line (per record) for tools.
    Json,
}

/// Reads the dead letters matching `filter`, in partition then offset order of arrival,
/// calling `each` for every one.
pub(crate) async fn scan(
    config: &Config,
    filter: &DeadFilter,
    mut each: impl FnMut(DeadRecord) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let topic = Topics::new(&config.topics.prefix).dlq();
    let mut reader = TopicReader::open(config, &topic, &filter.range()).await?;
    while let Some(m) = reader.next().await? {
        let record = DeadRecord::from_message(&m);
        if filter.matches(&record) {
            each(record)?;
        }
    }
    Ok(())
}

/// `hookline dead list`: one row (or JSON line) per matching dead letter. Returns how many.
pub async fn list(
    config: &Config,
    filter: &DeadFilter,
    format: Format,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<usize> {
    let mut rows: Vec<[String; 9]> = Vec::new();
    let mut count = 0;
    scan(config, filter, |r| {
        count += 1;
        match format {
            Format::Json => writeln!(out, "{}", to_json(&r, None, false))?,
            Format::Table => rows.push(table_row(&r)),
        }
        Ok(())
    })
    .await?;
    if format == Format::Table {
        let header = [
            "POSITION",
            "DEAD AT",
            "ENDPOINT",
            "EVENT ID",
            "TYPE",
            "TENANT",
            "REASON",
            "ATTEMPTS",
            "LAST ERROR",
        ];
        hookline_common::runtime::table::write_table(out, &header, &rows)?;
        writeln!(out, "{count} dead deliveries")?;
    }
    Ok(count)
}

fn table_row(r: &DeadRecord) -> [String; 9] {
    match &r.meta {
        Ok(m) => [
            r.position(),
            m.dead_at_ms.map_or_else(|| "-".into(), rfc3339_s),
            m.endpoint_id.clone(),
            m.event_id.clone(),
            m.event_type.clone(),
            m.tenant.clone().unwrap_or_else(|| "-".into()),
            m.dead_reason.map_or("-", |d| d.as_str()).to_string(),
            attempts_made(m).to_string(),
            last_error(m),
        ],
        Err(e) => [
            r.position(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "unreadable".into(),
            "-".into(),
            delivery::truncate(e, 60),
        ],
    }
}

/// The JSON form of a dead letter; `replayed` is its entry in `<p>.replays`, if any.
pub fn to_json(r: &DeadRecord, replayed: Option<&ReplayRecord>, with_body: bool) -> Value {
    let mut v = match &r.meta {
        Ok(m) => json!({
            "position": r.position(),
            "partition": r.partition,
            "offset": r.offset,
            "key": r.key.as_deref().map(String::from_utf8_lossy),
            "endpoint_id": m.endpoint_id,
            "event_id": m.event_id,
            "event_type": m.event_type,
            "tenant": m.tenant,
            "dead_reason": m.dead_reason.map(|d| d.as_str()),
            "dead_at_ms": m.dead_at_ms,
            "dead_at": m.dead_at_ms.map(rfc3339_ms),
            "first_attempt_ms": m.first_attempt_ms,
            "last_attempt_ms": m.history.last().map(|a| a.at_ms),
            "attempts": attempts_made(m),
            "last_error": last_error(m),
            "replay_key": m.replay_key,
            "history": m.history,
            "body_bytes": r.value.len(),
        }),
        Err(e) => json!({
            "position": r.position(),
            "partition": r.partition,
            "offset": r.offset,
            "key": r.key.as_deref().map(String::from_utf8_lossy),
            "error": e,
            "body_bytes": r.value.len(),
        }),
    };
    if let Some(obj) = v.as_object_mut() {
        if let Some(replayed) = replayed {
            obj.insert("replayed".into(), json!(replayed));
        }
        if with_body {
            obj.insert("headers".into(), json!(r.other_headers));
            obj.insert(
                "body_preview".into(),
                json!(String::from_utf8_lossy(
                    &r.value[..r.value.len().min(BODY_PREVIEW)]
                )),
            );
        }
    }
    v
}

/// One line on a replay outcome recorded on `<p>.replays`.
fn describe_replay(replayed: Option<&ReplayRecord>) -> String {
    let Some(r) = replayed else {
        return "no".into();
    };
    let result = if r.result.is_empty() { "?" } else { &r.result };
    let at = if r.finished_at_ms > 0 {
        rfc3339_ms(r.finished_at_ms)
    } else {
        "?".into()
    };
    let record = r.attempt_record.as_ref();
    let class = match record.map(|a| a.class.as_str()) {
        Some("ok") => "status",
        Some(class) => class,
        None => "?",
    };
    let status = record
        .and_then(|a| a.status)
        .map(|s| format!(" {s}"))
        .unwrap_or_default();
    let mut line = format!("{result} at {at} (attempt {}, {class}{status})", r.attempt);
    if let Some(topic) = &r.returned_to {
        line.push_str(&format!(", returned to {topic}"));
    }
    line
}

/// `<partition>:<offset>` of a DLQ record, as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DlqPosition {
    pub partition: i32,
    pub offset: i64,
}

impl std::str::FromStr for DlqPosition {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not <partition>:<offset> (e.g. 0:42)");
        let (p, o) = s.split_once(':').ok_or_else(bad)?;
        Ok(DlqPosition {
            partition: p.trim().parse().map_err(|_| bad())?,
            offset: o.trim().parse().map_err(|_| bad())?,
        })
    }
}

/// `hookline dead show <partition>:<offset>`: every field, the attempt history, the replay status
/// and a body preview.
pub async fn show(
    config: &Config,
    at: DlqPosition,
    format: Format,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let Some(r) = crate::dead_page::one(config, at).await? else {
        bail!(
            "no dead letter at {}:{} (the offset is out of range or a transaction marker)",
            at.partition,
            at.offset
        );
    };
    let replays: HashMap<String, ReplayRecord> = crate::replay::finished(config).await?;
    let replayed = replays.get(&r.replay_key());
    if format == Format::Json {
        writeln!(out, "{}", to_json(&r, replayed, true))?;
        return Ok(());
    }
    let dlq = Topics::new(&config.topics.prefix).dlq();
    writeln!(out, "dead letter {dlq} {}", r.position())?;
    let key = r
        .key
        .as_deref()
        .map_or_else(|| "-".into(), |k| String::from_utf8_lossy(k).into_owned());
    match &r.meta {
        Err(e) => writeln!(out, "  metadata     unreadable: {e}")?,
        Ok(m) => {
            let reason = m.dead_reason.map_or("-", |d| d.as_str());
            let dead_at = m.dead_at_ms.map_or_else(|| "-".into(), rfc3339_ms);
            writeln!(out, "  dead at      {dead_at} ({reason})")?;
            writeln!(out, "  endpoint     {}", m.endpoint_id)?;
            writeln!(out, "  event        {}", m.event_id)?;
            writeln!(out, "  type         {}", m.event_type)?;
            writeln!(out, "  tenant       {}", m.tenant.as_deref().unwrap_or("-"))?;
            writeln!(out, "  key          {key}")?;
            writeln!(
                out,
                "  attempts     {} (first {}, last {})",
                attempts_made(m),
                rfc3339_ms(m.first_attempt_ms),
                m.history
                    .last()
                    .map_or_else(|| "-".into(), |a| rfc3339_ms(a.at_ms))
            )?;
            if let Some(k) = &m.replay_key {
                writeln!(out, "  replay of    {k}")?;
            }
            if let Some(dk) = &r.dedupe_key {
                writeln!(out, "  dedupe key   {dk}")?;
            }
        }
    }
    writeln!(out, "  replayed     {}", describe_replay(replayed))?;
    if let Ok(m) = &r.meta {
        writeln!(out, "history:")?;
        for a in &m.history {
            let status = a.status.map(|s| format!(" {s}")).unwrap_or_default();
            let snippet = if a.snippet.is_empty() {
                String::new()
            } else {
                format!("  {:?}", delivery::truncate(&a.snippet, 120))
            };
            writeln!(
                out,
                "  #{:<3} {}  {:>6} ms  {}{status}{snippet}",
                a.n,
                rfc3339_ms(a.at_ms),
                a.duration_ms,
                a.class
            )?;
        }
    }
    if !r.other_headers.is_empty() {
        writeln!(out, "headers:")?;
        for (k, v) in &r.other_headers {
            writeln!(out, "  {k}: {v}")?;
        }
    }
    let shown = r.value.len().min(BODY_PREVIEW);
    writeln!(out, "body ({} bytes, first {shown} shown):", r.value.len())?;
    writeln!(out, "  {}", String::from_utf8_lossy(&r.value[..shown]))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_common::contract::delivery::{AttemptRecord, DeadReason};

    fn record(partition: i32, offset: i64) -> DeadRecord {
        DeadRecord {
            partition,
            offset,
            key: Some(b"evt_1".to_vec()),
            value: Bytes::from_static(b"{\"id\":\"evt_1\"}"),
            dedupe_key: None,
            meta: Ok(DeliveryMeta {
                endpoint_id: "ep1".into(),
                event_id: "evt_1".into(),
                event_type: "message.created".into(),
                tenant: Some("acme".into()),
                attempt: 8,
                deferrals: 0,
                first_attempt_ms: 1_000,
                due_ms: 1_000,
                history: (1..=7)
                    .map(|n| AttemptRecord {
                        n,
                        at_ms: 1_000 + i64::from(n),
                        duration_ms: 3,
                        status: Some(503),
                        class: "http_status".into(),
                        snippet: String::new(),
                    })
                    .collect(),
                dead_reason: Some(DeadReason::Exhausted),
                dead_at_ms: Some(5_000),
                replay_key: None,
                trace: None,
            }),
            other_headers: vec![],
        }
    }

    #[test]
    fn filters_combine() {
        let r = record(1, 10);
        assert!(DeadFilter::default().matches(&r));
        let f = |f: DeadFilter| f.matches(&r);
        assert!(f(DeadFilter {
            event_type: Some("message.*".into()),
            tenant: Some("acme".into()),
            endpoint: Some("ep1".into()),
            ..Default::default()
        }));
        assert!(!f(DeadFilter {
            event_type: Some("call.*".into()),
            ..Default::default()
        }));
        assert!(!f(DeadFilter {
            tenant: Some("globex".into()),
            ..Default::default()
        }));
        assert!(f(DeadFilter {
            dead_after_ms: Some(5_000),
            dead_before_ms: Some(5_001),
            ..Default::default()
        }));
        assert!(!f(DeadFilter {
            dead_before_ms: Some(5_000),
            ..Default::default()
        }));
        assert!(!f(DeadFilter {
            partition: Some(0),
            ..Default::default()
        }));
        assert!(!f(DeadFilter {
            from_offset: Some(11),
            ..Default::default()
        }));
        assert!(f(DeadFilter {
            to_offset: Some(10),
            event_id: Some("evt_1".into()),
            ..Default::default()
        }));
    }

    #[test]
    fn unreadable_records_match_position_filters_only() {
        let mut r = record(0, 3);
        r.meta = Err("missing".into());
        assert!(DeadFilter::default().matches(&r));
        assert!(DeadFilter {
            partition: Some(0),
            ..Default::default()
        }
        .matches(&r));
        assert!(!DeadFilter {
            endpoint: Some("ep1".into()),
            ..Default::default()
        }
        .matches(&r));
    }

    #[test]
    fn table_and_json_forms() {
        let r = record(2, 7);
        let row = table_row(&r);
        assert_eq!(row[0], "2:7");
        assert_eq!(row[1], "1970-01-01T00:00:05Z");
        assert_eq!(&row[6..], ["exhausted", "7", "http_status 503"]);
        let v = to_json(&r, None, true);
        assert_eq!(v["attempts"], 7);
        assert_eq!(v["history"].as_array().map(Vec::len), Some(7));
        assert_eq!(v["body_preview"], "{\"id\":\"evt_1\"}");
        assert_eq!(r.replay_key(), "dlq:2:7");
        let mut out = Vec::new();
        hookline_common::runtime::table::write_table(&mut out, &["H"; 9], &[row]).expect("write");
        let text = String::from_utf8(out).expect("utf8");
        assert!(
            text.lines().nth(1).is_some_and(|l| l.starts_with("2:7  ")),
            "{text}"
        );
    }

    #[test]
    fn replay_outcomes_read_as_a_sentence() {
        assert_eq!(describe_replay(None), "no");
        let v = ReplayRecord {
            result: "failed".into(),
            attempt: 8,
            finished_at_ms: 1_000,
            attempt_record: Some(hookline_common::contract::delivery::AttemptRecord {
                n: 8,
                at_ms: 1_000,
                duration_ms: 3,
                status: Some(500),
                class: "http_status".into(),
                snippet: String::new(),
            }),
            returned_to: Some("p.dlq".into()),
            ..ReplayRecord::default()
        };
        assert_eq!(
            describe_replay(Some(&v)),
            "failed at 1970-01-01T00:00:01.000Z (attempt 8, http_status 500), returned to p.dlq"
        );
    }

    #[test]
    fn positions_parse() {
        assert_eq!(
            "3:42".parse::<DlqPosition>(),
            Ok(DlqPosition {
                partition: 3,
                offset: 42
            })
        );
        assert!("3".parse::<DlqPosition>().is_err());
        assert!("a:1".parse::<DlqPosition>().is_err());
    }
}
