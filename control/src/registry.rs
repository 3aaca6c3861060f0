//! The live endpoint registry: every process tails the compacted `<p>.endpoints` from the
//! beginning (assigned, no consumer group) and applies each record — a put replaces the
//! endpoint, a tombstone deletes it — to its [`EndpointSet`], published on a `watch` channel.
//! Readers are `read_committed`: writes are transactional ([`crate::writer`]), so a write that
//! lost a race never becomes visible anywhere.
//!
//! "Caught up" means the set reflects every record the topic had when the registry opened;
//! [`Registry::start`] returns once it is (and, with `seed`, once the config file's endpoints
//! are on the topic: [`crate::seed`]). Writes return once the new state is visible in this
//! process (read-your-writes); other processes see it as soon as their tail reads it
//! (measured: docs/control-plane.md).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::message::Message as _;
use tokio::sync::watch;

use hookline_common::config::Config;
use hookline_common::contract::topics::Topics;
use hookline_common::runtime::ops::StageProbe;

use crate::crypto::Keyring;
use crate::endpoint::{Endpoint, EndpointSet};
use crate::metrics::RegistryMetrics;
use crate::record::EndpointRecord;
use crate::tail::{covers, Positions, Source, StartAt, Tail};
use crate::writer::Writer;

/// Longest [`Registry::start`] waits to read the topic to its end.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(120);
/// Records applied before the set is published even while more are coming (catching up).
const PUBLISH_EVERY: usize = 256;
/// How often at most `hookline_control_endpoints` is counted again while the set changes.
const COUNT_EVERY: Duration = Duration::from_secs(1);

/// What the tail has applied, published atomically: the set and the positions it reflects.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub set: Arc<EndpointSet>,
    pub positions: Positions,
}

/// A handle on this process's registry (cheap to clone).
#[derive(Clone)]
pub struct Registry {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) keyring: Arc<Keyring>,
    pub(crate) topic: String,
    pub(crate) snapshot: watch::Receiver<Snapshot>,
    /// The topic's ends when the registry opened.
    ends: Positions,
    pub(crate) writer: tokio::sync::Mutex<Writer>,
    pub(crate) metrics: RegistryMetrics,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Registry {
    /// Opens the registry and returns at once; the set fills as the tail reads (see
    /// [`Registry::wait_caught_up`]). `probe` (if any) turns ready once caught up.
    pub async fn open(
        config: &Config,
        keyring: Keyring,
        registry: &prometheus::Registry,
        probe: Option<StageProbe>,
    ) -> anyhow::Result<Registry> {
        let topic = Topics::new(&config.topics.prefix).endpoints();
        let metrics = RegistryMetrics::register(registry)?;
        let (tail, ends) = Tail::open(
            config,
            "endpoints",
            &[Source::all(&topic, StartAt::Beginning)],
        )
        .await?;
        let keyring = Arc::new(keyring.with_file_endpoints(&config.endpoints));
        let (tx, rx) = watch::channel(Snapshot::default());
        let task = tokio::spawn(apply_loop(
            tail,
            tx,
            keyring.clone(),
            metrics.clone(),
            ends.clone(),
            probe,
        ));
        Ok(Registry {
            inner: Arc::new(Inner {
                config: config.clone(),
                keyring,
                topic,
                snapshot: rx,
                ends,
                writer: tokio::sync::Mutex::new(Writer::new(config)),
                metrics,
                task,
            }),
        })
    }

    /// [`Registry::open`], then waits until caught up, then (with `seed`) writes the config
    /// file's endpoints to the topic where they differ ([`crate::seed`]).
    pub async fn start(
        config: &Config,
        keyring: Keyring,
        registry: &prometheus::Registry,
        seed: bool,
    ) -> anyhow::Result<Registry> {
        let r = Registry::open(config, keyring, registry, None).await?;
        r.wait_caught_up(CATCH_UP_WAIT).await?;
        if seed {
            crate::seed::seed(&r, &config.endpoints)
                .await
                .context("seeding the config file's endpoints into the registry")?;
        }
        Ok(r)
    }

    /// The endpoints now.
    pub fn current(&self) -> Arc<EndpointSet> {
        self.inner.snapshot.borrow().set.clone()
    }

    /// One endpoint now.
    pub fn get(&self, id: &str) -> Option<Endpoint> {
        self.current().get(id).cloned()
    }

    /// Receives every new set (a stage holds one and re-reads it per delivery).
    pub fn subscribe(&self) -> watch::Receiver<Arc<EndpointSet>> {
        let mut snapshots = self.inner.snapshot.clone();
        let (tx, rx) = watch::channel(snapshots.borrow_and_update().set.clone());
        tokio::spawn(async move {
            while snapshots.changed().await.is_ok() {
                let set = snapshots.borrow_and_update().set.clone();
                if tx.send(set).is_err() {
                    break;
                }
            }
        });
        rx
    }

    /// Whether the set reflects every record the topic had when the registry opened.
    pub fn is_caught_up(&self) -> bool {
        covers(&self.inner.snapshot.borrow().positions, &self.inner.ends)
    }

    /// Waits until [`Registry::is_caught_up`], at most `wait`.
    pub async fn wait_caught_up(&self, wait: Duration) -> anyhow::Result<()> {
        let ends = self.inner.ends.clone();
        self.wait_for_positions(&ends, wait)
            .await
            .with_context(|| format!("reading {} to its end", self.inner.topic))
    }

    pub(crate) async fn wait_for_positions(
        &self,
        ends: &Positions,
        wait: Duration,
    ) -> anyhow::Result<()> {
        let mut rx = self.inner.snapshot.clone();
        let reached = tokio::time::timeout(wait, rx.wait_for(|s| covers(&s.positions, ends)))
            .await
            .map_err(|_| anyhow::anyhow!("not read within {wait:?}"))?;
        reached
            .map(|_| ())
            .map_err(|_| anyhow::anyhow!("the registry's reader stopped"))
    }

    /// The keys of this process.
    pub fn keyring(&self) -> &Keyring {
        &self.inner.keyring
    }
}

