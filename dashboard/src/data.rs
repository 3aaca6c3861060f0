//! What the dashboard shows, and the one trait the admin process implements to supply it.
//!
//! The dashboard renders; it reads nothing from Kafka itself. The admin process implements
//! [`Backend`] over the same calls its JSON API makes (endpoint registry, health from the
//! delivery log, dead letters, replay), so a page and an API call always agree, and tenant
//! scoping is applied in one place.

use std::future::Future;

use serde::Deserialize;

/// Who is looking: an admin sees every tenant, a tenant token only its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Admin,
    Tenant(String),
}

impl Scope {
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Scope::Admin => None,
            Scope::Tenant(t) => Some(t),
        }
    }
}

/// One endpoint in the list.
#[derive(Debug, Clone, Default)]
pub struct EndpointRow {
    pub id: String,
    pub url: String,
    pub tenant: Option<String>,
    pub event_types: Vec<String>,
    pub enabled: bool,
    pub health: Health,
    /// Deliveries to this endpoint that are dead (in the DLQ, not replayed successfully).
    pub dead: u64,
    /// Its attempts per minute over the last 24 h, from the delivery log.
    pub activity: Activity,
    /// Its delivery settings, as the endpoint page shows (and edits) them.
    pub settings: Settings,
}

/// A change of an endpoint's settings from its page's form, parsed (every field is replaced:
/// the form shows them all). Header values `None` keep the current value of that name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SettingsChange {
    /// The version the form was read at: a change made since is refused.
    pub version: u64,
    pub rate_limit: Option<f64>,
    pub burst: Option<u32>,
    pub filter: Option<String>,
    /// (name, value, secret).
    pub headers: Vec<(String, Option<String>, bool)>,
    pub timeout: Option<std::time::Duration>,
    pub max_concurrency: Option<usize>,
}

/// An endpoint's delivery settings. Secret header values are never here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    pub rate_limit: Option<f64>,
    pub burst: Option<u32>,
    pub filter: Option<String>,
    /// (name, value unless secret, secret).
    pub headers: Vec<(String, Option<String>, bool)>,
    /// `5s`, when set.
    pub timeout: Option<String>,
    pub max_concurrency: Option<usize>,
    /// Changed in the config file only (the page shows, does not edit).
    pub file_managed: bool,
    /// The version an edit is made against (a concurrent change is refused).
    pub version: u64,
}

/// Attempts of an endpoint: (minute, delivered, failed, throttled) for every minute with attempts
/// in the last hour and every hour with attempts before that (at the hour's first minute), oldest
/// first (minute = unix ms / 60,000), and the current minute.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    pub now_minute: i64,
    /// (minute, delivered, failed, throttled): throttled attempts are also delivered or failed,
    /// those that had waited for the endpoint's rate limit.
    pub minutes: Vec<(i64, u64, u64, u64)>,
}

impl Activity {
    /// (delivered, failed, throttled) per bucket of `bucket_minutes`, `buckets` of them ending
    /// with the current minute's bucket, oldest first.
    pub fn buckets(&self, buckets: usize, bucket_minutes: i64) -> Vec<(u64, u64, u64)> {
        let n = i64::try_from(buckets).unwrap_or(i64::MAX);
        let width = bucket_minutes.max(1);
        let first = self.now_minute - n * width + 1;
        let mut out = vec![(0, 0, 0); buckets];
        for (m, d, f, t) in &self.minutes {
            if *m < first || *m > self.now_minute {
                continue;
            }
            let i = usize::try_from((m - first) / width).unwrap_or(0);
            if let Some(slot) = out.get_mut(i) {
                slot.0 += d;
                slot.1 += f;
                slot.2 += t;
            }
        }
        out
    }

    /// Total (delivered, failed, throttled) over the activity.
    pub fn totals(&self) -> (u64, u64, u64) {
        self.minutes
            .iter()
            .fold((0, 0, 0), |(d, f, t), (_, d2, f2, t2)| {
                (d + d2, f + f2, t + t2)
            })
    }
}

