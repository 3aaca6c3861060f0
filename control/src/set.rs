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
#[derive(Debug, Clone)]
pub struct EndpointSet {
    /// Persistent: a copy (every published snapshot) is O(1), a change O(log n).
    endpoints: imbl::OrdMap<String, Arc<Endpoint>>,
    /// Which set this is a later copy of (sets started apart never share `log` numbers).
    lineage: u64,
    /// Changes made so far.
    version: u64,
    /// The last [`CHANGE_LOG`] changes: (version after it, id). Lets [`EndpointSet::changed_since`]
    /// answer a snapshot a few changes old without walking the whole set.
    log: imbl::Vector<(u64, String)>,
}

/// Changes an [`EndpointSet`] remembers by id.
pub const CHANGE_LOG: usize = 4096;

impl Default for EndpointSet {
    fn default() -> Self {
        static LINEAGE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        EndpointSet {
            endpoints: imbl::OrdMap::new(),
            lineage: LINEAGE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            version: 0,
            log: imbl::Vector::new(),
        }
    }
}

/// Two sets are equal when they hold the same endpoints (however they got there).
impl PartialEq for EndpointSet {
    fn eq(&self, other: &Self) -> bool {
        self.endpoints == other.endpoints
    }
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
    /// by id: from the change log when `earlier` is an older copy of this set at most
    /// [`CHANGE_LOG`] changes back (an id in it may have changed back: a superset, which every
    /// caller re-reads anyway); else one walk of both, comparing pointers (an unchanged endpoint
    /// is shared).
    pub fn changed_since(&self, earlier: &EndpointSet) -> Vec<String> {
        if self.lineage == earlier.lineage && earlier.version <= self.version {
            let behind = self.version - earlier.version;
            if behind <= self.log.len() as u64 {
                let mut ids: Vec<String> = self
                    .log
                    .iter()
                    .skip(self.log.len() - behind as usize)
                    .map(|(_, id)| id.clone())
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                return ids;
            }
        }
        self.walk_changed(earlier)
    }

    fn walk_changed(&self, earlier: &EndpointSet) -> Vec<String> {
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
        self.logged(&e.id);
        self.endpoints.insert(e.id.clone(), Arc::new(e));
    }
    pub(crate) fn remove(&mut self, id: &str) {
        if self.endpoints.remove(id).is_some() {
            self.logged(id);
        }
    }
    fn logged(&mut self, id: &str) {
        self.version += 1;
        self.log.push_back((self.version, id.to_string()));
        if self.log.len() > CHANGE_LOG {
            self.log.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(id: &str, url: &str) -> Endpoint {
        Endpoint {
            id: id.into(),
            url: url.into(),
            ..crate::endpoint::tests::endpoint()
        }
    }

    fn set_of(n: usize) -> EndpointSet {
        let mut s = EndpointSet::default();
        for i in 0..n {
            s.insert(ep(&format!("e{i:05}"), "https://a.example/"));
        }
        s
    }

    #[test]
    fn changes_come_from_the_log_and_match_the_walk() {
        let before = set_of(100);
        let mut after = before.clone();
        after.insert(ep("e00007", "https://b.example/"));
        after.insert(ep("e00003", "https://b.example/"));
        after.insert(ep("e00007", "https://c.example/"));
        after.remove("e00050");
        after.remove("nope");
        after.insert(ep("new", "https://a.example/"));
        let want = vec!["e00003", "e00007", "e00050", "new"];
        assert_eq!(after.changed_since(&before), want);
        assert_eq!(after.walk_changed(&before), want);
        assert!(after.changed_since(&after).is_empty());
        // Older than the log: the walk answers.
        let old = set_of(10);
        let mut far = old.clone();
        for i in 0..CHANGE_LOG + 10 {
            far.insert(ep(&format!("f{i:05}"), "https://a.example/"));
        }
        assert_eq!(far.changed_since(&old).len(), CHANGE_LOG + 10);
        // Another lineage: the walk, comparing pointers (nothing shared: every id).
        assert_eq!(set_of(3).changed_since(&set_of(3)).len(), 3);
        assert_eq!(set_of(3), set_of(3));
    }
}
