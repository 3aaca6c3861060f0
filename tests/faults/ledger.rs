//! The ledger of a round, read with independent consumers from the topics and from the receiver's
//! record: every unique dedupe key reached every subscribed endpoint (a 200) or holds exactly
//! one dead letter for it; no dedupe key has two committed dispatch records; every invalid input
//! is on `<p>.invalid` with a reason; duplicate POSTs are counted against the bound
//! docs/reliability.md states.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use crate::harness;
use crate::receiver::{Behavior, Receiver};
use crate::scenario::Scenario;

/// How long a round may take to settle after its stream ends: the last retry is 6 s after the
/// first attempt, plus the time a restarted broker's partitions take to catch up.
const SETTLE: Duration = Duration::from_secs(150);
/// Duplicate POSTs allowed in a round without a process exit: at-least-once means a redelivery
/// after a consumer rebalance cut work short; there should be none, and a handful at most.
/// docs/reliability.md states the bound this enforces.
pub const MAX_DUPLICATE_SHARE: f64 = 0.01;

/// The duplicate POSTs a round of `ids` unique events may cost without a process exit: 1 % of its
/// deliveries (two endpoints).
pub fn one_percent(ids: &BTreeSet<String>) -> usize {
    (MAX_DUPLICATE_SHARE * (2 * ids.len()) as f64).ceil() as usize
}

pub struct Summary {
    pub events: usize,
    pub delivered: [usize; 2],
    pub dead: [usize; 2],
    pub duplicate_posts: usize,
    /// Forked retry chains seen: (endpoint, event) pairs that got a 200 and also a dead letter,
    /// and dead letters beyond the first of an undelivered pair.
    pub dead_and_delivered: usize,
    pub invalid: usize,
    pub settle_secs: f64,
    /// Where the duplicate POSTs fell: "<endpoint> <second of the scenario>s: n", for the log.
    pub duplicates_when: String,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} events: healthy {} delivered / {} dead, flaky {} delivered / {} dead; {} duplicate POSTs; {} invalid quarantined; settled {:.1}s after the stream",
            self.events,
            self.delivered[0],
            self.dead[0],
            self.delivered[1],
            self.dead[1],
            self.duplicate_posts,
            self.invalid,
            self.settle_secs
        )?;
        if self.dead_and_delivered > 0 {
            write!(
                f,
                "; {} forked chains (a delivered pair dead-lettered, or a second dead letter)",
                self.dead_and_delivered
            )?;
        }
        if self.duplicate_posts > 0 {
            write!(f, "; duplicates by arrival: {}", self.duplicates_when)?;
        }
        Ok(())
    }
}

const ENDPOINTS: [(&str, &str); 2] = [("healthy", "/healthy"), ("flaky", "/flaky")];

/// Webhook ids answered 200 at `path`, with how many 200s each got (the i-th request to a
/// scripted path got the i-th behaviour of its script).
fn delivered(rx: &Receiver, path: &str, script: Option<&[Behavior]>) -> HashMap<String, usize> {
    let mut ok = HashMap::new();
    for (i, r) in rx.requests(path).iter().enumerate() {
        let status = match script.and_then(|s| s.get(i)) {
            Some(Behavior::Status(c)) => *c,
            Some(_) => 0,
            None => 200,
        };
        if status == 200 {
            if let Some(id) = r.headers.get("webhook-id") {
                *ok.entry(id.clone()).or_insert(0) += 1;
            }
        }
    }
    ok
}

