#!/usr/bin/env bash
# Runs hookline locally (`make run`): a local Kafka broker, the topics, every stage in one process
# with config/local.toml (log in target/demo-pipeline.log), a reference webhook receiver
# (`hookline receiver`, log in target/demo-receiver.log) and a demo producer showing a live
# progress view, then a summary with commands to try. Ctrl-C stops hookline and the receiver
# gracefully; the broker keeps running (`deploy/local/kafka stop` stops it).
# HOOKLINE_DEMO=0: only the pipeline, in the foreground (no receiver, no demo events).
# Endpoint secrets are sealed at rest on `webhooks.endpoints` with HOOKLINE_SECRETS_KEY: the demo's
# key is made once into target/demo-secrets.key (mode 600) and every hookline process started here
# gets it, so what one run sealed the next one opens (`cargo clean` loses it:
# docs/getting-started.md "Demo").
set -euo pipefail
cd "$(dirname "$0")/.."
config=${HOOKLINE_CONFIG:-config/local.toml}
demo=${HOOKLINE_DEMO:-1}
# Not a configuration override: keep it away from hookline's `HOOKLINE_…` env parsing.
unset HOOKLINE_DEMO

# The local stack's endpoint secrets key: made once, then the same at every run (a key that changes
# leaves endpoints added through the API unreadable, i.e. disabled). From the file only, never
# from the caller's environment, so a stray HOOKLINE_SECRETS_KEY cannot change it.
key_file=target/demo-secrets.key
if [ ! -s "$key_file" ]; then
    mkdir -p target
    # base64 of 32 random bytes (`openssl rand -base64 32`; coreutils where openssl is missing).
    (umask 077 && { openssl rand -base64 32 2>/dev/null || head -c 32 /dev/urandom | base64 -w0; } \
        >"$key_file.tmp" && mv "$key_file.tmp" "$key_file")
    echo "--- made the demo's endpoint secrets key: $key_file"
fi
chmod 600 "$key_file"
HOOKLINE_SECRETS_KEY=$(cat "$key_file")
export HOOKLINE_SECRETS_KEY
# Decrypt-only keys are for a rotation in a real installation, not for the demo.
unset HOOKLINE_SECRETS_OLD_KEYS

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

# The receiver stands for someone else's server: it knows its endpoint secret, never our key.
env -u HOOKLINE_SECRETS_KEY "$bin" receiver --listen 127.0.0.1:8080 --secret "$secret" --fail-every 5 >"$receiver_log" 2>&1 &
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
  endpoints:        HOOKLINE_SECRETS_KEY=\$(cat $key_file) $bin --config $config endpoints list
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
