//! The benchmark harness's smoke run (`hookline-bench --smoke`) as part of the test command: the
//! real `hookline` binary (the debug build this suite already has), one process per stage, the
//! real broker. It checks that every run's ledger balances and that every number comes out —
//! never a speed: this box is shared and the suite runs tests in parallel.

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_run_balances_every_ledger_and_reports_every_number() {
    require_kafka();
    let out = std::env::temp_dir().join(unique_prefix("bench"));
    let opts = <hookline_bench::Options as clap::Parser>::try_parse_from([
        "hookline-bench",
        "--smoke",
        "--bootstrap",
        &bootstrap(),
        "--hookline",
        env!("CARGO_BIN_EXE_hookline"),
        "--out-dir",
        out.to_str().expect("utf-8 temp dir"),
    ])
    .expect("smoke options parse");
    let report = hookline_bench::run(opts).await.expect("smoke run");
    let table = report.table();

    assert!(report.valid, "a ledger did not balance:\n{table}");
    let names: Vec<&str> = report.runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "max",
            "search-1",
            "lat-50%",
            "lat-90%",
            "iso-base",
            "iso-hang",
            "inflight",
            "nb-alone-1",
            "nb-beside-1",
            "trace-off",
            "trace-on"
        ],
        "{table}"
    );
    for r in &report.runs {
        let l = &r.ledger;
        assert!(l.balanced, "{}: {:?}", r.name, l.problems);
        assert_eq!(
            l.produced,
            l.delivered + l.deduplicated + l.dead + l.invalid
        );
        // The in-flight run sends fresh events only, so its held count is exact.
        let dups_expected = r.name != "inflight";
        assert!(
            (l.deduplicated > 0) == dups_expected && l.delivered > 0,
            "{}: {l:?}",
            r.name
        );
        assert!(r.deliveries > 0 && r.sustained_per_s > 0.0, "{}", r.name);
        assert!(r.latency.samples > 0 && r.latency.p99_ms >= r.latency.p50_ms);
        assert!(r.latency.p999_ms >= r.latency.p99_ms, "{}", r.name);
        assert_eq!(r.cpu.len(), 3, "{}", r.name);
        assert!(r.cpu.iter().all(|c| c.cpu_s >= 0.0), "{}", r.name);
    }
    // The mix: the max run sends failing events (dead letters), the hanging endpoint's
    // deliveries end dead, and the latency runs are scheduled (open model).
    let run = |n: &str| {
        report
            .runs
            .iter()
            .find(|r| r.name == n)
            .expect("run present")
    };
    assert!(run("max").ledger.dead > 0, "{table}");
    // Traces at 100% sampling: the traced stages exported spans to the sink.
    let traced = report
        .trace_cost
        .as_ref()
        .expect("the traces-cost section ran");
    assert!(
        traced.otlp_requests > 0 && traced.otlp_bytes_per_delivery > 0.0,
        "{table}"
    );
    assert_eq!(traced.on_us.len(), 3, "{table}");
    assert!(run("iso-hang").ledger.dead > 0, "{table}");
    assert_eq!(run("iso-base").ledger.dead, 0, "{table}");
    for n in ["search-1", "lat-50%", "lat-90%"] {
        assert!(run(n).target_rate.is_some(), "{n}");
    }
    // The search probed once; the latency runs are taken of what it found (kept up or not: a
    // smoke run never judges speed) and come with the latency split by hop, every hop sampled.
    let found = &report.sustainable;
    assert_eq!(found.probes.len(), 1, "{table}");
    assert_eq!(run("search-1").target_rate, Some(found.probes[0].rate));
    let l50 = run("lat-50%").target_rate.expect("scheduled");
    assert!((l50 - found.rate * 0.5).abs() < 1e-6, "{table}");
    for n in ["lat-50%", "lat-90%"] {
        let hops: Vec<&str> = run(n).hops.iter().map(|h| h.hop.as_str()).collect();
        assert_eq!(hops, hookline_bench::hops::HOPS, "{n}");
        for h in &run(n).hops {
            // The bench places events by key and stage B reads them in place (`dedupe.direct`):
            // none crosses `<p>.dedupe`, so `validate` has no sample.
            if h.hop == "validate" {
                assert_eq!(h.samples, 0, "{n} {h:?}\n{table}");
                continue;
            }
            assert!(h.samples > 0 && h.p99_ms >= h.p50_ms, "{n} {h:?}\n{table}");
        }
    }
    assert!(table.contains("latency by hop"), "{table}");
    assert!(report.runs[0].cpu.iter().any(|c| c.cpu_s > 0.0), "{table}");

    assert!(report.http_ceiling.per_s > 0.0 && report.kafka_ceiling.per_s > 0.0);
    assert!(
        report.kafka_ceiling.bench_cpu_us_per_record > 0.0,
        "the Kafka ceiling's client CPU per record: {table}"
    );
    assert!(table.contains("µs CPU/record"), "{table}");
    // The two reference relays POSTed every record of the run.
    for r in [&report.bare_relay, &report.same_shape_relay] {
        assert!(r.posts == r.records && r.per_s > 0.0, "{r:?}\n{table}");
        assert!(r.machine_cpu_us_per_record > 0.0, "{r:?}");
    }
    // Each ratio to a relay is split into CPU per delivery × machine busy, and the split
    // multiplies back to the ratio.
    for (ratio, split) in [
        (
            report.ratios.pipeline_over_same_shape_relay,
            report.ratios.same_shape_split,
        ),
        (
            report.ratios.pipeline_over_bare_relay,
            report.ratios.bare_split,
        ),
    ] {
        let (ratio, split) = (ratio.expect("ratio"), split.expect("split"));
        assert!(
            (split.cpu * split.busy - ratio).abs() < 1e-6 * ratio.max(1.0),
            "{split:?} vs {ratio}\n{table}"
        );
    }
    assert!(table.contains("× machine busy"), "{table}");
    assert_eq!(
        (report.bare_relay.hops, report.same_shape_relay.hops),
        (0, 2)
    );
    assert!(
        table.contains("Bare relay") && table.contains("/ same-shape relay"),
        "{table}"
    );
    for r in [
        report.ratios.pipeline_over_http,
        report.ratios.pipeline_over_kafka,
        report.ratios.pipeline_over_bare_relay,
        report.ratios.pipeline_over_same_shape_relay,
        report.ratios.isolation,
    ] {
        assert!(r.is_some_and(|r| r > 0.0), "{table}");
    }
    for stage in ["deduper", "dispatcher", "retry-tiers"] {
        assert!(
            report.peak_rss.get(stage).is_some_and(|b| *b > 0),
            "{stage}"
        );
    }

    // The JSON file holds the same report; the table prints the ledger of every run.
    let path = report.json_path.as_ref().expect("json written");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("read json")).expect("json");
    assert_eq!(json["valid"], true);
    assert_eq!(json["runs"].as_array().map(Vec::len), Some(11));
    // The in-flight run saw the dispatcher hold deliveries open and read its RSS meanwhile.
    let inflight = report.inflight.as_ref().expect("in-flight run");
    assert!(
        inflight.peak_inflight > 0 && inflight.sink_open_at_peak > 0,
        "{inflight:?}\n{table}"
    );
    assert!(inflight.rss_at_peak_mib > 0.0 && inflight.rss_max_mib >= inflight.rss_at_peak_mib);
    assert_eq!(run("inflight").deliveries, 500, "5 events x 100 endpoints");
    // The neighbour pair: the rate-limited endpoint's backlog arrived whole.
    let nb = report.neighbour.as_ref().expect("neighbour pairs");
    assert_eq!(nb.pairs.len(), 1, "{table}");
    assert!(nb.limited_complete && nb.valid, "{nb:?}\n{table}");
    assert!(nb.pairs[0].alone_per_s > 0.0 && nb.pairs[0].beside_per_s > 0.0);
    assert!(table.contains("rate-limited drain"), "{table}");
    assert!(table.contains("sustainable / HTTP ceiling") && !table.contains("INVALID"));
    let _ = std::fs::remove_dir_all(&out);
}