/// The seconds (since the scenario started) at which repeated 200s arrived, per endpoint and
/// 2 s bucket: which fault cost the duplicates.
fn duplicates_when(sc: &Scenario) -> String {
    let scripts = [None, Some(sc.flaky.as_slice())];
    let mut out = Vec::new();
    for ((name, path), script) in ENDPOINTS.iter().zip(scripts) {
        let mut seen = HashMap::new();
        let mut buckets = std::collections::BTreeMap::new();
        for (i, r) in sc.rx.requests(path).iter().enumerate() {
            let ok = match script.and_then(|s| s.get(i)) {
                Some(Behavior::Status(c)) => *c == 200,
                Some(_) => false,
                None => true,
            };
            let Some(id) = r.headers.get("webhook-id").filter(|_| ok) else {
                continue;
            };
            let n = seen.entry(id.clone()).or_insert(0usize);
            *n += 1;
            if *n > 1 {
                let at = r.at.saturating_duration_since(sc.t0).as_secs() / 2 * 2;
                *buckets.entry(at).or_insert(0usize) += 1;
            }
        }
        for (at, n) in buckets {
            out.push(format!("{name} {at}s: {n}"));
        }
    }
    out.join(", ")
}

/// The dead letters of a round, read by one consumer assigned to every partition of
/// `<p>.dlq` from the start (read_committed) and drained on each look: a look costs milliseconds,
/// not a new consumer's start.
struct DeadLetters {
    consumer: rdkafka::consumer::BaseConsumer,
    /// Per (endpoint, event id).
    seen: HashMap<(String, String), usize>,
}

impl DeadLetters {
    fn open(prefix: &str) -> DeadLetters {
        DeadLetters {
            consumer: harness::reader_from_start(&format!("{prefix}.dlq")),
            seen: HashMap::new(),
        }
    }

    /// Reads what arrived since the last look (until 300 ms pass without a record).
    fn look(&mut self) -> &HashMap<(String, String), usize> {
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < Duration::from_millis(300) {
            match self.consumer.poll(Duration::from_millis(50)) {
                Some(Ok(m)) => {
                    quiet_since = Instant::now();
                    let m = m.detach();
                    if let (Some(e), Some(id)) = (
                        harness::header(&m, "hookline-endpoint-id"),
                        harness::header(&m, "hookline-event-id"),
                    ) {
                        *self.seen.entry((e.to_owned(), id.to_owned())).or_insert(0) += 1;
                    }
                }
                Some(Err(e)) => panic!("reading the dead-letter topic: {e}"),
                None => {}
            }
        }
        &self.seen
    }
}

