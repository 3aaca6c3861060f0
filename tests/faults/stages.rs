//! The stages as separate processes on the cluster, the way the Kubernetes manifests run them:
//! stage B with a stable instance id (a StatefulSet), dispatchers and tier workers without one
//! (Deployments). Processes are SIGKILLed at random moments and restarted, SIGTERMed and
//! restarted, and the groups scaled up and down mid-stream, while the mixed stream runs.
//!
//! The consumers' session is 6 s here (`session.timeout.ms`; librdkafka's default is 45 s): a
//! killed member without a static id holds its partitions until its session expires.

use std::collections::BTreeMap;

use crate::ledger;
use crate::procs::{watch, Hookline};
use crate::scenario::{env_or, Options, Scenario};
use crate::stream::Stream;

const SESSION: &str = "\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n";
const RATE: f64 = 80.0;

/// The running processes of a scenario, by name.
struct Procs<'a> {
    sc: &'a Scenario,
    running: BTreeMap<String, Hookline>,
}

impl<'a> Procs<'a> {
    fn new(sc: &'a Scenario) -> Procs<'a> {
        Procs {
            sc,
            running: BTreeMap::new(),
        }
    }

    /// Starts process `name` of `stage` (`deduper` gets the stable instance id `b`).
    fn start(&mut self, name: &str) {
        let stage = stage_of(name);
        let env: &[(&str, &str)] = if stage == "deduper" {
            &[("HOOKLINE_KAFKA__INSTANCE_ID", "b")]
        } else {
            &[]
        };
        let p = Hookline::spawn(&self.sc.config, name, &[stage], env);
        self.running.insert(name.to_owned(), p);
    }

    fn kill9(&mut self, name: &str) {
        let p = self.running.remove(name).expect("a running process");
        p.kill9();
    }

    fn stop(&mut self, name: &str) {
        let p = self.running.remove(name).expect("a running process");
        p.stop();
    }

    fn watch(&mut self, what: &str, secs: f64) {
        let mut all: Vec<&mut Hookline> = self.running.values_mut().collect();
        watch(&mut all, what, secs);
    }

    fn alive(&mut self, what: &str) {
        for p in self.running.values_mut() {
            p.assert_running(what);
        }
    }

    fn stop_all(mut self) {
        for name in self.running.keys().cloned().collect::<Vec<_>>() {
            self.stop(&name);
        }
    }
}

/// `dispatcher-2` → `dispatcher`, `retry-tiers-1` → `retry-tiers`.
fn stage_of(name: &str) -> &'static str {
    ["deduper", "dispatcher", "retry-tiers"]
        .into_iter()
        .find(|s| name.starts_with(s))
        .expect("a stage name")
}

/// A small xorshift generator: the kill moments, replayable from the seed printed.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = env_or(
            "HOOKLINE_TEST_FAULT_SEED",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1,
        );
        eprintln!("stage kills: HOOKLINE_TEST_FAULT_SEED={seed}");
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [lo, hi).
    fn secs(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next() % 10_000) as f64 / 10_000.0 * (hi - lo)
    }
}

