#!/usr/bin/env bash
# Runs hookline locally (`make run`): a local Kafka broker, the topics, and every stage in one
# process with config/local.toml. Ctrl-C stops hookline gracefully; the broker keeps running
# (`deploy/local/kafka stop` stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${HOOKLINE_CONFIG:-config/local.toml}

deploy/local/kafka start
cargo build --release --bin hookline
bin=target/release/hookline
"$bin" --config "$config" config check "$config"
"$bin" --config "$config" topics apply
echo "--- hookline running (ops: http://127.0.0.1:9464/metrics); produce JSON events to webhooks.events"
exec "$bin" --config "$config" run all
