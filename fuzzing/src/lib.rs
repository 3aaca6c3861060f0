//! The runner of hookline's property tests ("fuzzing on stable"), shared by every crate that has
//! some (a dev-dependency only): properties run on inputs arbtest generates for
//! `HOOKLINE_TEST_FUZZ_MS` milliseconds (default 1500; `HOOKLINE_TEST_FUZZ_MS=600000` for a long
//! run), or the single case of `HOOKLINE_TEST_FUZZ_SEED=0x…` (shrunk first with
//! `HOOKLINE_TEST_FUZZ_MINIMIZE=1`). A failure prints arbtest's seed and the command that replays
//! it.

use std::time::Instant;

pub use arbtest::arbitrary::{self, Unstructured};

/// One property: panics when it does not hold for the input drawn from `u`.
pub type Property = fn(&mut Unstructured<'_>) -> arbitrary::Result<()>;

/// Runs `properties` (one drawn per case) within the time budget; `size_max` bounds the random
/// bytes of one case. `replay` is the cargo command that selects the calling test's binary, e.g.
/// `cargo test -p hookline-delivery --lib`, printed with the test's name when a case fails.
/// Prints the cases run per property (`--nocapture`).
pub fn fuzz(replay: &str, size_max: u32, properties: &[(&str, Property)]) {
    let test = std::thread::current()
        .name()
        .unwrap_or("<test name>")
        .to_string();
    let budget_ms = env_u64("HOOKLINE_TEST_FUZZ_MS").unwrap_or(1500);
    let mut cases = vec![0u64; properties.len()];
    let start = Instant::now();
    {
        let _hint = ReplayHint {
            replay,
            test: &test,
        };
        let run = arbtest::arbtest(|u| {
            let i = u.choose_index(properties.len())?;
            cases[i] += 1;
            (properties[i].1)(u)
        })
        .size_max(size_max)
        .budget_ms(budget_ms);
        match env_u64("HOOKLINE_TEST_FUZZ_SEED") {
            None => run.run(),
            Some(seed) if std::env::var_os("HOOKLINE_TEST_FUZZ_MINIMIZE").is_some() => {
                run.seed(seed).minimize().run()
            }
            Some(seed) => run.seed(seed).run(),
        }
    }
    let elapsed = start.elapsed();
    let total: u64 = cases.iter().sum();
    let per: Vec<String> = properties
        .iter()
        .zip(&cases)
        .map(|((name, _), n)| format!("{name}: {n}"))
        .collect();
    eprintln!(
        "{test}: {total} cases in {elapsed:.1?} ({:.0}/s); {}",
        total as f64 / elapsed.as_secs_f64().max(1e-9),
        per.join(", ")
    );
}

/// A decimal or `0x` hexadecimal number from the environment.
fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={text} is not a number")))
}

/// Prints, under arbtest's "Seed: 0x…" of a failing case, the command that replays it.
struct ReplayHint<'a> {
    replay: &'a str,
    test: &'a str,
}

impl Drop for ReplayHint<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "replay this case: HOOKLINE_TEST_FUZZ_SEED=<the seed above> {} -- --exact {}\n\
                 (add HOOKLINE_TEST_FUZZ_MINIMIZE=1 to shrink it first; HOOKLINE_TEST_FUZZ_MS \
                 bounds the shrinking time)",
                self.replay, self.test
            );
        }
    }
}
