//! The network between a process and the brokers fails, not a broker: `run all` talks to the
//! cluster only through the fault proxies (tests/faults/proxy.rs), which cut it off entirely for
//! longer than its group session and stage B's transaction timeout, then heal, then slow every
//! byte down. The brokers and the test's own clients go on meanwhile. The process must never exit
//! and must rejoin by itself; the ledger must balance.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::harness;
use crate::ledger;
use crate::procs::{watch, Hookline};
use crate::proxy::{Mode, Proxies};
use crate::receiver::{Behavior, Recorded};
use crate::scenario::{env_or, Options, Scenario};
use crate::stream::Stream;

/// A 6 s group session (librdkafka's default is 45 s), so the partition outlasts it.
const SESSION: &str = "\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n";
/// Stream before the cut.
const WARMUP: f64 = 5.0;
/// The partition: past the 6 s session and stage B's 10 s transaction timeout.
const CUT: f64 = 15.0;
/// Healed, before the link turns slow.
const HEALED: f64 = 10.0;
/// The slow link: every chunk this late, both ways (a request and its answer: twice that).
const SLOW: Duration = Duration::from_millis(400);
const SLOW_SECS: f64 = 10.0;

#[test]
fn a_process_cut_off_from_the_brokers_rejoins_by_itself() {
    crate::require_cluster();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let proxies = Proxies::start_all();
    let sc = Scenario::new(
        "net",
        &rt,
        Options {
            bootstrap: Some(proxies.bootstrap()),
            kafka_options: SESSION,
            ..Options::default()
        },
    );
    let rate: f64 = env_or("HOOKLINE_TEST_FAULT_RATE", 80.0);
    let mut hookline = Hookline::all(&sc.config);
    // The faults take 40 s; the stream (unique events plus every third re-sent) runs ~45 s, so
    // the process also has to catch up under load after the last one.
    let stream = Stream::for_secs(&sc.prefix, 45.0, rate, 30);
    let (ids, invalid) = (stream.ids.clone(), stream.invalid);
    sc.say(&format!(
        "hookline run all through the proxies ({}); {} events ({} records) at {rate}/s",
        proxies.bootstrap(),
        ids.len(),
        stream.len()
    ));
    let producing = stream.start(&sc.prefix, rate);
    watch(&mut [&mut hookline], "the stream's start", WARMUP);

    proxies.set(Mode::Blackhole);
    let cut_at = Instant::now();
    sc.say(&format!("network cut (blackhole) for {CUT} s"));
    watch(&mut [&mut hookline], "the network partition", CUT);

    proxies.set(Mode::Pass);
    let heal_at = Instant::now();
    sc.say("network healed");
    watch(&mut [&mut hookline], "the heal", HEALED);

    proxies.set(Mode::Slow(SLOW));
    let slow_at = Instant::now();
    sc.say(&format!(
        "network slow: every chunk {SLOW:?} late, both ways"
    ));
    watch(&mut [&mut hookline], "the slow network", SLOW_SECS);

    proxies.set(Mode::Pass);
    let fast_at = Instant::now();
    sc.say("network normal");
    producing.join().expect("producer thread");
    sc.say("stream produced");

    // What at-least-once may send again here: one lost assignment. The cut outlasts the session,
    // so every consumer group of the process loses its partitions at once, and no offset commit
    // succeeds from the cut to the rejoin: what the process delivered after its last commit before
    // the cut (auto-commit every second) and what it delivered during the cut (records it had
    // already fetched; nothing new can be fetched) is sent again after the heal. Bounded by two
    // seconds of the whole stream's POSTs: `rate` records/s, two endpoints, the flaky one's
    // retries (every third POST a 503) counted at 1.5 attempts per delivery: 480 at 80/s, the
    // bound stages.rs allows per kill of a delivering process. The slow link must cost nothing
    // (the 2 × 400 ms round trip is well inside the 6 s session). Measured (3 runs at 80/s):
    // 210, 113, 110 duplicate POSTs, all sent again within the first seconds after the heal.
    let bound = (2.0 * rate * 2.0 * 1.5) as usize;
    let summary = ledger::settle(&sc, &ids, invalid, bound, || {
        hookline.assert_running("the settling")
    });
    hookline.assert_running("the ledger check");

    let phases = Phases {
        cut_at,
        heal_at,
        slow_at,
        fast_at,
    };
    let healthy = sc.rx.requests("/healthy");
    let flaky = sc.rx.requests("/flaky");
    let during_cut = healthy
        .iter()
        .chain(&flaky)
        .filter(|r| r.at >= cut_at && r.at < heal_at)
        .count();
    let during_slow = healthy
        .iter()
        .chain(&flaky)
        .filter(|r| r.at >= slow_at && r.at < fast_at)
        .count();
    let recovered = recovery(&healthy, heal_at);
    let endpoints: [Endpoint; 2] = [
        ("healthy", &healthy, None),
        ("flaky", &flaky, Some(&sc.flaky)),
    ];
    let delivered_and_dead = delivered_and_dead(&sc, &endpoints);
    let dups = duplicates(&endpoints, &phases);
    let log = log_summary(&hookline.log_text());
    sc.say(&format!(
        "{during_cut} POSTs during the cut; delivering new events again {} after the heal; \
         {:.0} POSTs/s while slow; duplicate POSTs by the time of the repeat: {dups}; dead letters \
         of deliveries that also got a 200: {delivered_and_dead:?}",
        recovered.map_or("never".to_owned(), |s| format!("{s:.1}s")),
        during_slow as f64 / fast_at.duration_since(slow_at).as_secs_f64(),
    ));
    sc.say(&format!(
        "proxies accepted {} connections; hookline log: {log}",
        proxies.accepted()
    ));
    sc.say(&format!(
        "ledger balanced after a {CUT} s cut and {SLOW_SECS} s at +{SLOW:?} (bound {bound} duplicate POSTs): {summary}"
    ));
    hookline.stop();
}

