//! Topic names and the topic plan implied by the configuration (`hookline topics apply`), and the
//! orphan retry tiers: `<p>.retry.<tier>` topics that exist but are no longer in `retry.schedule`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::{tier_name, Config};

/// Names of every topic of one installation, derived from the prefix.
#[derive(Debug, Clone)]
pub struct Topics {
    pub prefix: String,
}

impl Topics {
    pub fn new(prefix: &str) -> Self {
        Topics {
            prefix: prefix.to_string(),
        }
    }
    pub fn events(&self) -> String {
        format!("{}.events", self.prefix)
    }
    pub fn invalid(&self) -> String {
        format!("{}.invalid", self.prefix)
    }
    pub fn dedupe(&self) -> String {
        format!("{}.dedupe", self.prefix)
    }
    pub fn dedupe_state(&self) -> String {
        format!("{}.dedupe-state", self.prefix)
    }
    pub fn dispatch(&self) -> String {
        format!("{}.dispatch", self.prefix)
    }
    /// The tier whose attempts are due `offset` after the first attempt.
    pub fn retry(&self, offset: Duration) -> String {
        format!("{}.retry.{}", self.prefix, tier_name(offset))
    }
    /// `<p>.retry.`: every tier topic starts with it.
    pub fn retry_prefix(&self) -> String {
        format!("{}.retry.", self.prefix)
    }
    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.prefix)
    }
    /// Deliveries to rate-limited endpoints, waiting for their endpoint's budget; partitioned
    /// by endpoint id ([`throttle_partition`]), so one consumer paces each endpoint.
    pub fn throttle(&self) -> String {
        format!("{}.throttle", self.prefix)
    }
    /// Compacted: one record per finished replay, keyed by its replay key (`dlq:<p>:<offset>`).
    pub fn replays(&self) -> String {
        format!("{}.replays", self.prefix)
    }
    /// REST ingest's claims of `Idempotency-Key`s: the first claim of a key within the dedupe
    /// window says which request body the key belongs to.
    pub fn idempotency(&self) -> String {
        format!("{}.idempotency", self.prefix)
    }
    /// The live endpoint registry: compacted, one record per endpoint id (a tombstone deletes).
    pub fn endpoints(&self) -> String {
        format!("{}.endpoints", self.prefix)
    }
    /// The delivery log: one small record per attempt, keyed by event id.
    pub fn attempts(&self) -> String {
        format!("{}.attempts", self.prefix)
    }
    /// Operational events (an endpoint auto-disabled, …).
    pub fn operational(&self) -> String {
        format!("{}.operational", self.prefix)
    }
}

/// The `<p>.throttle` partition of an endpoint's deliveries (of `partitions`): every writer
/// agrees, so exactly one consumer owns an endpoint's pacing.
pub fn throttle_partition(endpoint_id: &str, partitions: i32) -> i32 {
    let h = xxhash_rust::xxh3::xxh3_64(endpoint_id.as_bytes());
    i32::try_from(h % u64::from(partitions.max(1).unsigned_abs())).unwrap_or(0)
}

/// What one topic should look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i32,
    /// Topic-level configs we own; any other config on the topic is left alone.
    pub configs: BTreeMap<String, String>,
    /// One line on why the topic exists, for `topics describe`.
    pub purpose: &'static str,
}

/// Largest record value accepted by the pipeline topics (payload limit + header room).
pub const MAX_MESSAGE_BYTES: usize = 5 * 1024 * 1024;

fn retention(d: Option<Duration>) -> String {
    match d {
        None => "-1".into(),
        Some(d) => d.as_millis().to_string(),
    }
}

