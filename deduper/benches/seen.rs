//! Seen-set and restore benchmarks: `cargo bench -p hookline-deduper --bench seen`.
//!
//! Prints bytes per key at 10M keys, inserts and lookups per second on one core, and the same
//! numbers for a `std::collections::HashMap<u128, u32>` baseline measured in the same run.
//! With `HOOKLINE_BENCH_KAFKA=host:port` it also measures restoring 1M keys from a changelog
//! partition on a real broker.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hookline_common::contract::keyhash::key_hash;
use hookline_deduper::seen::SeenSet;

const N: usize = 10_000_000;

fn hashes(n: usize, salt: &str) -> Vec<u128> {
    (0..n).map(|i| key_hash(&format!("id:{salt}{i}"))).collect()
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn main() {
    let n: usize = std::env::var("SEEN_BENCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(N);
    println!("seen-set benchmark, {n} keys (one core)");
    let keys = hashes(n, "");
    let misses = hashes(n / 2, "miss-");
    let now = 1_800_000_000u32;

    // hookline SeenSet: spread over the window's time buckets like a day of traffic.
    let mut seen = SeenSet::new(86_400);
    let t = Instant::now();
    for (i, h) in keys.iter().enumerate() {
        seen.insert(*h, now - 86_000 + (i as u32 % 86_000));
    }
    let seen_insert = t.elapsed();
    let t = Instant::now();
    let mut hits = 0usize;
    for h in keys.iter().step_by(2).chain(misses.iter()) {
        hits += seen.contains(*h, now) as usize;
    }
    let seen_lookup = t.elapsed();
    assert_eq!(hits, n.div_ceil(2));
    let seen_bpk = seen.bytes() as f64 / seen.len() as f64;

    // Baseline: std HashMap<u128, u32> (what a straightforward implementation would hold).
    let mut map: HashMap<u128, u32> = HashMap::new();
    let t = Instant::now();
    for (i, h) in keys.iter().enumerate() {
        map.insert(*h, now - (i as u32 % 86_000));
    }
    let map_insert = t.elapsed();
    let t = Instant::now();
    let mut hits2 = 0usize;
    for h in keys.iter().step_by(2).chain(misses.iter()) {
        hits2 += map.contains_key(h) as usize;
    }
    let map_lookup = t.elapsed();
    assert_eq!(hits2, hits);
    // hashbrown: one control byte per bucket + the (u128, u32) entry padded to 32 bytes.
    let map_bytes = map.capacity() as f64 * 8.0 / 7.0 * (32.0 + 1.0);
    let map_bpk = map_bytes / map.len() as f64;
    let lookups = n / 2 + n.div_ceil(2);

    println!("| structure | bytes/key | inserts/s | lookups/s |");
    println!("|---|---|---|---|");
    println!(
        "| hookline SeenSet (96-bit tag + u32 time, swept per bucket) | {:.1} | {:.2}M | {:.2}M |",
        seen_bpk,
        rate(n, seen_insert) / 1e6,
        rate(lookups, seen_lookup) / 1e6
    );
    println!(
        "| baseline std HashMap<u128, u32> | {:.1} (est.) | {:.2}M | {:.2}M |",
        map_bpk,
        rate(n, map_insert) / 1e6,
        rate(lookups, map_lookup) / 1e6
    );
    println!(
        "ratios SeenSet/baseline: memory {:.2}x, inserts {:.2}x, lookups {:.2}x",
        seen_bpk / map_bpk,
        rate(n, seen_insert) / rate(n, map_insert),
        rate(lookups, seen_lookup) / rate(lookups, map_lookup)
    );
    drop(map);
    drop(seen);

    match std::env::var("HOOKLINE_BENCH_KAFKA") {
        Ok(bs) => restore_bench(&bs),
        Err(_) => println!("restore benchmark: set HOOKLINE_BENCH_KAFKA=127.0.0.1:9092 to run it"),
    }
}

fn restore_bench(bootstrap: &str) {
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    let keys: usize = std::env::var("RESTORE_BENCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let prefix = format!("bench-restore-{}", std::process::id());
    let config = hookline_common::Config::from_toml_with_env(
        &format!(
            "[kafka]\nbootstrap_servers = \"{bootstrap}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 1\n"
        ),
        "bench",
        Vec::new(),
    )
    .expect("bench config");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(hookline_common::kafka::apply_topics(
        &config,
        Duration::from_secs(30),
    ))
    .expect("topics");
    let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> =
        hookline_common::kafka::producer_config(&config)
            .set("linger.ms", "20")
            .set("batch.size", "1000000")
            .create()
            .expect("producer");
    let topic = format!("{prefix}.dedupe-state");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0);
    let t = Instant::now();
    for i in 0..keys {
        let k = key_hash(&format!("id:r{i}")).to_be_bytes();
        let v = (now - (i as u32 % 80_000)).to_be_bytes();
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&topic)
            .partition(0)
            .key(&k[..])
            .payload(&v[..]);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    println!(
        "restore benchmark: wrote {keys} changelog records in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let stats = hookline_deduper::dedupe::restore_for_bench(&config, 0).expect("restore");
    println!(
        "restore: {} records -> {} keys in {:.2}s = {:.0} keys/s ({:.1} bytes/key)",
        stats.records,
        stats.keys,
        stats.elapsed.as_secs_f64(),
        stats.keys as f64 / stats.elapsed.as_secs_f64(),
        stats.bytes as f64 / stats.keys as f64
    );
}
