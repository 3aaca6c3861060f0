//! What a process's delivery path takes from the control plane, started once per process
//! (`run all` shares one between its stages): the live endpoint registry — fed into the
//! delivery crate's [`LiveEndpoints`] — and the delivery log, told every attempt through the
//! delivery crate's [`AttemptObserver`] hook.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hookline_common::config::{Config, EndpointConfig};
use hookline_common::contract::delivery::now_ms;
use hookline_delivery::{AttemptEvent, AttemptObserver, EndpointsUpdater, LiveEndpoints};

use crate::attempts::{bounded_error, Attempt, AttemptLog, Outcome};
use crate::crypto::Keyring;
use crate::endpoint::EndpointSet;
use crate::record::ManagedBy;
use crate::registry::Registry;

/// Longest a fed endpoint set goes without a rebuild when the registry does not change (it is
/// also rebuilt the moment a rotated-out secret's grace period ends).
const REFRESH: Duration = Duration::from_secs(60);

/// The registry and the delivery log of one process. Cheap to clone.
#[derive(Clone)]
pub struct Plane {
    pub registry: Registry,
    pub log: Arc<AttemptLog>,
    /// This process's `[[endpoints]]`: what file-managed endpoints are here (see
    /// [`Plane::live_endpoints`]).
    file: Arc<Vec<EndpointConfig>>,
    /// `control.delivery_log`: whether [`Plane::observer`] writes attempts.
    delivery_log: bool,
}

impl Plane {
    /// Reads the registry to its end (seeding the config file's endpoints) and starts the
    /// delivery log's writer.
    pub async fn start(
        config: &Config,
        keyring: Keyring,
        metrics: &prometheus::Registry,
    ) -> anyhow::Result<Plane> {
        Plane::open(config, keyring, metrics, true).await
    }

    /// A plane for a command-line tool (`hookline replay`): reads the registry, never seeds it;
    /// the secrets key from the environment.
    pub async fn for_tool(config: &Config) -> anyhow::Result<Plane> {
        let keyring = Keyring::from_env().context("reading HOOKLINE_SECRETS_KEY")?;
        Plane::open(config, keyring, &prometheus::Registry::new(), false).await
    }

    async fn open(
        config: &Config,
        keyring: Keyring,
        metrics: &prometheus::Registry,
        seed: bool,
    ) -> anyhow::Result<Plane> {
        let registry = Registry::start(config, keyring, metrics, seed)
            .await
            .context("reading the endpoint registry (<p>.endpoints)")?;
        let log = AttemptLog::start(config, metrics)
            .await
            .context("starting the delivery log (<p>.attempts)")?;
        Ok(Plane {
            registry,
            log: Arc::new(log),
            file: Arc::new(config.endpoints.clone()),
            delivery_log: config.control.delivery_log,
        })
    }

    /// [`Plane::start`] with the secrets key from the environment (`HOOKLINE_SECRETS_KEY`).
    pub async fn from_env(
        config: &Config,
        metrics: &prometheus::Registry,
    ) -> anyhow::Result<Plane> {
        let keyring = Keyring::from_env().context("reading HOOKLINE_SECRETS_KEY")?;
        Plane::start(config, keyring, metrics).await
    }

    /// Runs `stage` on a control plane of its own (secrets key from the environment), then
    /// closes the plane, flushing the delivery log, whatever the stage returned: the `run` of
    /// every stage whose `run_with` can also share a process's plane (`run all`).
    pub async fn run_own<F, Fut>(
        config: &Config,
        metrics: &prometheus::Registry,
        stage: F,
    ) -> anyhow::Result<()>
    where
        F: FnOnce(Plane) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        let plane = Plane::from_env(config, metrics).await?;
        let result = stage(plane.clone()).await;
        plane.close().await;
        result
    }

    /// An endpoint set that follows the registry: replaced on every change, the moment a
    /// rotated-out secret's grace ends, and at least every minute, until no handle of it is left.
    /// File-managed endpoints are this process's own `[[endpoints]]` whatever the topic holds
    /// (the topic's copy, written by seeding, is for the API, the CLI and the dashboard): a
    /// process always delivers by its own file, as before the registry existed, and a tool run
    /// with a file never has to write it to the topic.
    pub fn live_endpoints(&self) -> LiveEndpoints {
        let configs = deliverable(&self.registry.current(), &self.file, now_ms());
        let (updater, live) = LiveEndpoints::updatable(&configs);
        tokio::spawn(feed(self.registry.clone(), self.file.clone(), updater));
        live
    }

    /// The hook that writes every attempt to the delivery log (observes nothing when
    /// `control.delivery_log` is off).
    pub fn observer(&self) -> Arc<dyn AttemptObserver> {
        if self.delivery_log {
            Arc::new(LogObserver(self.log.clone()))
        } else {
            Arc::new(hookline_delivery::NoObserver)
        }
    }

    /// Flushes the delivery log if this is the last handle on it (bounded).
    pub async fn close(self) {
        if let Ok(log) = Arc::try_unwrap(self.log) {
            log.close().await;
        }
    }
}

