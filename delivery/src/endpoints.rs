//! The endpoint set and fan-out: which endpoints receive an event, and whether the endpoint of
//! a delivery may still receive it.
//!
//! An endpoint receives an event when it is enabled, its tenant matches (an endpoint without a
//! tenant receives every tenant; an event without a tenant goes only to endpoints without one),
//! and one of its `event_types` globs matches the event type (no globs = every type).
//!
//! The set is read through [`LiveEndpoints`], a handle whose content can be replaced while the
//! stages run ([`EndpointsUpdater::replace`]): every fan-out and every attempt reads the set
//! current at that moment: the config file's endpoints, and the control plane's (tailed from
//! `<p>.endpoints`), updated per changed endpoint ([`EndpointsUpdater::apply`]).

use std::sync::Arc;

use hookline_common::config::glob::glob_match;
use hookline_common::config::EndpointConfig;
use hookline_common::contract::delivery::{DeadReason, DeliveryMeta};
use tokio::sync::watch;

/// The configured endpoints, indexed for fan-out (by tenant) and lookup by id. Persistent
/// maps: a copy is O(1) and a change O(log n), so a registry of 100,000 endpoints is updated
/// per changed endpoint ([`Endpoints::with_changes`]), never rebuilt, and an event's fan-out
/// looks at the endpoints without a tenant and its tenant's only.
#[derive(Debug, Clone, Default)]
pub struct Endpoints {
    /// id → (configuration order, endpoint).
    by_id: imbl::HashMap<String, (u64, Arc<EndpointConfig>)>,
    /// Endpoints without a tenant (every tenant's events), by configuration order.
    untenanted: imbl::OrdMap<u64, Arc<EndpointConfig>>,
    /// A tenant's own endpoints, by configuration order.
    by_tenant: imbl::HashMap<String, imbl::OrdMap<u64, Arc<EndpointConfig>>>,
    /// The order the next new id gets.
    next: u64,
}

impl Endpoints {
    pub fn new(configs: &[EndpointConfig]) -> Self {
        Endpoints::default().with_changes(configs.iter().cloned(), std::iter::empty())
    }

    /// This set with `upserts` put (a known id keeps its place in the order) and `removed`
    /// gone.
    pub fn with_changes(
        &self,
        upserts: impl IntoIterator<Item = EndpointConfig>,
        removed: impl IntoIterator<Item = String>,
    ) -> Self {
        let mut next = self.clone();
        for id in removed {
            next.remove(&id);
        }
        for e in upserts {
            let order = match next.remove(&e.id) {
                Some(order) => order,
                None => {
                    next.next += 1;
                    next.next
                }
            };
            let e = Arc::new(e);
            match &e.tenant {
                None => {
                    next.untenanted.insert(order, e.clone());
                }
                Some(t) => {
                    next.by_tenant
                        .entry(t.clone())
                        .or_default()
                        .insert(order, e.clone());
                }
            }
            next.by_id.insert(e.id.clone(), (order, e));
        }
        next
    }

    /// Removes `id`; its place in the order, if it was there.
    fn remove(&mut self, id: &str) -> Option<u64> {
        let (order, e) = self.by_id.remove(id)?;
        match &e.tenant {
            None => {
                self.untenanted.remove(&order);
            }
            Some(t) => {
                let now_empty = self.by_tenant.get_mut(t).is_some_and(|m| {
                    m.remove(&order);
                    m.is_empty()
                });
                if now_empty {
                    self.by_tenant.remove(t);
                }
            }
        }
        Some(order)
    }

