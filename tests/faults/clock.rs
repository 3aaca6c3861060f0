//! Clock jumps: the wall clock of one stage process at a time jumped an hour forward, then an hour
//! back, then restored, under the mixed stream (retries waiting in the tiers all along). The
//! jump is libfaketime's (Debian's `faketime`): `LD_PRELOAD`ed into that process only, reading
//! its offset from a file the test rewrites; the monotonic clock is left alone, as an NTP step
//! leaves it. No retry may be lost or fired twice, and no POST sent twice.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::ledger;
use crate::procs::{watch, Hookline};
use crate::scenario::{Options, Scenario};
use crate::stream::Stream;

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const RATE: f64 = 80.0;
/// The schedule's gaps between attempts, in seconds (scenario::SCHEDULE).
const GAPS: [f64; 6] = [1.0; 6];

/// A stage process whose wall clock the test sets.
struct Faked {
    proc: Hookline,
    offset_file: PathBuf,
}

impl Faked {
    fn spawn(config: &Path, stage: &str) -> Faked {
        let offset_file = config.with_file_name(format!("{stage}.faketime"));
        std::fs::write(&offset_file, "+0").expect("faketime file");
        let file = offset_file.to_str().expect("utf-8 path").to_owned();
        let mut env = vec![
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME_TIMESTAMP_FILE", file.as_str()),
            // Read the file again at most once a second (not on every clock read).
            ("FAKETIME_CACHE_DURATION", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ];
        if stage == "deduper" {
            env.push(("HOOKLINE_KAFKA__INSTANCE_ID", "b"));
        }
        let proc = Hookline::spawn(config, stage, &[stage], &env);
        Faked { proc, offset_file }
    }

    /// Sets the process's clock offset, e.g. "+1h", "-1h", "+0".
    fn set(&self, offset: &str) {
        std::fs::write(&self.offset_file, offset).expect("faketime file");
    }
}

#[test]
fn clock_jumps_neither_lose_nor_repeat_a_retry() {
    crate::require_cluster();
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's faketime (apt-get install faketime; .ci/run does)"
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sc = Scenario::new("clock", &rt, Options::default());
    let mut procs: Vec<Faked> = ["deduper", "dispatcher", "retry-tiers"]
        .into_iter()
        .map(|s| Faked::spawn(&sc.config, s))
        .collect();
    // Each process: +1h for 5 s, -1h for 5 s, then its own clock again for 1 s.
    let secs = 4.0 + procs.len() as f64 * 11.0 + 2.0;
    let stream = Stream::for_secs(&sc.prefix, secs, RATE, 30);
    let (ids, invalid) = (stream.ids.clone(), stream.invalid);
    let producing = stream.start(&sc.prefix, RATE);
    let watch_all = |procs: &mut Vec<Faked>, what: &str, secs: f64| {
        let mut all: Vec<&mut Hookline> = procs.iter_mut().map(|f| &mut f.proc).collect();
        watch(&mut all, what, secs);
    };
    watch_all(&mut procs, "the stream's start", 4.0);
    for i in 0..procs.len() {
        let name = procs[i].proc.name.clone();
        for (offset, secs) in [("+1h", 5.0), ("-1h", 5.0), ("+0", 1.0)] {
            procs[i].set(offset);
            sc.say(&format!("{name}'s clock set to {offset}"));
            watch_all(&mut procs, &format!("{name}'s clock at {offset}"), secs);
        }
    }
    producing.join().expect("producer thread");
    sc.say("stream produced");
    let summary = ledger::settle(&sc, &ids, invalid, 0, || {
        for f in procs.iter_mut() {
            f.proc.assert_running("the settling");
        }
    });
    let attempts = attempt_check(&sc);
    sc.say(&format!("ledger balanced: {summary}; {attempts}"));
    for f in procs {
        f.proc.stop();
    }
}

/// Reads every request at the receiver by (endpoint, `webhook-id`): each attempt number arrived
/// once, and the numbers run 1, 2, … without a gap (an attempt skipped would be a retry lost on
/// the way). Fails the test otherwise; returns how many retries came earlier than the schedule
/// says (a clock jumped forward makes them due early: allowed, and reported).
fn attempt_check(sc: &Scenario) -> String {
    let mut by_delivery: HashMap<(&str, String), Vec<(u32, std::time::Instant)>> = HashMap::new();
    let requests: Vec<_> = ["/healthy", "/flaky"]
        .into_iter()
        .map(|p| (p, sc.rx.requests(p)))
        .collect();
    for (path, reqs) in &requests {
        for r in reqs {
            let id = r.headers.get("webhook-id").cloned().expect("webhook-id");
            let n: u32 = r
                .headers
                .get("webhook-attempt")
                .and_then(|v| v.parse().ok())
                .expect("webhook-attempt");
            by_delivery.entry((path, id)).or_default().push((n, r.at));
        }
    }
    // Proof that the jumps reached the delivering processes: requests signed an hour off.
    let skewed = requests
        .iter()
        .flat_map(|(_, reqs)| reqs.iter())
        .filter(|r| {
            r.headers
                .get("webhook-timestamp")
                .and_then(|t| t.parse::<i64>().ok())
                .is_some_and(|t| (t - r.at_ms / 1000).abs() > 1800)
        })
        .count();
    assert!(
        skewed > 0,
        "no request carried a webhook-timestamp an hour off: the fake clock did not take effect"
    );
    let (mut retries, mut early) = (0usize, 0usize);
    for ((path, id), mut got) in by_delivery {
        got.sort_by_key(|(n, at)| (*n, *at));
        let numbers: Vec<u32> = got.iter().map(|(n, _)| *n).collect();
        let expected: Vec<u32> = (1..=numbers.len() as u32).collect();
        assert_eq!(
            numbers, expected,
            "{path} {id}: attempts arrived as {numbers:?} (one fired twice, or one lost)"
        );
        for w in got.windows(2) {
            retries += 1;
            let gap = w[1].1.saturating_duration_since(w[0].1).as_secs_f64();
            if gap + 0.5 < GAPS[(w[0].0 - 1) as usize] {
                early += 1;
            }
        }
    }
    format!(
        "{retries} retries, each attempt number once, none skipped; {early} came early; \
         {skewed} requests signed with a clock an hour off"
    )
}
