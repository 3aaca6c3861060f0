//! The costliest filters a tenant may write, on a large event: how long one evaluation takes
//! (`docs/delivery.md`, "Payload filters"). `cargo run --release -p hookline-bench --example
//! filter_worst [ITEMS]` (default 100,000 items: a ~1 MiB event).
use std::time::Instant;

use hookline_common::config::filter::EventFilter;
use hookline_delivery::filter::EventView;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let items: Vec<String> = (0..n).map(|i| format!("{i}")).collect();
    let s = "x".repeat(n * 5);
    let body = format!(r#"{{"data":{{"items":[{}],"s":"{s}"}}}}"#, items.join(","));
    println!(
        "event body {} bytes: {n} items and a {}-byte string",
        body.len(),
        s.len()
    );
    let sum = vec!["data.s"; 17].join(" + ");
    let worst = format!(
        "size(data.items.filter(x, x > 0)) < 0 || size(data.items.map(x, x)) < 0 || \
         data.items.all(x, x < 0) || data.items.exists(x, x < 0) || size({sum}) < 0"
    );
    for text in [
        "type == 'a'".to_string(),
        "data.items.exists(x, x < 0)".to_string(),
        format!("size({sum}) < 0"),
        worst,
        "data.items.exists(x, data.items.exists(y, y < 0))".to_string(),
    ] {
        let short = &text[..text.len().min(70)];
        let f = match EventFilter::compile(&text) {
            Ok(f) => f,
            Err(e) => {
                println!("  refused: {short}…\n           {e}");
                continue;
            }
        };
        let start = Instant::now();
        let verdict = EventView::new("e", "t", None, body.as_bytes()).evaluate(&f);
        println!(
            "{:>9.1} ms  {verdict:?}  {short}",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}