/// The endpoints a process delivers to at `now`: the registry's API-managed ones, and the
/// process's own file endpoints (file-managed ids on the topic that the file lacks are gone).
fn deliverable(set: &EndpointSet, file: &[EndpointConfig], now: i64) -> Vec<EndpointConfig> {
    set.iter()
        .filter(|e| e.managed_by != ManagedBy::File && !file.iter().any(|f| f.id == e.id))
        .filter_map(|e| e.config_at(now))
        .chain(file.iter().cloned())
        .collect()
}

/// The earliest moment after `now` a secret of one of `endpoints` stops signing.
fn next_expiry<'a>(
    endpoints: impl Iterator<Item = &'a crate::endpoint::Endpoint>,
    now: i64,
) -> Option<i64> {
    endpoints
        .flat_map(|e| e.secrets.iter().filter_map(|s| s.expires_at_ms))
        .filter(|at| *at > now)
        .min()
}

/// Keeps the delivery set following the registry: per changed endpoint on every change
/// (O(changes), whatever the registry's size), in full when a secret stops signing and every
/// [`REFRESH`].
async fn feed(registry: Registry, file: Arc<Vec<EndpointConfig>>, updater: EndpointsUpdater) {
    let mut changes = registry.subscribe();
    let file_ids: std::collections::HashSet<String> = file.iter().map(|f| f.id.clone()).collect();
    let mut seen = changes.borrow_and_update().clone();
    let mut expiry = next_expiry(seen.iter(), now_ms());
    loop {
        let wake = {
            let now = now_ms();
            let refresh = Duration::from_millis(
                expiry.map_or(u64::MAX, |at| at.saturating_sub(now).max(0) as u64 + 1),
            );
            refresh.min(REFRESH)
        };
        let changed = tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return; // the registry is gone
                }
                true
            }
            _ = tokio::time::sleep(wake) => false,
        };
        if updater.is_closed() {
            return;
        }
        let set = changes.borrow_and_update().clone();
        let now = now_ms();
        if changed {
            let mut upserts = Vec::new();
            let mut removed = Vec::new();
            for id in set.changed_since(&seen) {
                if file_ids.contains(&id) {
                    continue; // the process's own file decides
                }
                match set
                    .get(&id)
                    .filter(|e| e.managed_by != ManagedBy::File)
                    .and_then(|e| e.config_at(now).map(|c| (c, e)))
                {
                    Some((c, e)) => {
                        expiry = expiry
                            .into_iter()
                            .chain(next_expiry(std::iter::once(e), now))
                            .min();
                        upserts.push(c);
                    }
                    None => removed.push(id),
                }
            }
            updater.apply(upserts, removed);
        } else {
            updater.replace(&deliverable(&set, &file, now));
            expiry = next_expiry(set.iter(), now);
        }
        seen = set;
    }
}

struct LogObserver(Arc<AttemptLog>);

impl AttemptObserver for LogObserver {
    fn attempted(&self, e: &AttemptEvent<'_>) {
        let (outcome, class, error) = match e.failure() {
            None => (Outcome::Delivered, "ok".to_string(), None),
            Some(class) => {
                let snippet = match &e.outcome.result {
                    hookline_delivery::AttemptResult::Failed { snippet, .. } => snippet.as_str(),
                    hookline_delivery::AttemptResult::Delivered { .. } => "",
                };
                let error = (!snippet.is_empty()).then(|| bounded_error(snippet));
                (Outcome::Failed, class.as_str().to_string(), error)
            }
        };
        self.0.record(Attempt {
            event_id: e.event_id.to_string(),
            endpoint_id: e.endpoint_id.to_string(),
            tenant: e.tenant.map(str::to_string),
            event_type: Some(e.event_type.to_string()),
            attempt: e.attempt(),
            stage: e.stage.to_string(),
            outcome,
            status: e.status(),
            class,
            error,
            duration_ms: e.outcome.duration.as_millis() as u64,
            at_ms: e.outcome.started_at_ms,
            next: e.next.map(str::to_string),
            instance: self.0.instance().to_string(),
            waited_ms: e.waited_ms,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(id: &str, url: &str) -> EndpointConfig {
        EndpointConfig {
            id: id.into(),
            url: hookline_common::config::EndpointUrl::parse(url).expect("url"),
            secrets: vec![],
            tenant: None,
            event_types: vec![],
            enabled: true,
            timeout: None,
            max_concurrency: None,
            headers: vec![],
            filter: None,
            rate_limit: None,
            burst: None,
            trace_context: true,
        }
    }

    #[test]
    fn a_process_delivers_file_endpoints_by_its_own_file() {
        let set = EndpointSet::default();
        let mine = [file("a", "https://a.example/v2")];
        let got = deliverable(&set, &mine, 0);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].url.as_str(), "https://a.example/v2");
    }
}
