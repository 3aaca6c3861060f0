//! What a payload filter costs the delivery path, per evaluation, on the run's own event bodies
//! (`--payload-bytes`), measured in the same run beside the per-delivery CPU of the stages:
//!
//! - `type_only`: `type == '…'` — the body is never parsed;
//! - `data_first`: `data.copy >= 0 && data.sched_ns > 0` on a fresh event, i.e. the body parsed
//!   and its `data` converted once, then evaluated: what fan-out pays for an event's first
//!   filtered endpoint (and a retry for its one);
//! - `data_more`: the same expression again on the same event: what each further filtered
//!   endpoint of that event costs.
//!
//! Timed on one thread, `n` evaluations each, after a warm-up.

use std::time::Instant;

use serde::Serialize;

use hookline_common::config::filter::EventFilter;
use hookline_delivery::filter::EventView;

use crate::load;

#[derive(Debug, Clone, Serialize)]
pub struct FilterCost {
    pub evaluations: usize,
    pub payload_bytes: usize,
    pub type_only_us: f64,
    pub data_first_us: f64,
    pub data_more_us: f64,
}

/// Measures the three costs with `n` evaluations each.
pub fn measure(n: usize, payload_bytes: usize) -> anyhow::Result<FilterCost> {
    let type_only = EventFilter::compile("type == 'order.created'").map_err(anyhow::Error::msg)?;
    let on_data =
        EventFilter::compile("data.copy >= 0 && data.sched_ns > 0").map_err(anyhow::Error::msg)?;
    let bodies: Vec<(String, Vec<u8>)> = (0..n.min(1000))
        .map(|i| {
            let id = format!("evt_{i}");
            let body =
                load::event_body(&id, "order.created", "acme", 1 + i as u64, 0, payload_bytes);
            (id, body)
        })
        .collect();
    let per_eval = |f: &dyn Fn(&EventView<'_>) -> bool| -> anyhow::Result<f64> {
        for (id, body) in bodies.iter().take(100) {
            f(&EventView::new(id, "order.created", Some("acme"), body));
        }
        let start = Instant::now();
        for i in 0..n {
            let (id, body) = &bodies[i % bodies.len()];
            let view = EventView::new(id, "order.created", Some("acme"), body);
            anyhow::ensure!(f(&view), "the bench filter must match its events");
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
    };
    let type_only_us = per_eval(&|v| v.evaluate(&type_only).admits())?;
    let data_first_us = per_eval(&|v| v.evaluate(&on_data).admits())?;
    let twice_us = per_eval(&|v| v.evaluate(&on_data).admits() && v.evaluate(&on_data).admits())?;
    Ok(FilterCost {
        evaluations: n,
        payload_bytes,
        type_only_us,
        data_first_us,
        data_more_us: (twice_us - data_first_us).max(0.0),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn measures_something() {
        let c = super::measure(200, 1024).expect("measured");
        println!("{c:?}");
        assert!(c.type_only_us > 0.0 && c.data_first_us > 0.0, "{c:?}");
    }
}
