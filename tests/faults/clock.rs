//! Clock jumps: the wall clock of one stage process at a time jumped an hour forward, then an hour
//! back, then restored, under the mixed stream (retries waiting in the tiers all along). The
//! jump goes through hookline's one wall-clock helper (`common/src/runtime/clock.rs`): each
//! process reads its offset from a file the test rewrites (`HOOKLINE_TEST_CLOCK_OFFSET_FILE`);
//! the monotonic clock is left alone, as an NTP step leaves it. No retry may be lost or fired
//! twice, and no POST sent twice.
//!
//! What it does not step: clocks read inside libraries (librdkafka's record timestamps, which
//! no stage reads back: tier due times are the broker's LogAppendTime). Until 2026-12-06 the
//! test preloaded libfaketime, which stepped those too but cannot run beside a whole-process
//! allocator (docs/performance.md, run 10).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::ledger;
use crate::procs::{watch, Hookline};
use crate::scenario::{Options, Scenario};
use crate::stream::Stream;

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
        let offset_file = config.with_file_name(format!("{stage}.clock-offset"));
        std::fs::write(&offset_file, "+0").expect("clock offset file");
        let file = offset_file.to_str().expect("utf-8 path").to_owned();
        let mut env = vec![("HOOKLINE_TEST_CLOCK_OFFSET_FILE", file.as_str())];
        if stage == "deduper" {
            env.push(("HOOKLINE_KAFKA__INSTANCE_ID", "b"));
        }
        let proc = Hookline::spawn(config, stage, &[stage], &env);
        Faked { proc, offset_file }
    }

    /// Sets the process's clock offset, e.g. "+1h", "-1h", "+0".
    fn set(&self, offset: &str) {
        std::fs::write(&self.offset_file, offset).expect("clock offset file");
    }
}

