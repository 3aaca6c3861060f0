//! The payload-filter cost alone (`make bench` measures it too): `cargo run --release -p
//! hookline-bench --example filter_cost [N] [PAYLOAD_BYTES]`.

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n = args.next().map_or(Ok(100_000), |a| a.parse())?;
    let bytes = args.next().map_or(Ok(1024), |a| a.parse())?;
    let c = hookline_bench::filter_cost::measure(n, bytes)?;
    println!("{}", serde_json::to_string_pretty(&c)?);
    Ok(())
}