/// Every topic the configuration implies, in pipeline order.
pub fn plan(config: &Config) -> Vec<TopicSpec> {
    let t = Topics::new(&config.topics.prefix);
    let p = config.topics.partitions;
    let rf = config.topics.replication_factor;
    let isr = config.topics.min_insync_replicas();
    let spec = |name: String, purpose: &'static str, retention_ms: Option<Duration>| {
        let mut configs = BTreeMap::new();
        configs.insert("cleanup.policy".to_string(), "delete".to_string());
        configs.insert("retention.ms".to_string(), retention(retention_ms));
        configs.insert(
            "max.message.bytes".to_string(),
            MAX_MESSAGE_BYTES.to_string(),
        );
        // With the broker default of 1, an `acks=all` write (a dead letter, a hand-off) is
        // acknowledged by the leader alone and lost with its disk.
        configs.insert("min.insync.replicas".to_string(), isr.to_string());
        TopicSpec {
            name,
            partitions: p,
            replication_factor: rf,
            configs,
            purpose,
        }
    };
    let flow = Some(config.topics.flow_retention);
    let mut out = vec![
        spec(t.events(), "input: events written by producers", flow),
        spec(
            t.invalid(),
            "quarantine: records that failed validation (kept forever)",
            None,
        ),
        spec(
            t.dedupe(),
            "valid events re-partitioned by our hash of the dedupe key",
            flow,
        ),
        spec(
            t.dedupe_state(),
            "changelog of the dedupe seen-set (window + margin)",
            Some(config.dedupe.window + config.topics.dedupe_state_retention_margin),
        ),
        spec(
            t.dispatch(),
            "first sightings, exactly once, ready to deliver",
            flow,
        ),
    ];
    for offset in config.retry.schedule.iter().skip(1) {
        let mut tier = spec(
            t.retry(*offset),
            "retry tier: deliveries due at this offset from the first attempt",
            Some(*offset + config.topics.tier_retention_margin),
        );
        // The broker's clock stamps tier records, so a tier worker can bound a due time written
        // by a host whose clock runs fast (record timestamp + the tier's delay); with CreateTime
        // the timestamp would come from that same fast clock.
        tier.configs.insert(
            "message.timestamp.type".to_string(),
            "LogAppendTime".to_string(),
        );
        out.push(tier);
    }
    out.push(spec(
        t.throttle(),
        "rate-limited deliveries waiting for their endpoint's budget, partitioned by endpoint id",
        flow,
    ));
    out.push(spec(
        t.dlq(),
        "dead letters: deliveries that exhausted the schedule (kept forever)",
        None,
    ));
    let mut replays = spec(
        t.replays(),
        "finished DLQ replays by replay key, so a replay never sends twice (compacted)",
        None,
    );
    replays
        .configs
        .insert("cleanup.policy".to_string(), "compact".to_string());
    out.push(replays);
    // Deleted by time, never compacted: compaction keeps a key's last claim, and the first one
    // is the one that counts.
    out.push(spec(
        t.idempotency(),
        "ingest: claims of Idempotency-Keys, the first per key wins (dedupe window + margin)",
        Some(config.dedupe.window + config.topics.dedupe_state_retention_margin),
    ));
    // The control plane. One partition for the registry: a few records, one total order that
    // every reader applies alike, and one place to be caught up with.
    let mut endpoints = spec(
        t.endpoints(),
        "control: live endpoint registry by endpoint id, secrets encrypted (compacted)",
        None,
    );
    endpoints.partitions = 1;
    endpoints
        .configs
        .insert("cleanup.policy".to_string(), "compact".to_string());
    out.push(endpoints);
    out.push(spec(
        t.attempts(),
        "control: delivery log, one record per attempt keyed by event id (control.attempts_retention)",
        Some(config.control.attempts_retention),
    ));
    let mut operational = spec(
        t.operational(),
        "control: operational events such as an endpoint auto-disabled",
        Some(config.control.operational_retention),
    );
    operational.partitions = 1;
    out.push(operational);
    out
}

/// The offset from the first attempt named by a tier label (`1m`, `2h`, `3s`, `1500ms`, `2d`), when
/// the label is exactly what [`tier_name`] gives for it (so `60s` or `foo` name no tier).
pub fn tier_offset(label: &str) -> Option<Duration> {
    let (digits, unit_ms) = if let Some(n) = label.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = label.strip_suffix('s') {
        (n, 1_000)
    } else if let Some(n) = label.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = label.strip_suffix('h') {
        (n, 3_600_000)
    } else if let Some(n) = label.strip_suffix('d') {
        (n, 86_400_000)
    } else {
        return None;
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let offset = Duration::from_millis(n.checked_mul(unit_ms)?);
    (!offset.is_zero() && tier_name(offset) == label).then_some(offset)
}

/// A `<p>.retry.<tier>` topic that exists on the broker but whose tier is not in the current
/// `retry.schedule` (the schedule changed). Its records are still processed by the tier workers
/// (attempted when due, then moved on by the current schedule); it is never deleted for you.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanTier {
    pub topic: String,
    /// The tier name (`3m`), also its consumer group suffix (`<group_prefix>.retry.3m`).
    pub name: String,
    /// Its offset from the first attempt, read from the name.
    pub offset: Duration,
}