#[test]
fn clock_jumps_neither_lose_nor_repeat_a_retry() {
    crate::require_cluster();
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

/// Debian's libfaketime, for the librdkafka probe below.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// Set in the probe's child process: the topic it writes and reads.
const PROBE_VAR: &str = "HOOKLINE_TEST_CLOCK_PROBE_TOPIC";
const PROBE_TEST: &str = "clock::librdkafka_waits_survive_a_clock_step";
/// How long the child runs, by the monotonic clock.
const PROBE_SECS: u64 = 20;

/// The clocks the test above cannot step: those librdkafka reads itself. Until hookline built
/// librdkafka with its timed waits on `CLOCK_MONOTONIC` (vendor/rdkafka-sys/PATCHED.md), a step
/// back stalled stage B's commit for 31 s and a consumer's heartbeats for 79 s. hookline's own
/// binary cannot take libfaketime (it clashes with its allocator at start), so this test runs
/// its own binary again as a child with libfaketime preloaded: the same patched librdkafka, a
/// transactional producer committing every 25 ms as stage B does and a group consumer reading
/// what it commits, while the parent steps the child's clock an hour forward, back, and home.
/// Every commit must return within 5 s and the consumer must keep receiving.
#[test]
fn librdkafka_waits_survive_a_clock_step() {
    if let Ok(topic) = std::env::var(PROBE_VAR) {
        return probe(&topic);
    }
    crate::require_cluster();
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's faketime (apt-get install faketime; .ci/run does)"
    );
    let prefix = crate::harness::unique_prefix("clockprobe");
    let topic = format!("{prefix}.probe");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let new =
            rdkafka::admin::NewTopic::new(&topic, 3, rdkafka::admin::TopicReplication::Fixed(3));
        crate::harness::admin()
            .create_topics([&new], &crate::harness::admin_opts())
            .await
            .expect("create the probe topic");
    });
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("probe dir");
    let offset_file = dir.join("probe.faketime");
    std::fs::write(&offset_file, "+0").expect("faketime file");
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = std::process::Command::new(exe)
        .args([PROBE_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(PROBE_VAR, &topic)
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME_TIMESTAMP_FILE", &offset_file)
        // Read the file again at most once a second (not on every clock read).
        .env("FAKETIME_CACHE_DURATION", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the probe");
    std::thread::sleep(std::time::Duration::from_secs(4));
    for (offset, secs) in [("+1h", 5), ("-1h", 5), ("+0", 3)] {
        std::fs::write(&offset_file, offset).expect("faketime file");
        eprintln!("[clockprobe] the probe's clock set to {offset}");
        std::thread::sleep(std::time::Duration::from_secs(secs));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(PROBE_SECS + 90);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the probe") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the probe did not finish within {} s", PROBE_SECS + 90);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let output = child.wait_with_output().expect("the probe's output");
    let out = String::from_utf8_lossy(&output.stdout);
    let err = String::from_utf8_lossy(&output.stderr);
    // libtest prints the test's name on the line its output starts.
    let summary: Vec<&str> = out
        .lines()
        .filter_map(|l| l.find("probe: ").map(|at| &l[at..]))
        .collect();
    assert!(
        status.success() && !summary.is_empty(),
        "the probe failed ({status}):\n{out}\n{err}"
    );
    eprintln!("[clockprobe] {}", summary.join("; "));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child: commits and reads for [`PROBE_SECS`] under the stepped clock, then reports.
fn probe(topic: &str) {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    let bs = crate::harness::bootstrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("transactional.id", format!("{topic}-txn"))
        .set("transaction.timeout.ms", "30000")
        .create()
        .expect("probe producer");
    producer
        .init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("group.id", format!("{topic}-group"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .create()
        .expect("probe consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let stop = Arc::new(AtomicBool::new(false));
    let (received, longest_gap_ms) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reader = {
        let (stop, received, longest) = (stop.clone(), received.clone(), longest_gap_ms.clone());
        std::thread::spawn(move || {
            let mut last: Option<Instant> = None;
            while !stop.load(Ordering::Relaxed) {
                if let Some(Ok(_)) = consumer.poll(Duration::from_millis(100)) {
                    if let Some(at) = last {
                        longest.fetch_max(at.elapsed().as_millis() as u64, Ordering::Relaxed);
                    }
                    last = Some(Instant::now());
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let (start, start_wall) = (Instant::now(), SystemTime::now());
    let (mut commits, mut slowest, mut skew_s) = (0u64, Duration::ZERO, 0i64);
    while start.elapsed() < Duration::from_secs(PROBE_SECS) {
        producer.begin_transaction().expect("begin_transaction");
        for i in 0..10u32 {
            let payload = i.to_be_bytes();
            let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(&payload[..]);
            producer.send(record).map_err(|(e, _)| e).expect("send");
        }
        let began = Instant::now();
        producer
            .commit_transaction(Duration::from_secs(60))
            .expect("commit_transaction");
        slowest = slowest.max(began.elapsed());
        commits += 1;
        // The wall clock against the monotonic one: the step took effect.
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let expected = (start_wall + start.elapsed())
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        skew_s = skew_s.max((wall - expected).abs());
        std::thread::sleep(Duration::from_millis(25));
    }
    // The last records' way to the reader.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader thread");
    let (got, gap) = (
        received.load(Ordering::Relaxed),
        longest_gap_ms.load(Ordering::Relaxed),
    );
    println!(
        "probe: {commits} transactions, slowest commit {} ms; {got} records read, longest \
         gap between them {gap} ms; the clock stepped by up to {skew_s} s",
        slowest.as_millis()
    );
    assert!(
        skew_s > 1800,
        "the clock never stepped (largest skew {skew_s} s): libfaketime did not take effect"
    );
    assert!(
        slowest < Duration::from_secs(5),
        "a commit took {slowest:?} under the clock steps"
    );
    assert!(
        got >= commits * 10,
        "read {got} of {} records",
        commits * 10
    );
    assert!(
        gap < 5000,
        "the consumer went {gap} ms without a record under the clock steps"
    );
}
