//! An event's delivery history from the delivery log: `hookline trace EVENT_ID` (and the admin
//! API's trace). The event id is the record key and decides the partition
//! ([`crate::attempts::partition_of`]), so only that partition is read — from the start of the
//! log (or `since`) up to its end when the read began (its high watermark): attempts made by
//! every process, in time order.

use std::io::Write;
use std::time::Duration;

use rdkafka::message::Message as _;

use hookline_common::config::Config;
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::{require_topics, TOPICS_WAIT};

use crate::attempts::{partition_of, Attempt};
use crate::table::{time, write_table};
use crate::tail::{covers, Source, StartAt, Tail};

/// Longest a read may go without reaching the partition's end.
const READ_WAIT: Duration = Duration::from_secs(60);

/// The attempts of `event_id` (from `since_ms` on, if given), sorted by time then attempt.
pub async fn trace(
    config: &Config,
    event_id: &str,
    since_ms: Option<i64>,
) -> anyhow::Result<Vec<Attempt>> {
    let topic = Topics::new(&config.topics.prefix).attempts();
    let partitions = require_topics(config, vec![topic.clone()], TOPICS_WAIT)
        .await?
        .get(&topic)
        .copied()
        .unwrap_or(1);
    let source = Source {
        topic: topic.clone(),
        start: since_ms.map_or(StartAt::Beginning, StartAt::Time),
        only_partition: Some(partition_of(event_id, partitions)),
    };
    let (tail, ends) = Tail::open(config, "trace", &[source]).await?;
    let mut positions = tail.positions();
    let mut out = Vec::new();
    let read = async {
        loop {
            if let Some(m) = tail.next().await {
                if m.key() == Some(event_id.as_bytes()) {
                    match serde_json::from_slice::<Attempt>(m.payload().unwrap_or_default()) {
                        Ok(a) => out.push(a),
                        Err(e) => {
                            tracing::warn!(offset = m.offset(), error = %e, "unreadable delivery log record")
                        }
                    }
                }
            }
            if covers(&positions.borrow_and_update(), &ends) {
                return;
            }
        }
    };
    tokio::time::timeout(READ_WAIT, read).await.map_err(|_| {
        anyhow::anyhow!("reading {topic} did not reach its end within {READ_WAIT:?}")
    })?;
    out.sort_by_key(|a| (a.at_ms, a.attempt));
    Ok(out)
}

/// Writes the attempts as a table, or one JSON object per line.
pub fn print(
    out: &mut dyn Write,
    event_id: &str,
    attempts: &[Attempt],
    json: bool,
) -> std::io::Result<()> {
    if json {
        for a in attempts {
            writeln!(out, "{}", serde_json::to_string(a).unwrap_or_default())?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = attempts
        .iter()
        .map(|a| {
            vec![
                time(Some(a.at_ms)),
                a.attempt.to_string(),
                a.endpoint_id.clone(),
                a.stage.clone(),
                match a.status {
                    Some(s) => format!("{} {s}", a.class),
                    None => a.class.clone(),
                },
                format!("{} ms", a.duration_ms),
                a.next.clone().unwrap_or_else(|| "-".into()),
                a.instance.clone(),
            ]
        })
        .collect();
    write_table(
        out,
        &[
            "AT", "ATTEMPT", "ENDPOINT", "STAGE", "RESULT", "DURATION", "NEXT", "INSTANCE",
        ],
        &rows,
    )?;
    writeln!(out, "{} attempt(s) of event {event_id}", attempts.len())
}