/// The orphan tiers among `existing` topic names: `<p>.retry.<tier>` with a valid tier name that
/// the schedule does not have. Sorted by offset.
pub fn orphan_tiers<'a>(
    config: &Config,
    existing: impl IntoIterator<Item = &'a str>,
) -> Vec<OrphanTier> {
    let t = Topics::new(&config.topics.prefix);
    let retry_prefix = t.retry_prefix();
    let current: Vec<String> = config
        .retry
        .schedule
        .iter()
        .skip(1)
        .map(|o| t.retry(*o))
        .collect();
    let mut out: Vec<OrphanTier> = existing
        .into_iter()
        .filter(|topic| !current.iter().any(|c| c == topic))
        .filter_map(|topic| {
            let name = topic.strip_prefix(&retry_prefix)?;
            let offset = tier_offset(name)?;
            Some(OrphanTier {
                topic: topic.to_string(),
                name: name.to_string(),
                offset,
            })
        })
        .collect();
    out.sort_by(|a, b| a.offset.cmp(&b.offset).then(a.topic.cmp(&b.topic)));
    out
}

/// A difference between an existing topic and its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    pub topic: String,
    pub what: String,
    pub expected: String,
    pub actual: String,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} is {} (expected {})",
            self.topic, self.what, self.actual, self.expected
        )
    }
}