    /// Enabled endpoints subscribed to this event, in configuration order.
    pub fn matching(&self, tenant: Option<&str>, event_type: &str) -> Vec<Arc<EndpointConfig>> {
        let own = tenant.and_then(|t| self.by_tenant.get(t));
        let mut a = self.untenanted.iter().peekable();
        let mut b = own.into_iter().flat_map(|m| m.iter()).peekable();
        let mut out = Vec::new();
        loop {
            let take_a = match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((x, _)), Some((y, _))) => x < y,
            };
            let next = if take_a { a.next() } else { b.next() };
            if let Some((_, e)) = next {
                if e.enabled && subscribes(e, tenant, event_type) {
                    out.push(e.clone());
                }
            }
        }
        out
    }

    /// The endpoint with this id (enabled or not), as configured now.
    pub fn get(&self, id: &str) -> Option<Arc<EndpointConfig>> {
        self.by_id.get(id).map(|(_, e)| e.clone())
    }

    /// The endpoint of `meta`'s delivery, if it may still receive the event: configured,
    /// enabled and subscribed to the event's tenant and type; else why not. The one answer for
    /// every attempt after fan-out (tiers, replay) and for the dispatcher's own attempt.
    pub fn usable_for(&self, meta: &DeliveryMeta) -> Result<Arc<EndpointConfig>, DeadReason> {
        let endpoint = self
            .get(&meta.endpoint_id)
            .ok_or(DeadReason::EndpointRemoved)?;
        if !endpoint.enabled {
            return Err(DeadReason::EndpointDisabled);
        }
        if !subscribes(&endpoint, meta.tenant.as_deref(), &meta.event_type) {
            return Err(DeadReason::EndpointUnsubscribed);
        }
        Ok(endpoint)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// A read handle on the current endpoint set; cheap to clone, shared by every task of a stage.
#[derive(Debug, Clone)]
pub struct LiveEndpoints {
    current: watch::Receiver<Arc<Endpoints>>,
}

/// Replaces the endpoint set every [`LiveEndpoints`] handle of it reads.
#[derive(Debug)]
pub struct EndpointsUpdater {
    tx: watch::Sender<Arc<Endpoints>>,
}

impl LiveEndpoints {
    /// A set that is never replaced (the endpoints of the config file).
    pub fn fixed(configs: &[EndpointConfig]) -> Self {
        LiveEndpoints::updatable(configs).1
    }

    /// A set and the updater that replaces it.
    pub fn updatable(configs: &[EndpointConfig]) -> (EndpointsUpdater, LiveEndpoints) {
        let (tx, current) = watch::channel(Arc::new(Endpoints::new(configs)));
        (EndpointsUpdater { tx }, LiveEndpoints { current })
    }

    /// The set as it is now (a snapshot: a replacement later does not change it).
    pub fn current(&self) -> Arc<Endpoints> {
        self.current.borrow().clone()
    }
}

impl EndpointsUpdater {
    /// Replaces the set: fan-outs and attempts from now on read `configs`.
    pub fn replace(&self, configs: &[EndpointConfig]) {
        self.tx.send_replace(Arc::new(Endpoints::new(configs)));
    }

    /// Puts `upserts` and removes `removed`, leaving every other endpoint as it is (O(changes),
    /// whatever the size of the set).
    pub fn apply(
        &self,
        upserts: impl IntoIterator<Item = EndpointConfig>,
        removed: impl IntoIterator<Item = String>,
    ) {
        let next = self.tx.borrow().with_changes(upserts, removed);
        self.tx.send_replace(Arc::new(next));
    }

    /// Whether every [`LiveEndpoints`] handle of the set is gone (nothing reads it any more).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Whether the endpoint, as configured now, subscribes to events of this tenant and type (its
/// `enabled` flag aside). The one answer to this question: fan-out, every retry attempt and
/// every replay ask it here, so a tenant or type filter changed between attempts is honoured.
///
/// hookline's own events (`hookline.*`, the operational webhooks) go only to an endpoint that
/// asks for them by a glob of its own starting with `hookline.`: a catch-all endpoint (no globs,
/// `*`, `order.*`) never receives them.
pub fn subscribes(e: &EndpointConfig, tenant: Option<&str>, event_type: &str) -> bool {
    let tenant_ok = match (&e.tenant, tenant) {
        (None, _) => true,
        (Some(want), Some(got)) => want == got,
        (Some(_), None) => false,
    };
    if !tenant_ok {
        return false;
    }
    if event_type.starts_with(OPERATIONAL_PREFIX) {
        return e
            .event_types
            .iter()
            .any(|g| g.starts_with(OPERATIONAL_PREFIX) && glob_match(g, event_type));
    }
    e.event_types.is_empty() || e.event_types.iter().any(|g| glob_match(g, event_type))
}

/// The type prefix of hookline's own events (`hookline.endpoint.disabled`, …): reserved, an
/// input event of such a type is quarantined (`reserved_type`).
pub const OPERATIONAL_PREFIX: &str = hookline_common::contract::envelope::RESERVED_TYPE_PREFIX;

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(id: &str, tenant: Option<&str>, types: &[&str], enabled: bool) -> EndpointConfig {
        EndpointConfig {
            id: id.into(),
            url: hookline_common::config::EndpointUrl::parse("https://example.com/hook")
                .expect("url"),
            secrets: vec![],
            tenant: tenant.map(str::to_string),
            event_types: types.iter().map(|s| s.to_string()).collect(),
            enabled,
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
    fn tenant_and_type_rules() {
        let e = Endpoints::new(&[
            ep("all", None, &[], true),
            ep("acme-msg", Some("acme"), &["message.*"], true),
            ep("globex", Some("globex"), &[], true),
            ep("off", None, &[], false),
        ]);
        let ids = |t: Option<&str>, ty: &str| -> Vec<String> {
            e.matching(t, ty).iter().map(|x| x.id.clone()).collect()
        };
        assert_eq!(ids(Some("acme"), "message.created"), ["all", "acme-msg"]);
        assert_eq!(ids(Some("acme"), "call.started"), ["all"]);
        assert_eq!(ids(None, "message.created"), ["all"]);
        assert_eq!(ids(Some("globex"), "x"), ["all", "globex"]);
        assert!(e.get("off").is_some());
    }

    #[test]
    fn hooklines_own_events_only_to_who_asks_for_them() {
        let e = Endpoints::new(&[
            ep("all", None, &[], true),
            ep("star", None, &["*"], true),
            ep("ops", None, &["hookline.*"], true),
            ep("dead-only", None, &["hookline.delivery.dead"], true),
            ep(
                "acme-ops",
                Some("acme"),
                &["hookline.endpoint.*", "order.*"],
                true,
            ),
        ]);
        let ids = |t: Option<&str>, ty: &str| -> Vec<String> {
            e.matching(t, ty).iter().map(|x| x.id.clone()).collect()
        };
        assert_eq!(ids(None, "hookline.endpoint.disabled"), ["ops"]);
        assert_eq!(
            ids(Some("acme"), "hookline.endpoint.disabled"),
            ["ops", "acme-ops"]
        );
        assert_eq!(
            ids(Some("globex"), "hookline.delivery.dead"),
            ["ops", "dead-only"]
        );
        assert_eq!(ids(Some("acme"), "order.paid"), ["all", "star", "acme-ops"]);
    }

    fn meta(endpoint: &str, tenant: Option<&str>, event_type: &str) -> DeliveryMeta {
        DeliveryMeta::new(endpoint, "evt", event_type, tenant, 0)
    }

    #[test]
    fn usable_names_why_not() {
        let e = Endpoints::new(&[
            ep("acme-msg", Some("acme"), &["message.*"], true),
            ep("off", None, &[], false),
        ]);
        let usable = |m: &DeliveryMeta| e.usable_for(m).map(|ep| ep.id.clone());
        assert_eq!(
            usable(&meta("acme-msg", Some("acme"), "message.created")),
            Ok("acme-msg".to_string())
        );
        assert_eq!(
            usable(&meta("acme-msg", Some("globex"), "message.created")),
            Err(DeadReason::EndpointUnsubscribed)
        );
        assert_eq!(
            usable(&meta("off", None, "x")),
            Err(DeadReason::EndpointDisabled)
        );
        assert_eq!(
            usable(&meta("gone", None, "x")),
            Err(DeadReason::EndpointRemoved)
        );
    }

    #[test]
    fn a_replaced_set_is_read_by_every_handle() {
        let (updater, live) = LiveEndpoints::updatable(&[ep("a", None, &[], true)]);
        let other = live.clone();
        let before = live.current();
        updater.replace(&[ep("b", None, &[], true)]);
        assert!(before.get("a").is_some(), "a snapshot stays as it was");
        assert!(other.current().get("a").is_none());
        assert!(other.current().get("b").is_some());
    }

    #[test]
    fn changes_apply_per_endpoint_and_keep_the_order() {
        let (updater, live) = LiveEndpoints::updatable(&[
            ep("a", None, &[], true),
            ep("b", Some("acme"), &[], true),
            ep("c", None, &[], true),
        ]);
        let ids = |t: Option<&str>| -> Vec<String> {
            live.current()
                .matching(t, "x")
                .iter()
                .map(|e| e.id.clone())
                .collect()
        };
        assert_eq!(ids(Some("acme")), ["a", "b", "c"]);
        // b moves to globex and keeps its place; a goes; d is new, last.
        updater.apply(
            [
                ep("b", Some("globex"), &[], true),
                ep("d", Some("acme"), &[], true),
            ],
            ["a".to_string()],
        );
        assert_eq!(ids(Some("acme")), ["c", "d"]);
        assert_eq!(ids(Some("globex")), ["b", "c"]);
        assert_eq!(ids(None), ["c"]);
        assert_eq!(live.current().len(), 3);
        assert!(live.current().get("a").is_none());
        // Disabled: still there for usable_for's answer, out of fan-out.
        updater.apply([ep("c", None, &[], false)], []);
        assert_eq!(ids(Some("acme")), ["d"]);
        assert!(live.current().get("c").is_some());
    }
}