/// The many-endpoints phase (`--endpoints N --endpoints-only`) at 1,000 endpoints: every figure
/// comes out (the speeds and sizes are the real bench's to report, not this test's to judge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_endpoints_phase_reports_every_figure() {
    require_kafka();
    let out = std::env::temp_dir().join(unique_prefix("bench-fleet"));
    let opts = <hookline_bench::Options as clap::Parser>::try_parse_from([
        "hookline-bench",
        "--smoke",
        "--endpoints",
        "1000",
        "--endpoints-only",
        "--bootstrap",
        &bootstrap(),
        "--hookline",
        env!("CARGO_BIN_EXE_hookline"),
        "--out-dir",
        out.to_str().expect("utf-8 temp dir"),
    ])
    .expect("options parse");
    let f = hookline_bench::run_endpoints_only(opts)
        .await
        .expect("many-endpoints run");
    let table = f.table();
    assert_eq!(
        (f.endpoints, f.tenants, f.hanging),
        (1_000, 100, 10),
        "{table}"
    );
    assert_eq!(f.events_per_drain, 500, "{table}");
    assert!(f.import_s > 0.0 && f.import_per_s > 0.0, "{table}");
    assert!(f.dispatcher_loaded_s >= f.import_s, "{table}");
    for rss in [
        f.dispatcher_rss_empty_mib,
        f.dispatcher_rss_full_mib,
        f.admin_rss_empty_mib,
        f.admin_rss_after_drain_mib,
        f.new_pod_rss_mib,
    ] {
        assert!(rss > 0.0, "{table}");
    }
    assert!(
        f.small_healthy_per_s > 0.0 && f.full_healthy_per_s > 0.0,
        "{table}"
    );
    // 10% of the full drain's events go to a tenant with a hanging endpoint.
    assert!(f.hung_requests > 0, "{table}");
    assert!(f.new_pod_ready_s > 0.0, "{table}");
    assert!(table.contains("bytes/endpoint") && table.contains("new dispatcher pod"));
    let json = std::fs::read_dir(&out)
        .expect("out dir")
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().ends_with("-endpoints.json"))
        .expect("the JSON report");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json.path()).expect("read")).expect("json");
    assert_eq!(v["fleet"]["endpoints"], 1_000);
    let _ = std::fs::remove_dir_all(&out);
}