/// `kill -9` of every stage at random moments (`HOOKLINE_TEST_FAULT_STAGE_KILLS` per stage [2];
/// the long variant: 20), each restarted 0.5–1.5 s later; meanwhile a third dispatcher is added
/// and one of the first two killed for good, and a second tier worker added and removed while
/// records wait in the tiers. Nothing lost, nothing dispatched twice; duplicate POSTs within
/// what the kills of delivering processes allow.
#[test]
fn stage_kills_at_random_moments_lose_nothing() {
    crate::require_cluster();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let kills: usize = env_or("HOOKLINE_TEST_FAULT_STAGE_KILLS", 2);
    let sc = Scenario::new(
        "kill",
        &rt,
        Options {
            kafka_options: SESSION,
            ..Options::default()
        },
    );
    let mut rng = Rng::seeded();
    let mut procs = Procs::new(&sc);
    for name in ["deduper", "dispatcher-1", "dispatcher-2", "retry-tiers-1"] {
        procs.start(name);
    }
    // Kills every ~3 s (one stage at a time, in turn), plus the scaling steps: the stream covers
    // them all.
    let secs = 8.0 + kills as f64 * 3.0 * 3.0 + 4.0;
    let stream = Stream::for_secs(&sc.prefix, secs, RATE, 30);
    let (ids, invalid) = (stream.ids.clone(), stream.invalid);
    sc.say(&format!(
        "{} events at {RATE}/s; {kills} kills per stage",
        ids.len()
    ));
    let producing = stream.start(&sc.prefix, RATE);
    procs.watch("the stream's start", 4.0);

    let mut targets = ["deduper", "dispatcher-2", "retry-tiers-1"];
    let mut delivering_kills = 0;
    for k in 0..kills {
        // Halfway: the dispatcher group scaled (one added, one killed for good), and a second
        // tier worker added.
        if k == kills / 2 {
            procs.start("dispatcher-3");
            procs.start("retry-tiers-2");
            sc.say("dispatcher-3 and retry-tiers-2 added");
            procs.watch("the scale-up", 2.0);
            procs.kill9("dispatcher-1");
            delivering_kills += 1;
            sc.say("dispatcher-1 killed for good (SIGKILL)");
        }
        for target in targets.iter_mut() {
            procs.watch("the stream", rng.secs(1.0, 3.0));
            procs.kill9(target);
            if *target != "deduper" {
                delivering_kills += 1;
            }
            let down = rng.secs(0.5, 1.5);
            sc.say(&format!("{target} killed (SIGKILL), back in {down:.1}s"));
            procs.watch("a restart", down);
            procs.start(target);
        }
        if k == kills / 2 {
            procs.stop("retry-tiers-2");
            sc.say("retry-tiers-2 stopped (SIGTERM) while records wait");
        }
    }
    producing.join().expect("producer thread");
    sc.say("stream produced");
    // What a kill of a delivering process may send again (docs/reliability.md): the deliveries
    // of its partitions after their last commit (offsets are committed every second). Those
    // partitions wait, unowned, until the dead member's session expires (6 s here), and the next
    // owner drains that backlog in a burst: a kill right after such a burst re-sends all of it.
    // So per kill, at most the stream's deliveries (two endpoints, plus the flaky one's retries:
    // a third of its attempts fail) over session + commit interval + restart (~10 s).
    let per_kill = (2.0 * RATE * 4.0 / 3.0 * 10.0) as usize;
    let bound = delivering_kills * per_kill;
    let summary = ledger::settle(&sc, &ids, invalid, bound, || procs.alive("the settling"));
    sc.say(&format!(
        "ledger balanced after {delivering_kills} kills of delivering processes and {kills} of stage B: {summary}"
    ));
    procs.stop_all();
}

/// SIGTERM of each stage under load, each restarted; a tier worker added and removed while
/// records wait; a dispatcher added, then one of the first stopped. A graceful stop hands its
/// work over: 0 duplicate POSTs.
#[test]
fn sigterm_of_each_stage_sends_nothing_twice() {
    crate::require_cluster();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sc = Scenario::new(
        "term",
        &rt,
        Options {
            kafka_options: SESSION,
            ..Options::default()
        },
    );
    let mut procs = Procs::new(&sc);
    for name in ["deduper", "dispatcher-1", "dispatcher-2", "retry-tiers-1"] {
        procs.start(name);
    }
    let stream = Stream::for_secs(&sc.prefix, 26.0, RATE, 30);
    let (ids, invalid) = (stream.ids.clone(), stream.invalid);
    let producing = stream.start(&sc.prefix, RATE);
    procs.watch("the stream's start", 4.0);
    for name in ["deduper", "dispatcher-1", "retry-tiers-1"] {
        procs.stop(name);
        sc.say(&format!("{name} stopped (SIGTERM, exit 0)"));
        procs.start(name);
        procs.watch("a restart", 3.0);
    }
    procs.start("retry-tiers-2");
    procs.start("dispatcher-3");
    sc.say("retry-tiers-2 and dispatcher-3 added");
    procs.watch("the scale-up", 5.0);
    procs.stop("retry-tiers-2");
    procs.stop("dispatcher-2");
    sc.say("retry-tiers-2 and dispatcher-2 stopped (SIGTERM) while records wait");
    producing.join().expect("producer thread");
    sc.say("stream produced");
    let summary = ledger::settle(&sc, &ids, invalid, 0, || procs.alive("the settling"));
    sc.say(&format!("ledger balanced: {summary}"));
    procs.stop_all();
}
