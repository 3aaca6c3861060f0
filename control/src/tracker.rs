//! The health tracker: tails `<p>.attempts` (every partition, from `control.health_lookback`
//! ago) and `<p>.dlq` (every partition, from the beginning; only the endpoint header is read)
//! by assignment, so every process reads everything and gives the same answer
//! ([`crate::health`]).
//!
//! With a registry (the admin process), once caught up, every 10 s (or `control.failing_after`
//! / `control.auto_disable_after` if shorter):
//!
//! - **Failing / recovered marks**: an enabled endpoint whose attempts have all failed for at
//!   least `control.failing_after` (5 min) is marked failing on its registry record, with an
//!   `endpoint.failing` event on `<p>.operational` in the same transaction; a marked endpoint
//!   whose latest attempt succeeded after the mark's start is cleared with `endpoint.recovered`.
//!   File-managed endpoints too (the mark is health, not definition).
//! - **Auto-disable** (`control.auto_disable_after`, off by default): an API-managed, enabled
//!   endpoint whose attempts have all failed for at least that long is disabled through the
//!   registry with an `endpoint_auto_disabled` event, and logged. File-managed endpoints are
//!   not disabled (the file owns `enabled`): a warning is logged instead.
//!
//! Every process may try each; the registry writer decides against what is committed (its
//! fencing lets one writer commit), so each change and its event happen exactly once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::message::{Headers as _, Message as _};
use tokio::sync::watch;

use hookline_common::config::Config;
use hookline_common::contract::delivery::{now_ms, ENDPOINT_ID};
use hookline_common::contract::topics::Topics;

use crate::activity::{Counts, Interner, Recent, Stored};
use crate::attempts::Attempt;
use crate::health::{unknown, EndpointHealth, HealthReport, Window};
use crate::metrics::HealthMetrics;
use crate::operational::{instance_name, OperationalEvent, AUTO_DISABLED, FAILING, RECOVERED};
use crate::record::ManagedBy;
use crate::registry::Registry;
use crate::tail::{covers, Positions, Source, StartAt, Tail};

const CHECK_EVERY: Duration = Duration::from_secs(10);

#[derive(Default)]
struct State {
    endpoints: HashMap<String, EndpointHealth>,
    dead: HashMap<String, u64>,
    /// The latest [`RECENT`] attempts per endpoint (by attempt time), for the dashboard.
    recent: HashMap<String, Recent>,
    /// Attempts per endpoint (delivered, failed, throttled — of either, those that had waited
    /// for the endpoint's rate limit) per minute for the last hour and per hour back to
    /// [`COUNT_MINUTES`]: the dashboard's live counters and charts.
    minutes: HashMap<String, Counts>,
    /// The strings `recent` holds many times.
    strings: Interner,
}

pub use crate::activity::{COUNT_MINUTES, MINUTE_BUCKETS, RECENT};