/// An endpoint's recent health, from the delivery log.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// Share of attempts in the last hour that were delivered, if any were made.
    pub success_rate: Option<f64>,
    pub attempts_last_hour: u64,
    /// `200`, `503`, `timeout`, … of the newest attempt.
    pub last_status: Option<String>,
    pub last_error: Option<String>,
    /// RFC 3339.
    pub last_attempt_at: Option<String>,
    pub consecutive_failures: u64,
    /// RFC 3339: when the current run of failures began.
    pub failing_since: Option<String>,
    /// Deliveries waiting in a retry tier, and since when the longest-waiting one (RFC 3339).
    pub pending_retries: u64,
    pub oldest_pending_retry: Option<String>,
    /// The newest attempt had waited for the endpoint's rate limit: deliveries are queuing
    /// behind it.
    pub throttled: bool,
    /// Attempts of the last hour that had waited for the rate limit.
    pub throttled_last_hour: u64,
}

/// One attempt from the delivery log.
#[derive(Debug, Clone, Default)]
pub struct AttemptRow {
    /// RFC 3339.
    pub at: String,
    pub event_id: String,
    pub endpoint: String,
    pub attempt: u32,
    /// `dispatcher`, `retry.5m`, `replay`, …
    pub stage: String,
    /// `delivered` or `failed`.
    pub outcome: String,
    /// HTTP status or failure class.
    pub status: String,
    pub duration_ms: u64,
    /// Where the delivery went next: `done`, a tier, `dlq`.
    pub next: String,
}

/// One dead letter.
#[derive(Debug, Clone, Default)]
pub struct DeadRow {
    /// `partition-offset` on the DLQ, the id used in URLs and replays.
    pub position: String,
    /// RFC 3339.
    pub dead_at: String,
    pub endpoint: String,
    pub event_id: String,
    pub event_type: String,
    pub tenant: Option<String>,
    pub reason: String,
    pub attempts: u32,
    pub last_error: String,
    /// Set once replayed: the outcome (`delivered`, `failed`).
    pub replayed: Option<String>,
}

/// One dead letter with its history.
#[derive(Debug, Clone, Default)]
pub struct DeadDetail {
    pub row: DeadRow,
    /// Every attempt the delivery record carries, oldest first.
    pub history: Vec<AttemptRow>,
    /// The start of the event body (bounded), for recognising it.
    pub body_preview: String,
}

/// Filters of the dead-letter list (also the "replay all matching" selection).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct DeadFilter {
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default, rename = "type")]
    pub event_type: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub cursor: Option<String>,
}

impl DeadFilter {
    /// Empty strings (an untouched form field) mean "no filter".
    pub fn normalized(mut self) -> DeadFilter {
        for f in [
            &mut self.endpoint,
            &mut self.event_type,
            &mut self.tenant,
            &mut self.cursor,
        ] {
            if f.as_deref().is_some_and(|v| v.trim().is_empty()) {
                *f = None;
            }
        }
        self
    }
}

/// Filters of the endpoint list, and where its page starts (every empty field: no filter).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct EndpointFilter {
    #[serde(default)]
    pub tenant: Option<String>,
    /// `enabled`, `disabled` or `unusable`.
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub url_prefix: Option<String>,
    /// The last endpoint id of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

impl EndpointFilter {
    /// Empty strings (an untouched form field) mean "no filter".
    pub fn normalized(mut self) -> EndpointFilter {
        for f in [
            &mut self.tenant,
            &mut self.state,
            &mut self.url_prefix,
            &mut self.cursor,
        ] {
            if f.as_deref().is_some_and(|v| v.trim().is_empty()) {
                *f = None;
            }
        }
        self
    }
}

/// Endpoints one dashboard page lists.
pub const ENDPOINTS_PER_PAGE: usize = 50;