struct Phases {
    cut_at: Instant,
    heal_at: Instant,
    slow_at: Instant,
    fast_at: Instant,
}

impl Phases {
    fn of(&self, at: Instant) -> &'static str {
        if at < self.cut_at {
            "before the cut"
        } else if at < self.heal_at {
            "cut"
        } else if at < self.slow_at {
            "healed"
        } else if at < self.fast_at {
            "slow"
        } else {
            "after"
        }
    }
}

/// An endpoint of the receiver: its name, the requests it got, and its script (`None`: every
/// request answered 200).
type Endpoint<'a> = (&'a str, &'a [Recorded], Option<&'a [Behavior]>);

/// The number N of an event id `<prefix>-evt-N`.
fn event_number(r: &Recorded) -> Option<usize> {
    r.headers
        .get("webhook-id")?
        .rsplit_once("-evt-")?
        .1
        .parse()
        .ok()
}

/// Seconds from the heal to the first POST of an event newer than every one POSTed before it:
/// the first record that went through the whole pipeline again (nothing new can be fetched while
/// cut off).
fn recovery(requests: &[Recorded], heal_at: Instant) -> Option<f64> {
    let newest = requests
        .iter()
        .filter(|r| r.at < heal_at)
        .filter_map(event_number)
        .max()?;
    requests
        .iter()
        .filter(|r| r.at >= heal_at && event_number(r).is_some_and(|n| n > newest))
        .map(|r| r.at.duration_since(heal_at).as_secs_f64())
        .reduce(f64::min)
}

/// Duplicate 200s (beyond the first per endpoint and id), counted by the phase of the repeat,
/// e.g. "12 (healed 10, slow 2)". A flaky request's answer is its script's entry.
fn duplicates(endpoints: &[Endpoint], phases: &Phases) -> String {
    let mut by_phase: BTreeMap<&str, usize> = BTreeMap::new();
    let mut total = 0;
    for (_, requests, script) in endpoints {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, r) in requests.iter().enumerate() {
            let ok = answered_ok(*script, i);
            let Some(id) = r.headers.get("webhook-id") else {
                continue;
            };
            if ok {
                let n = seen.entry(id).or_insert(0);
                *n += 1;
                if *n > 1 {
                    total += 1;
                    *by_phase.entry(phases.of(r.at)).or_insert(0) += 1;
                }
            }
        }
    }
    let parts: Vec<String> = by_phase.iter().map(|(p, n)| format!("{p} {n}")).collect();
    format!("{total} ({})", parts.join(", "))
}

/// Whether the i-th request to an endpoint with `script` was answered 200.
fn answered_ok(script: Option<&[Behavior]>, i: usize) -> bool {
    match script.and_then(|s| s.get(i)) {
        Some(Behavior::Status(c)) => *c == 200,
        Some(_) => false,
        None => true,
    }
}

/// The (endpoint, event id) pairs that got a 200 and a dead letter as well: a retry chain forked
/// by a redelivery (one branch succeeded, the other ran out of attempts).
fn delivered_and_dead(sc: &Scenario, endpoints: &[Endpoint]) -> Vec<(String, String)> {
    let mut ok: BTreeSet<(String, String)> = BTreeSet::new();
    for (name, requests, script) in endpoints {
        for (i, r) in requests.iter().enumerate() {
            if let (true, Some(id)) = (answered_ok(*script, i), r.headers.get("webhook-id")) {
                ok.insert((name.to_string(), id.clone()));
            }
        }
    }
    harness::read_until(
        &format!("{}.dlq", sc.prefix),
        Duration::from_secs(3),
        |_| false,
    )
    .iter()
    .filter_map(|m| {
        Some((
            harness::header(m, "hookline-endpoint-id")?.to_owned(),
            harness::header(m, "hookline-event-id")?.to_owned(),
        ))
    })
    .filter(|k| ok.contains(k))
    .collect()
}

/// Lines per level and the WARN/ERROR messages with their counts, from the JSON log.
fn log_summary(text: &str) -> String {
    let mut levels: BTreeMap<String, usize> = BTreeMap::new();
    let mut messages: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            *levels.entry("non-JSON".to_owned()).or_insert(0) += 1;
            continue;
        };
        let level = v["level"].as_str().unwrap_or("?").to_owned();
        if level == "WARN" || level == "ERROR" {
            let msg = v["fields"]["message"]
                .as_str()
                .or(v["message"].as_str())
                .unwrap_or("?");
            *messages.entry(format!("{level} {msg}")).or_insert(0) += 1;
        }
        *levels.entry(level).or_insert(0) += 1;
    }
    let levels: Vec<String> = levels.iter().map(|(l, n)| format!("{l} {n}")).collect();
    let messages: Vec<String> = messages
        .iter()
        .map(|(m, n)| format!("  {n} × {m}"))
        .collect();
    format!("{}\n{}", levels.join(", "), messages.join("\n"))
}
