#!/usr/bin/env bash
# Runs hookline locally (`make run`): a local Kafka broker, the topics, every stage in one process
# with config/local.toml (log in target/demo-pipeline.log), a reference webhook receiver
# (`hookline receiver`, log in target/demo-receiver.log) and a demo producer showing a live
# progress view, then a summary with commands to try. Ctrl-C stops hookline and the receiver
# gracefully; the broker keeps running (`deploy/local/kafka stop` stops it).
# HOOKLINE_DEMO=0: only the pipeline, in the foreground (no receiver, no demo events).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${HOOKLINE_CONFIG:-config/local.toml}
demo=${HOOKLINE_DEMO:-1}
# Not a configuration override: keep it away from hookline's `HOOKLINE_…` env parsing.
unset HOOKLINE_DEMO

deploy/local/kafka start
cargo build --release --bin hookline
bin=target/release/hookline
"$bin" --config "$config" config check "$config"
"$bin" --config "$config" topics apply

if [ "$demo" = "0" ]; then
    echo "--- hookline running (ops: http://127.0.0.1:9464/metrics); produce JSON events to webhooks.events"
    exec "$bin" --config "$config" run all
fi

# The receiver's secret is the one of the `demo` endpoint in config/local.toml.
secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
receiver_log=target/demo-receiver.log
pipeline_log=target/demo-pipeline.log
receiver_pid=
pipeline_pid=
stop() {
    trap - INT TERM
    echo "--- stopping hookline and the receiver"
    for pid in $pipeline_pid $receiver_pid; do
        kill -TERM "$pid" 2>/dev/null || true
    done
}
trap stop INT TERM

"$bin" receiver --listen 127.0.0.1:8080 --secret "$secret" --fail-every 5 >"$receiver_log" 2>&1 &
receiver_pid=$!
sleep 1
if ! kill -0 "$receiver_pid" 2>/dev/null; then
    cat "$receiver_log" >&2
    echo "the receiver did not start (is 127.0.0.1:8080 taken?)" >&2
    exit 1
fi
echo "--- receiver on 127.0.0.1:8080 (answers 503 to every 5th fresh request); log: $receiver_log"
# The pipeline logs to a file: the terminal shows the progress view instead.
"$bin" --config "$config" run all >"$pipeline_log" 2>&1 &
pipeline_pid=$!
echo "--- pipeline started (log: $pipeline_log); waiting until it is ready"
for _ in $(seq 1 120); do
    if (exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3 && grep -q ' 200 ' <&3) 2>/dev/null; then
        break
    fi
    if ! kill -0 "$pipeline_pid" 2>/dev/null; then
        tail -20 "$pipeline_log" >&2
        echo "the pipeline exited" >&2
        exit 1
    fi
    sleep 0.5
done

# 50 events, ~30% re-sent ids; the receiver fails every 5th fresh request (retried 5 s later)
# and the always-down endpoint makes dead letters after its last attempt (+30 s).
"$bin" --config "$config" demo produce --count 50 --duplicate-rate 0.3 --rate 10 --watch || true

# `run all` prints the admin URL and a fresh dev token (loopback only) on its stdout.
admin_token=$(grep -o 'dev token (loopback only, new at every start): [^ ]*' "$pipeline_log" | awk '{print $NF}' | tail -1)
cat <<EOF

--- the demo keeps running
  dashboard:        http://127.0.0.1:8090/   (sign in with the token below)
  admin API:        curl -H "Authorization: Bearer $admin_token" http://127.0.0.1:8090/v1/dead-letters
  admin token:      $admin_token   (a dev token: new at every start, loopback only)
  receiver log:     tail -f $receiver_log   (fresh deliveries, duplicates, 503s then retries)
  pipeline log:     tail -f $pipeline_log
  more events:      $bin --config $config demo produce --watch [--count 100 --rate 20]
  Ctrl-C stops hookline and the receiver; the broker keeps running (deploy/local/kafka stop).
EOF

# `wait` returns early when a trapped signal arrives; wait again until both have exited.
status=0
while kill -0 "$pipeline_pid" 2>/dev/null; do
    status=0
    wait "$pipeline_pid" || status=$?
done
kill -TERM "$receiver_pid" 2>/dev/null || true
wait "$receiver_pid" 2>/dev/null || true
exit "$status"
