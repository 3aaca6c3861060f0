//! Fan-out: which endpoints receive an event. An endpoint receives an event when it is enabled,
//! its tenant matches (an endpoint without a tenant receives every tenant; an event without a
//! tenant goes only to endpoints without one), and one of its `event_types` globs matches the
//! event type (no globs = every type).

use std::collections::HashMap;
use std::sync::Arc;

use hookline_common::config::EndpointConfig;
use hookline_common::glob::glob_match;

/// The configured endpoints, indexed for fan-out and lookup by id.
#[derive(Debug, Clone, Default)]
pub struct Endpoints {
    list: Vec<Arc<EndpointConfig>>,
    by_id: HashMap<String, Arc<EndpointConfig>>,
}

impl Endpoints {
    pub fn new(configs: &[EndpointConfig]) -> Self {
        let list: Vec<Arc<EndpointConfig>> = configs.iter().cloned().map(Arc::new).collect();
        let by_id = list.iter().map(|e| (e.id.clone(), e.clone())).collect();
        Endpoints { list, by_id }
    }

    /// Enabled endpoints subscribed to this event, in configuration order.
    pub fn matching(&self, tenant: Option<&str>, event_type: &str) -> Vec<Arc<EndpointConfig>> {
        self.list
            .iter()
            .filter(|e| e.enabled && subscribes(e, tenant, event_type))
            .cloned()
            .collect()
    }

    /// The endpoint with this id (enabled or not), as configured now.
    pub fn get(&self, id: &str) -> Option<Arc<EndpointConfig>> {
        self.by_id.get(id).cloned()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Whether the endpoint, as configured now, subscribes to events of this tenant and type (its
/// `enabled` flag aside). The one answer to this question: fan-out, every retry attempt and
/// every replay ask it here, so a tenant or type filter changed between attempts is honoured.
pub fn subscribes(e: &EndpointConfig, tenant: Option<&str>, event_type: &str) -> bool {
    let tenant_ok = match (&e.tenant, tenant) {
        (None, _) => true,
        (Some(want), Some(got)) => want == got,
        (Some(_), None) => false,
    };
    tenant_ok
        && (e.event_types.is_empty() || e.event_types.iter().any(|g| glob_match(g, event_type)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(id: &str, tenant: Option<&str>, types: &[&str], enabled: bool) -> EndpointConfig {
        EndpointConfig {
            id: id.into(),
            url: "https://example.com/hook".into(),
            secrets: vec![],
            tenant: tenant.map(str::to_string),
            event_types: types.iter().map(|s| s.to_string()).collect(),
            enabled,
            timeout: None,
            max_concurrency: None,
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
}