/// Per-endpoint health of the installation, kept current by a tail.
pub struct Health {
    state: Arc<Mutex<State>>,
    positions: watch::Receiver<Positions>,
    ends: Positions,
    window: Window,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Health {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Health {
    /// Starts tailing; returns at once (see [`Health::wait_caught_up`]). With `registry`, and
    /// `control.auto_disable_after` set, failing endpoints are disabled automatically.
    pub async fn start(
        config: &Config,
        registry: Option<Registry>,
        metrics: &prometheus::Registry,
    ) -> anyhow::Result<Health> {
        let t = Topics::new(&config.topics.prefix);
        let lookback =
            i64::try_from(config.control.health_lookback.as_millis()).unwrap_or(i64::MAX);
        let sources = [
            Source::all(
                t.attempts(),
                StartAt::Time(now_ms().saturating_sub(lookback)),
            ),
            Source::all(t.dlq(), StartAt::Beginning),
        ];
        let (tail, ends) = Tail::open(config, "health", &sources).await?;
        let window = Window {
            period: config.control.health_window,
            attempts: config.control.health_window_attempts,
        };
        let state = Arc::new(Mutex::new(State::default()));
        // Positions of what is applied to `state` (the tail's own run ahead of it).
        let (applied, positions) = watch::channel(Positions::new());
        let mut tasks = vec![tokio::spawn(read_loop(
            tail,
            state.clone(),
            t.dlq(),
            window,
            applied,
        ))];
        let health_metrics = HealthMetrics::register(metrics)?;
        if let Some(registry) = registry {
            tasks.push(tokio::spawn(watch_loop(
                state.clone(),
                positions.clone(),
                ends.clone(),
                registry,
                Watch {
                    failing_after: config.control.failing_after,
                    auto_disable_after: config.control.auto_disable_after,
                    window,
                    instance: instance_name(config),
                },
                health_metrics,
            )));
        }
        Ok(Health {
            state,
            positions,
            ends,
            window,
            tasks,
        })
    }

    /// Whether every record the topics had at start was read.
    pub fn is_caught_up(&self) -> bool {
        covers(&self.positions.borrow(), &self.ends)
    }

    /// Waits until [`Health::is_caught_up`], at most `wait`.
    pub async fn wait_caught_up(&self, wait: Duration) -> anyhow::Result<()> {
        let mut rx = self.positions.clone();
        let ends = self.ends.clone();
        let reached = tokio::time::timeout(wait, rx.wait_for(|p| covers(p, &ends)))
            .await
            .map_err(|_| anyhow::anyhow!("the delivery log was not read within {wait:?}"))?
            .is_ok();
        anyhow::ensure!(reached, "the health tracker's reader stopped");
        Ok(())
    }

    /// The health of one endpoint now.
    pub fn report(&self, endpoint_id: &str) -> HealthReport {
        let s = lock(&self.state);
        let dead = s.dead.get(endpoint_id).copied().unwrap_or(0);
        match s.endpoints.get(endpoint_id) {
            Some(h) => h.report(endpoint_id, now_ms(), &self.window, dead),
            None => unknown(endpoint_id, dead),
        }
    }

    /// The latest attempts (at most [`RECENT`]) of an endpoint, newest first.
    pub fn recent(&self, endpoint_id: &str) -> Vec<Attempt> {
        lock(&self.state)
            .recent
            .get(endpoint_id)
            .map(|r| r.newest_first(endpoint_id))
            .unwrap_or_default()
    }

    /// (delivered, failed) attempts of an endpoint that started in the last `minutes` minutes
    /// (whole minutes, the current one included; at most [`COUNT_MINUTES`]).
    pub fn counts(&self, endpoint_id: &str, minutes: i64) -> (u64, u64) {
        self.per_minute(endpoint_id, minutes)
            .iter()
            .fold((0, 0), |(d, f), (_, d2, f2, _)| (d + d2, f + f2))
    }

    /// (minute, delivered, failed, throttled) of an endpoint for every minute with attempts
    /// among the last `minutes` (whole minutes, the current one included; at most
    /// [`COUNT_MINUTES`]), oldest first; the minute is unix ms / 60,000. Past the last
    /// [`MINUTE_BUCKETS`] minutes the counts are per hour, each at the hour's first minute.
    /// Throttled attempts are also delivered or failed: those that had waited for the
    /// endpoint's rate limit.
    pub fn per_minute(&self, endpoint_id: &str, minutes: i64) -> Vec<(i64, u64, u64, u64)> {
        let now = now_ms().div_euclid(60_000);
        lock(&self.state)
            .minutes
            .get_mut(endpoint_id)
            .map(|c| c.buckets(minutes, now))
            .unwrap_or_default()
    }

    /// Every endpoint seen in the delivery log or the DLQ, by id.
    pub fn reports(&self) -> BTreeMap<String, HealthReport> {
        let ids: HashSet<String> = {
            let s = lock(&self.state);
            s.endpoints.keys().chain(s.dead.keys()).cloned().collect()
        };
        ids.into_iter()
            .map(|id| (id.clone(), self.report(&id)))
            .collect()
    }
}

async fn read_loop(
    tail: Tail,
    state: Arc<Mutex<State>>,
    dlq: String,
    window: Window,
    applied: watch::Sender<Positions>,
) {
    let read = tail.positions();
    loop {
        let next = tail.next().await;
        if let Some(m) = &next {
            apply(m, &state, &dlq, &window);
        }
        let now = read.borrow().clone();
        applied.send_if_modified(|p| {
            let changed = *p != now;
            *p = now;
            changed
        });
    }
}

fn apply(m: &rdkafka::message::OwnedMessage, state: &Mutex<State>, dlq: &str, window: &Window) {
    {
        if m.topic() == dlq {
            let endpoint = m.headers().and_then(|hs| {
                hs.iter()
                    .find(|h| h.key == ENDPOINT_ID)
                    .and_then(|h| h.value)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .map(str::to_string)
            });
            if let Some(id) = endpoint {
                *lock(state).dead.entry(id).or_default() += 1;
            }
            return;
        }
        match serde_json::from_slice::<Attempt>(m.payload().unwrap_or_default()) {
            Ok(a) => {
                let mut s = lock(state);
                s.endpoints
                    .entry(a.endpoint_id.clone())
                    .or_default()
                    .observe(&a, window);
                let now = now_ms().div_euclid(60_000);
                let s = &mut *s;
                s.minutes.entry(a.endpoint_id.clone()).or_default().add(
                    a.at_ms.div_euclid(60_000),
                    a.outcome,
                    a.waited_ms > 0,
                    now,
                );
                let stored = Stored::of(&a, &mut s.strings);
                s.recent
                    .entry(a.endpoint_id.clone())
                    .or_default()
                    .insert(stored);
            }
            Err(e) => {
                tracing::debug!(offset = m.offset(), error = %e, "unreadable delivery log record")
            }
        }
    }
}

/// What [`watch_loop`] decides by.
struct Watch {
    failing_after: Duration,
    auto_disable_after: Option<Duration>,
    window: Window,
    instance: String,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The check interval: [`CHECK_EVERY`], or the shortest configured period if shorter (≥ 1 s).
fn check_every(w: &Watch) -> Duration {
    let shortest = w
        .auto_disable_after
        .map_or(w.failing_after, |a| a.min(w.failing_after));
    CHECK_EVERY.min(shortest).max(Duration::from_secs(1))
}

fn last_error(r: &HealthReport) -> Option<String> {
    r.last_error.as_ref().map(|l| match l.status {
        Some(s) => format!("{} {s}", l.class),
        None => l.class.clone(),
    })
}

async fn watch_loop(
    state: Arc<Mutex<State>>,
    mut positions: watch::Receiver<Positions>,
    ends: Positions,
    registry: Registry,
    w: Watch,
    metrics: HealthMetrics,
) {
    // A partial read could show a streak whose ending success is not read yet.
    if positions.wait_for(|p| covers(p, &ends)).await.is_err() {
        return;
    }
    let mut warned = HashSet::new();
    let mut tick = tokio::time::interval(check_every(&w));
    loop {
        tick.tick().await;
        let now = now_ms();
        let reports: Vec<HealthReport> = {
            let s = lock(&state);
            s.endpoints
                .iter()
                .map(|(id, h)| h.report(id, now, &w.window, 0))
                .collect()
        };
        for r in &reports {
            mark(&registry, r, &w, now, &metrics).await;
        }
        if let Some(after) = w.auto_disable_after {
            for r in &reports {
                auto_disable(&registry, r, &w, after, now, &metrics, &mut warned).await;
            }
        }
    }
}

/// Marks `r`'s endpoint failing, or clears the mark when it recovered.
async fn mark(registry: &Registry, r: &HealthReport, w: &Watch, now: i64, metrics: &HealthMetrics) {
    let Some(e) = registry.get(&r.endpoint_id) else {
        return;
    };
    let (kind, since, reason) = match (e.failing_since_ms, r.failing_since_ms) {
        (None, Some(since))
            if e.enabled && r.status == "failing" && now - since >= millis(w.failing_after) =>
        {
            let reason = format!(
                "every attempt failed since {} ({} attempts), beyond control.failing_after ({})",
                crate::table::time(Some(since)),
                r.consecutive_failures,
                humantime::format_duration(w.failing_after)
            );
            (FAILING, Some(since), reason)
        }
        (Some(marked), _)
            if r.status != "failing" && r.last_success_at_ms.is_some_and(|at| at >= marked) =>
        {
            let reason = format!(
                "delivered again at {}, failing since {}",
                crate::table::time(r.last_success_at_ms),
                crate::table::time(Some(marked))
            );
            (RECOVERED, None, reason)
        }
        _ => return,
    };
    let event = OperationalEvent {
        kind: kind.into(),
        endpoint_id: e.id.clone(),
        url: Some(e.url.clone()),
        tenant: e.tenant.clone(),
        reason,
        at_ms: now,
        failing_since_ms: since.or(e.failing_since_ms),
        consecutive_failures: r.consecutive_failures,
        last_error: last_error(r),
        instance: w.instance.clone(),
        version: None,
    };
    match registry.mark_failing(&e.id, since, event).await {
        Ok(true) => {
            metrics.marked(kind);
            tracing::warn!(endpoint = %e.id, kind, "endpoint health changed");
        }
        Ok(false) => {}
        Err(err) => {
            tracing::warn!(endpoint = %e.id, kind, error = %err, "marking the endpoint failed; will retry")
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn auto_disable(
    registry: &Registry,
    r: &HealthReport,
    w: &Watch,
    after: Duration,
    now: i64,
    metrics: &HealthMetrics,
    warned: &mut HashSet<String>,
) {
    if r.status != "failing"
        || r.failing_since_ms
            .is_none_or(|since| now - since < millis(after))
    {
        return;
    }
    let Some(e) = registry.get(&r.endpoint_id) else {
        return;
    };
    if !e.enabled {
        return;
    }
    if e.managed_by == ManagedBy::File {
        if warned.insert(e.id.clone()) {
            tracing::warn!(endpoint = %e.id, failing_since_ms = r.failing_since_ms, "endpoint failing beyond control.auto_disable_after but file-managed: not disabled (set enabled = false in the file)");
        }
        return;
    }
    let since = r.failing_since_ms.unwrap_or(now);
    let event = OperationalEvent {
        kind: AUTO_DISABLED.into(),
        endpoint_id: e.id.clone(),
        url: Some(e.url.clone()),
        tenant: e.tenant.clone(),
        reason: format!(
            "auto: every attempt failed since {} ({} attempts), beyond control.auto_disable_after ({})",
            crate::table::time(Some(since)),
            r.consecutive_failures,
            humantime::format_duration(after)
        ),
        at_ms: now,
        failing_since_ms: Some(since),
        consecutive_failures: r.consecutive_failures,
        last_error: last_error(r),
        instance: w.instance.clone(),
        version: Some(e.version + 1),
    };
    match registry.auto_disable(&e.id, e.version, event.clone()).await {
        Ok(true) => {
            metrics.auto_disabled.inc();
            tracing::warn!(endpoint = %e.id, reason = %event.reason, "endpoint auto-disabled");
        }
        Ok(false) => {}
        Err(err) => {
            tracing::warn!(endpoint = %e.id, error = %err, "auto-disable failed; will retry")
        }
    }
}