/// Waits until the round settles, then checks every line of the ledger. `alive` is called on
/// every turn (it fails the test if the process exited).
/// `max_duplicates` is the bound on duplicate POSTs the scenario states.
pub fn settle(
    sc: &Scenario,
    ids: &BTreeSet<String>,
    invalid_expected: usize,
    max_duplicates: usize,
    mut alive: impl FnMut(),
) -> Summary {
    let (prefix, rx, flaky_script) = (sc.prefix.as_str(), &sc.rx, sc.flaky.as_slice());
    let start = Instant::now();
    let mut dead_letters = DeadLetters::open(prefix);
    let scripts = [None, Some(flaky_script)];
    let (ok, _) = loop {
        alive();
        let ok: Vec<HashMap<String, usize>> = ENDPOINTS
            .iter()
            .zip(scripts)
            .map(|((_, path), s)| delivered(rx, path, s))
            .collect();
        let missing: Vec<(usize, &String)> = (0..2)
            .flat_map(|e| {
                let ok = &ok[e];
                ids.iter()
                    .filter(move |id| !ok.contains_key(*id))
                    .map(move |id| (e, id))
            })
            .collect();
        let dead = if missing.is_empty() {
            HashMap::new()
        } else {
            dead_letters.look().clone()
        };
        let lost: Vec<_> = missing
            .iter()
            .filter(|(e, id)| !dead.contains_key(&(ENDPOINTS[*e].0.to_owned(), (*id).clone())))
            .collect();
        if lost.is_empty() {
            break (ok, dead);
        }
        assert!(
            start.elapsed() < SETTLE,
            "after {SETTLE:?}, {} (endpoint, event) deliveries neither reached the receiver nor are dead, e.g. {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let settle_secs = start.elapsed().as_secs_f64();
    // Read the dead letters whole (the loop above skips them once nothing is missing): a dead
    // letter for a pair that also got a 200 is a forked retry chain (docs/reliability.md).
    // A dead letter of a forked chain can trail its branch's 200: one more second of looking.
    std::thread::sleep(Duration::from_secs(1));
    let dead = dead_letters.look().clone();
    let dead_and_delivered = dead
        .keys()
        .filter(|(e, id)| {
            ENDPOINTS
                .iter()
                .position(|(name, _)| name == e)
                .is_some_and(|i| ok[i].contains_key(id))
        })
        .count();

    // Exactly one dead letter for each delivery that never succeeded — or, after a fork (both
    // branches of a forked chain dead), more: those count with the forked chains.
    let mut dead_count = [0usize; 2];
    let mut extra_dead = 0usize;
    for (e, (name, _)) in ENDPOINTS.iter().enumerate() {
        for id in ids {
            let n = dead
                .get(&(name.to_string(), id.clone()))
                .copied()
                .unwrap_or(0);
            if !ok[e].contains_key(id) {
                assert!(n >= 1, "{name}/{id}: no 200 and no dead letter");
                extra_dead += n - 1;
                dead_count[e] += 1;
            }
        }
    }

    // No dedupe key dispatched twice; every one dispatched.
    let dispatch = harness::read_all_quiet(
        &format!("{prefix}.dispatch"),
        ids.len(),
        Duration::from_secs(60),
        Duration::from_secs(3),
    );
    let mut by_key: HashMap<String, usize> = HashMap::new();
    let mut dispatched_ids = BTreeSet::new();
    for m in &dispatch {
        let key = harness::header(m, "hookline-dedupe-key")
            .expect("every dispatch record has its dedupe key")
            .to_owned();
        *by_key.entry(key).or_insert(0) += 1;
        // hookline's own events (operational webhooks: endpoint changes, dead letters) are
        // deduped like any (the key check above) but are not the stream's.
        let own =
            harness::header(m, "hookline-event-type").is_some_and(|t| t.starts_with("hookline."));
        if let Some(id) = harness::header(m, "hookline-event-id").filter(|_| !own) {
            dispatched_ids.insert(id.to_owned());
        }
    }
    let twice: Vec<_> = by_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} dedupe keys have two or more committed dispatch records, e.g. {:?}",
        twice.len(),
        &twice[..twice.len().min(5)]
    );
    assert_eq!(
        &dispatched_ids, ids,
        "the dispatch topic holds exactly the unique ids"
    );

    // Every invalid input quarantined, with a reason.
    let invalid = harness::read_until(
        &format!("{prefix}.invalid"),
        Duration::from_secs(30),
        |rs| rs.len() >= invalid_expected,
    );
    assert_eq!(
        invalid.len(),
        invalid_expected,
        "invalid records quarantined"
    );
    for m in &invalid {
        assert!(
            harness::header(m, "hookline-invalid-reason").is_some_and(|r| !r.is_empty()),
            "a quarantined record has its reason"
        );
    }

    // Duplicate POSTs: 200s beyond the first per (endpoint, id).
    let duplicate_posts: usize = ok
        .iter()
        .flat_map(|m| m.values())
        .map(|n| n.saturating_sub(1))
        .sum();
    let forked = dead_and_delivered + extra_dead;
    assert!(
        forked <= max_duplicates,
        "{forked} forked retry chains ({dead_and_delivered} deliveries got a 200 and a dead letter, \
         {extra_dead} dead letters beyond the first of an undelivered one), over the bound of {max_duplicates}"
    );
    assert!(
        duplicate_posts <= max_duplicates,
        "{duplicate_posts} duplicate POSTs, over the bound of {max_duplicates} (docs/reliability.md)"
    );

    Summary {
        events: ids.len(),
        delivered: [ok[0].len(), ok[1].len()],
        dead: dead_count,
        duplicate_posts,
        dead_and_delivered: forked,
        invalid: invalid.len(),
        settle_secs,
        duplicates_when: duplicates_when(sc),
    }
}
