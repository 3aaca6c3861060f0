//! Logging setup: `tracing` with a pretty or JSON formatter; librdkafka's log lines arrive through
//! the `log` bridge under the `librdkafka` target.

use tracing_subscriber::EnvFilter;

use hookline_common::config::{LogConfig, LogFormat};

/// Installs the global subscriber. `RUST_LOG` wins over `log.level` when set.
pub fn init(log: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match log.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Pretty => builder.compact().try_init(),
    };
    // A second init (tests, `run all`) keeps the first subscriber.
    let _ = result;
}
