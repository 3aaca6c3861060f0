//! Consumer lag of each pipeline hop, sampled every 500 ms on its own thread (librdkafka's
//! metadata and offset calls block): per group, the sum over partitions of high watermark minus
//! committed offset. Committed offsets trail by up to the auto-commit interval (1 s) and
//! transaction markers count as records, so small non-zero lag is normal when idle.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use hookline_common::config::Config;
use hookline_common::kafka::base_config;

/// A consumer group and the topic it reads.
pub struct Hop {
    pub group: String,
    pub topic: String,
}

type Maxima = Arc<Mutex<BTreeMap<String, i64>>>;

pub struct LagWatch {
    stop: Arc<AtomicBool>,
    max: Maxima,
    thread: Option<JoinHandle<()>>,
}

impl LagWatch {
    pub fn start(config: &Config, hops: Vec<Hop>, partitions: i32) -> anyhow::Result<LagWatch> {
        let mut probes = Vec::new();
        for hop in hops {
            // Never subscribes, so it never joins the group: it only reads its committed offsets.
            let consumer: BaseConsumer = base_config(config)
                .set("group.id", &hop.group)
                .set("enable.auto.commit", "false")
                .create()?;
            probes.push((hop, consumer));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let max: Maxima = Arc::default();
        let thread = {
            let (stop, max) = (stop.clone(), max.clone());
            std::thread::Builder::new()
                .name("bench-lag".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        for (hop, consumer) in &probes {
                            if let Some(lag) = group_lag(consumer, &hop.topic, partitions) {
                                if let Ok(mut m) = max.lock() {
                                    let e = m.entry(hop.group.clone()).or_insert(0);
                                    *e = (*e).max(lag);
                                }
                            }
                        }
                        std::thread::sleep(Duration::from_millis(500));
                    }
                })?
        };
        Ok(LagWatch {
            stop,
            max,
            thread: Some(thread),
        })
    }

    /// The maximum lag per group since the last call, and starts a new window.
    pub fn take_max(&self) -> BTreeMap<String, i64> {
        self.max
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }
}

impl Drop for LagWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn group_lag(consumer: &BaseConsumer, topic: &str, partitions: i32) -> Option<i64> {
    let timeout = Duration::from_secs(2);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, timeout).ok()?;
    let mut lag = 0;
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout).ok()?;
        let at = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => low,
        };
        lag += (high - at).max(0);
    }
    Some(lag)
}
