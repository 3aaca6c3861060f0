//! The endpoint set a process holds (every endpoint of the registry, by id) and the paged
//! queries on it that every list answers from: the admin API's `GET /v1/endpoints`, the
//! dashboard's endpoint list.

use std::sync::Arc;

use hookline_common::config::EndpointConfig;

use crate::endpoint::Endpoint;

/// Most endpoints one page holds.
pub const MAX_PAGE: usize = 1000;
/// A page's size when none is asked for.
pub const DEFAULT_PAGE: usize = 100;

/// An endpoint's state, as lists filter by it (and `hookline_control_endpoints` counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Enabled,
    Disabled,
    /// A secret of it cannot be opened with this process's keys: treated as disabled.
    Unusable,
}

impl State {
    pub fn parse(s: &str) -> Result<State, String> {
        match s {
            "enabled" => Ok(State::Enabled),
            "disabled" => Ok(State::Disabled),
            "unusable" => Ok(State::Unusable),
            other => Err(format!(
                "`{other}` is not a state: enabled, disabled or unusable"
            )),
        }
    }
    pub fn of(e: &Endpoint) -> State {
        match (e.problem.is_some(), e.enabled) {
            (true, _) => State::Unusable,
            (false, true) => State::Enabled,
            (false, false) => State::Disabled,
        }
    }
}

/// Which endpoints a list wants, and from where.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only this tenant's endpoints (not the untenanted ones).
    pub tenant: Option<String>,
    pub state: Option<State>,
    /// Only endpoints whose URL starts with this.
    pub url_prefix: Option<String>,
    /// The cursor: endpoints with an id after this one.
    pub after: Option<String>,
    /// 1..=[`MAX_PAGE`].
    pub limit: usize,
}

impl Query {
    fn wants(&self, e: &Endpoint) -> bool {
        self.tenant
            .as_ref()
            .is_none_or(|t| e.tenant.as_ref() == Some(t))
            && self.state.is_none_or(|s| State::of(e) == s)
            && self
                .url_prefix
                .as_ref()
                .is_none_or(|p| e.url.starts_with(p.as_str()))
    }
}

/// One page of a list: the endpoints and the cursor of the next page (`None`: the last page).
pub struct Page<'a> {
    pub items: Vec<&'a Endpoint>,
    pub next: Option<String>,
}

/// Every endpoint of the registry, by id: what a process delivers to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndpointSet {
    /// Persistent: a copy (every published snapshot) is O(1), a change O(log n).
    endpoints: imbl::OrdMap<String, Arc<Endpoint>>,
}

impl EndpointSet {
    pub fn get(&self, id: &str) -> Option<&Endpoint> {
        self.endpoints.get(id).map(|e| e.as_ref())
    }
    /// Every endpoint, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.values().map(|e| e.as_ref())
    }
    /// The endpoints with an id after `after` (all: `None`), by id.
    pub fn iter_after<'a>(&'a self, after: Option<&str>) -> impl Iterator<Item = &'a Endpoint> {
        use std::ops::Bound;
        let start = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Unbounded,
        };
        self.endpoints
            .range((start, Bound::Unbounded))
            .map(|(_, e)| e.as_ref())
    }
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }
    /// Every endpoint as the delivery engine takes it, for requests at `t_ms` (see
    /// [`Endpoint::config_at`]).
    pub fn configs_at(&self, t_ms: i64) -> Vec<EndpointConfig> {
        self.iter().filter_map(|e| e.config_at(t_ms)).collect()
    }
    /// The ids whose endpoint differs between `earlier` and this set (added, changed or gone),
    /// by id: one walk of both, comparing pointers (an unchanged endpoint is shared).
    pub fn changed_since(&self, earlier: &EndpointSet) -> Vec<String> {
        let mut a = earlier.endpoints.iter().peekable();
        let mut b = self.endpoints.iter().peekable();
        let mut out = Vec::new();
        loop {
            match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some((ka, _)), None) => {
                    out.push((*ka).clone());
                    a.next();
                }
                (None, Some((kb, _))) => {
                    out.push((*kb).clone());
                    b.next();
                }
                (Some((ka, va)), Some((kb, vb))) => match ka.cmp(kb) {
                    std::cmp::Ordering::Less => {
                        out.push((*ka).clone());
                        a.next();
                    }
                    std::cmp::Ordering::Greater => {
                        out.push((*kb).clone());
                        b.next();
                    }
                    std::cmp::Ordering::Equal => {
                        if !Arc::ptr_eq(va, vb) {
                            out.push((*kb).clone());
                        }
                        a.next();
                        b.next();
                    }
                },
            }
        }
        out
    }
    /// A page of the endpoints `q` wants that `sees` lets the caller see (a tenant token: its
    /// tenant's), by id from `q.after`: memory for one page, whatever the set's size.
    pub fn page<'a>(&'a self, q: &Query, sees: impl Fn(Option<&str>) -> bool) -> Page<'a> {
        let limit = q.limit.clamp(1, MAX_PAGE);
        let mut items = Vec::with_capacity(limit.min(64));
        let mut more = false;
        for e in self
            .iter_after(q.after.as_deref())
            .filter(|e| sees(e.tenant.as_deref()) && q.wants(e))
        {
            if items.len() == limit {
                more = true;
                break;
            }
            items.push(e);
        }
        let next = if more {
            items.last().map(|e| e.id.clone())
        } else {
            None
        };
        Page { items, next }
    }
    pub(crate) fn insert(&mut self, e: Endpoint) {
        self.endpoints.insert(e.id.clone(), Arc::new(e));
    }
    pub(crate) fn remove(&mut self, id: &str) {
        self.endpoints.remove(id);
    }
}