/// Reads the topic for as long as the registry lives, applying records and publishing.
async fn apply_loop(
    tail: Tail,
    tx: watch::Sender<Snapshot>,
    keyring: Arc<Keyring>,
    metrics: RegistryMetrics,
    ends: Positions,
    probe: Option<StageProbe>,
) {
    let positions = tail.positions();
    let mut set = EndpointSet::default();
    let mut pending = 0usize;
    // While catching up, older versions of an endpoint pass by before its current one: a secret
    // only an old version holds (sealed with a retired key) is no problem. Problems are logged
    // once caught up, for the current versions only, then per record.
    let mut caught_up = covers(&positions.borrow(), &ends);
    let mut counts_stale = false;
    let mut counted_at = std::time::Instant::now() - COUNT_EVERY;
    loop {
        let msg = tail.next().await;
        if let Some(m) = &msg {
            apply(&mut set, m, &keyring, &metrics, caught_up);
            pending += 1;
        }
        let now = positions.borrow().clone();
        if !caught_up && covers(&now, &ends) {
            caught_up = true;
            for e in set.iter() {
                if let Some(problem) = &e.problem {
                    log_unopenable(&e.id, problem);
                }
            }
        }
        let moved = now != tx.borrow().positions;
        if (msg.is_none() && (pending > 0 || moved)) || pending >= PUBLISH_EVERY {
            pending = 0;
            counts_stale = true;
            tx.send_replace(Snapshot {
                set: Arc::new(set.clone()),
                positions: now,
            });
        }
        // Counting by state walks every endpoint: at most once a second, not per change.
        if counts_stale && counted_at.elapsed() >= COUNT_EVERY {
            metrics.set_endpoints(&set);
            counted_at = std::time::Instant::now();
            counts_stale = false;
        }
        if let Some(p) = &probe {
            p.beat();
            if !p.is_ready() && covers(&tx.borrow().positions, &ends) {
                p.set_ready(true);
            }
        }
    }
}

fn log_unopenable(id: &str, problem: &str) {
    tracing::error!(endpoint = %id, problem = %problem, "endpoint secret cannot be opened; the endpoint is treated as disabled");
}

/// Applies one record of `<p>.endpoints` to `set`; `report`: log a secret it cannot open.
fn apply(
    set: &mut EndpointSet,
    m: &rdkafka::message::OwnedMessage,
    keyring: &Keyring,
    metrics: &RegistryMetrics,
    report: bool,
) {
    let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
        tracing::warn!(
            partition = m.partition(),
            offset = m.offset(),
            "endpoint record without a UTF-8 key; skipped"
        );
        metrics.record("unreadable");
        return;
    };
    let Some(value) = m.payload() else {
        set.remove(key);
        metrics.record("tombstone");
        return;
    };
    match EndpointRecord::parse(key, value) {
        Ok(r) => {
            let e = Endpoint::from_record(r, keyring);
            if let (true, Some(problem)) = (report, &e.problem) {
                log_unopenable(&e.id, problem);
            }
            set.insert(e);
            metrics.record("applied");
        }
        Err(why) => {
            tracing::warn!(endpoint = key, offset = m.offset(), reason = %why, "unreadable endpoint record; skipped (the previous state of the endpoint stays)");
            metrics.record("unreadable");
        }
    }
}
