//! A broker's disk made full under load, then freed: node 3's log dir is put on a small tmpfs
//! (`kafka-cluster small-disk`), filled with a file mid-stream, and freed again. Kafka takes a
//! log dir that fails a write offline, and a broker whose only log dir (with the KRaft metadata
//! log) is offline halts: its partitions move to the two others, producers retry their refused
//! writes there, and `acks=all` with `min.insync.replicas` 2 means nothing acknowledged was only
//! on the full disk. Freed and restarted, the broker recovers its logs and catches up.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cluster;
use crate::ledger;
use crate::procs::{watch, Hookline};
use crate::scenario::{Options, Scenario};
use crate::stream::Stream;

const NODE: usize = 3;
const RATE: f64 = 80.0;

/// Bytes the files under `dir` take (`du`; not `df`, which would count its whole file system).
fn used_bytes(dir: &Path) -> u64 {
    let out = std::process::Command::new("du")
        .args(["-s", "-B1"])
        .arg(dir)
        .output()
        .expect("du");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du's byte count")
}

/// Writes `path` until the file system is full; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).expect("filler file");
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = f.sync_all();
    written
}

#[test]
fn a_full_broker_disk_loses_nothing() {
    crate::require_cluster();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sc = Scenario::new("disk", &rt, Options::default());
    let dir = cluster::data_dir(NODE);
    // Room for what the node holds now plus 1 GiB: the tests after this one (multi-MB hostile
    // records among them) cannot fill it; the filler takes a second to write.
    let size_mib = used_bytes(&dir) / (1 << 20) + 1024;
    // The tmpfs is RAM: filling a mistaken size would take the machine down with it.
    assert!(
        size_mib < 4096,
        "node {NODE} holds {size_mib} MiB: too much for a tmpfs log dir"
    );
    let t = Instant::now();
    cluster::small_disk(NODE, &format!("{size_mib}m"));
    sc.say(&format!(
        "node {NODE}'s log dir on a {size_mib} MiB tmpfs (restarted in {:.1}s)",
        t.elapsed().as_secs_f64()
    ));
    let mut hookline = Hookline::all(&sc.config);
    let stream = Stream::for_secs(&sc.prefix, 30.0, RATE, 30);
    let (ids, invalid) = (stream.ids.clone(), stream.invalid);
    let producing = stream.start(&sc.prefix, RATE);
    watch(&mut [&mut hookline], "the stream's start", 6.0);

    let filler = dir.join("hookline-fault-test.filler");
    let t = Instant::now();
    let written = fill(&filler);
    sc.say(&format!(
        "node {NODE}'s disk filled ({} MiB written)",
        written >> 20
    ));
    // The broker's next write fails: the log dir goes offline and the broker halts.
    let mut halted = None;
    while t.elapsed() < Duration::from_secs(60) {
        if !cluster::running(NODE) {
            halted = Some(t.elapsed().as_secs_f64());
            break;
        }
        watch(&mut [&mut hookline], "the full disk", 0.5);
    }
    let halted = halted
        .unwrap_or_else(|| panic!("node {NODE} still runs 60 s after its only log dir filled up"));
    sc.say(&format!(
        "node {NODE} halted {halted:.1}s after its disk filled"
    ));
    watch(&mut [&mut hookline], "a broker down with a full disk", 6.0);
    std::fs::remove_file(&filler).expect("free the disk");
    let back = cluster::start_node(NODE);
    sc.say(&format!(
        "disk freed; node {NODE} recovered its logs and is back in {back:.1}s"
    ));
    sc.finish(
        producing,
        hookline,
        &ids,
        invalid,
        ledger::one_percent(&ids),
    );
}