/// Compares an existing topic (partition count, replication, configs) with its spec.
pub fn drift(
    spec: &TopicSpec,
    partitions: i32,
    replication_factor: i32,
    configs: &BTreeMap<String, String>,
) -> Vec<Drift> {
    let mut out = Vec::new();
    let d = |what: &str, expected: String, actual: String| Drift {
        topic: spec.name.clone(),
        what: what.to_string(),
        expected,
        actual,
    };
    if partitions != spec.partitions {
        out.push(d(
            "partitions",
            spec.partitions.to_string(),
            partitions.to_string(),
        ));
    }
    if replication_factor != spec.replication_factor {
        out.push(d(
            "replication factor",
            spec.replication_factor.to_string(),
            replication_factor.to_string(),
        ));
    }
    for (k, v) in &spec.configs {
        let actual = configs.get(k).cloned().unwrap_or_else(|| "(unset)".into());
        if &actual != v {
            out.push(d(k, v.clone(), actual));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_has_one_throttle_partition() {
        let p = throttle_partition("crm", 6);
        assert!((0..6).contains(&p));
        assert_eq!(p, throttle_partition("crm", 6), "every writer agrees");
        let spread: std::collections::BTreeSet<i32> = (0..100)
            .map(|i| throttle_partition(&format!("ep-{i}"), 6))
            .collect();
        assert_eq!(spread.len(), 6);
    }

    #[test]
    fn plan_covers_pipeline_and_tiers() {
        let c = Config::from_toml_with_env(
            "[kafka]\nbootstrap_servers = \"x:1\"\n[topics]\nprefix = \"p\"\npartitions = 3\n",
            "t",
            Vec::new(),
        )
        .expect("config");
        let names: Vec<String> = plan(&c).into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "p.events",
                "p.invalid",
                "p.dedupe",
                "p.dedupe-state",
                "p.dispatch",
                "p.retry.1m",
                "p.retry.5m",
                "p.retry.30m",
                "p.retry.2h",
                "p.retry.6h",
                "p.retry.24h",
                "p.throttle",
                "p.dlq",
                "p.replays",
                "p.idempotency",
                "p.endpoints",
                "p.attempts",
                "p.operational"
            ]
        );
        let specs = plan(&c);
        let dlq = &specs[12];
        assert_eq!(dlq.configs["retention.ms"], "-1");
        assert_eq!(dlq.configs["cleanup.policy"], "delete");
        let replays = &specs[13];
        assert_eq!(replays.configs["cleanup.policy"], "compact");
        assert_eq!(replays.configs["retention.ms"], "-1");
        let state = &specs[3];
        assert_eq!(
            state.configs["retention.ms"],
            (48 * 3_600_000u64).to_string()
        );
        let endpoints = &specs[15];
        assert_eq!(endpoints.partitions, 1);
        assert_eq!(endpoints.configs["cleanup.policy"], "compact");
        assert_eq!(endpoints.configs["retention.ms"], "-1");
        let attempts = &specs[16];
        assert_eq!(attempts.partitions, 3);
        assert_eq!(attempts.configs["cleanup.policy"], "delete");
        assert_eq!(
            attempts.configs["retention.ms"],
            (7 * 86_400_000u64).to_string()
        );
        assert_eq!(specs[17].partitions, 1);
        let tier24 = &specs[10];
        assert_eq!(
            tier24.configs["retention.ms"],
            ((24 + 7 * 24) * 3_600_000u64).to_string()
        );
    }

    #[test]
    fn every_topic_gets_min_insync_replicas() {
        let load = |extra: &str| {
            Config::from_toml_with_env(
                &format!("[kafka]\nbootstrap_servers = \"x:1\"\n[topics]\n{extra}"),
                "t",
                Vec::new(),
            )
            .expect("config")
        };
        for (extra, want) in [
            ("", "1"),
            ("replication_factor = 3\n", "2"),
            ("replication_factor = 3\nmin_insync_replicas = 3\n", "3"),
        ] {
            for spec in plan(&load(extra)) {
                assert_eq!(
                    spec.configs.get("min.insync.replicas").map(String::as_str),
                    Some(want),
                    "{} with {extra:?}",
                    spec.name
                );
            }
        }
        // An existing topic left at another value is drift.
        let spec = plan(&load("replication_factor = 3\n")).remove(0);
        let mut configs = spec.configs.clone();
        configs.insert("min.insync.replicas".into(), "1".into());
        let d = drift(&spec, spec.partitions, 3, &configs);
        assert_eq!(d.len(), 1);
        assert!(d[0]
            .to_string()
            .ends_with("min.insync.replicas is 1 (expected 2)"));
    }

    #[test]
    fn tier_labels_parse_back_to_their_offsets() {
        for secs in [1u64, 2, 59, 60, 90, 300, 3_600, 7_200, 86_400, 172_800] {
            let d = Duration::from_secs(secs);
            assert_eq!(tier_offset(&tier_name(d)), Some(d), "{}", tier_name(d));
        }
        assert_eq!(tier_offset("1500ms"), Some(Duration::from_millis(1_500)));
        for bad in [
            "", "m", "60s", "1.5m", "-1m", "0s", "1w", "foo", "5m.x", "1d", "+5m",
        ] {
            assert_eq!(tier_offset(bad), None, "{bad}");
        }
    }

    #[test]
    fn orphan_tiers_are_retry_topics_the_schedule_dropped() {
        let c = Config::from_toml_with_env(
            "[kafka]\nbootstrap_servers = \"x:1\"\n[topics]\nprefix = \"p\"\n[retry]\nschedule = [\"0s\", \"1m\", \"5m\"]\n",
            "t",
            Vec::new(),
        )
        .expect("config");
        let existing = [
            "p.retry.1m",
            "p.retry.30m",
            "p.retry.2m",
            "p.retry.5m",
            "p.retry.bogus",
            "p.retry.30m.x",
            "q.retry.3m",
            "p.dlq",
        ];
        let orphans = orphan_tiers(&c, existing);
        let got: Vec<(&str, &str, u64)> = orphans
            .iter()
            .map(|o| (o.topic.as_str(), o.name.as_str(), o.offset.as_secs()))
            .collect();
        assert_eq!(
            got,
            [("p.retry.2m", "2m", 120), ("p.retry.30m", "30m", 1_800)]
        );
        let tier = plan(&c)
            .into_iter()
            .find(|s| s.name == "p.retry.1m")
            .expect("tier");
        assert_eq!(tier.configs["message.timestamp.type"], "LogAppendTime");
    }

    #[test]
    fn drift_reports_differences() {
        let c =
            Config::from_toml_with_env("[kafka]\nbootstrap_servers = \"x:1\"\n", "t", Vec::new())
                .expect("config");
        let spec = plan(&c).remove(0);
        let mut configs = spec.configs.clone();
        assert!(drift(&spec, spec.partitions, 1, &configs).is_empty());
        configs.insert("retention.ms".into(), "1000".into());
        let d = drift(&spec, 2, 1, &configs);
        assert_eq!(d.len(), 2);
        assert!(d[0].to_string().contains("partitions is 2 (expected 6)"));
    }
}