/// A page of endpoints, by id.
#[derive(Debug, Clone, Default)]
pub struct EndpointPage {
    pub rows: Vec<EndpointRow>,
    pub next_cursor: Option<String>,
}

/// A page of dead letters.
#[derive(Debug, Clone, Default)]
pub struct DeadPage {
    pub rows: Vec<DeadRow>,
    pub next_cursor: Option<String>,
}

/// What a Replay did.
#[derive(Debug, Clone, Default)]
pub struct ReplayOutcome {
    pub selected: u64,
    pub delivered: u64,
    pub failed: u64,
    pub already_replayed: u64,
    pub skipped: u64,
    /// One line per record, as the CLI prints them.
    pub lines: Vec<String>,
}

/// How a test send went (a signed `hookline.test` event, attempted once).
#[derive(Debug, Clone)]
pub struct TestSendOutcome {
    pub endpoint_id: String,
    pub event_id: String,
    pub delivered: bool,
    pub status: Option<u16>,
    /// `None` when delivered.
    pub failure_class: Option<String>,
    pub duration_ms: u64,
    /// The start of the response body or the error (never the URL).
    pub detail: Option<String>,
}

/// The live counters at the top of every page.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Counters {
    /// Attempts that got a 2xx in the last 5 minutes (every stage: first attempts, retries, replays).
    pub delivered_last_5m: u64,
    pub failed_last_5m: u64,
    /// Dead deliveries not replayed successfully.
    pub dead: u64,
}

/// A dashboard error: shown on the page, never a stack trace.
#[derive(Debug, Clone)]
pub enum Problem {
    /// Not there — or not this tenant's (never say which).
    NotFound,
    BadInput(String),
    Unavailable(String),
}

/// What the admin process supplies. Every call is scoped: a tenant scope sees and changes only
/// its tenant's endpoints and dead letters; another tenant's resource is `NotFound`.
pub trait Backend: Send + Sync + 'static {
    /// The scope of a bearer token, or `None` if it is not a valid token.
    fn authenticate(&self, token: &str) -> Option<Scope>;
    /// A page of the endpoints `filter` selects ([`ENDPOINTS_PER_PAGE`] at most).
    fn endpoints(
        &self,
        scope: &Scope,
        filter: &EndpointFilter,
    ) -> impl Future<Output = Result<EndpointPage, Problem>> + Send;
    fn endpoint(
        &self,
        scope: &Scope,
        id: &str,
    ) -> impl Future<Output = Result<(EndpointRow, Vec<AttemptRow>), Problem>> + Send;
    fn dead(
        &self,
        scope: &Scope,
        filter: &DeadFilter,
    ) -> impl Future<Output = Result<DeadPage, Problem>> + Send;
    fn dead_one(
        &self,
        scope: &Scope,
        position: &str,
    ) -> impl Future<Output = Result<DeadDetail, Problem>> + Send;
    /// Replays one dead letter (`Some(position)`) or every one matching `filter`, with the
    /// CLI's idempotency: a dead letter already replayed is not sent again.
    fn replay(
        &self,
        scope: &Scope,
        position: Option<&str>,
        filter: &DeadFilter,
    ) -> impl Future<Output = Result<ReplayOutcome, Problem>> + Send;
    fn counters(&self, scope: &Scope) -> impl Future<Output = Result<Counters, Problem>> + Send;
    /// Sends a signed `hookline.test` event to the endpoint once (never retried).
    fn test_send(
        &self,
        scope: &Scope,
        id: &str,
    ) -> impl Future<Output = Result<TestSendOutcome, Problem>> + Send;
    /// Changes an endpoint's delivery settings (the same rules as the API; a bad field is a
    /// `BadInput` naming it).
    fn update_settings(
        &self,
        scope: &Scope,
        id: &str,
        change: SettingsChange,
    ) -> impl Future<Output = Result<(), Problem>> + Send;
}
