//! `hookline-bench`: parses options, runs the benchmark, prints the table. Exits 1 when a run's
//! ledger did not balance (the numbers are INVALID), 2 on a setup error.

use std::process::ExitCode;

use clap::Parser;

use hookline_bench::Options;

fn main() -> ExitCode {
    let opts = Options::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    if opts.endpoints_only {
        return match runtime.block_on(hookline_bench::run_endpoints_only(opts)) {
            Ok(fleet) => {
                println!("{}", fleet.table());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    match runtime.block_on(hookline_bench::run(opts)) {
        Ok(report) => {
            println!("{}", report.table());
            if report.valid {
                ExitCode::SUCCESS
            } else {
                eprintln!("INVALID: at least one run's ledger did not balance");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
