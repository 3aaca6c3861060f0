# The commands of the README.
.PHONY: run test test-containers test-faults bench bench-endpoints kafka-start kafka-stop

run:   ## local Kafka + the whole pipeline in one process
	bash scripts/run-local.sh

test:  ## fmt, clippy, unit and integration tests against a real local Kafka, deploy checks, container tests
	bash scripts/test.sh

test-containers: ## the image built (hookline:local) and the Compose stack run, killed, scaled (needs Docker)
	bash scripts/test-containers.sh

test-faults: ## brokers killed under load on a local three-broker cluster, ledger checked; HOOKLINE_TEST_FAULT_ROUNDS=10 for the long variant
	bash scripts/test-faults.sh

bench: ## end-to-end benchmark against the local Kafka (release build); BENCH_ARGS="--events 20000" etc.
	deploy/local/kafka start
	cargo build --release --bin hookline
	cargo run --release -p hookline-bench -- $(BENCH_ARGS)

bench-endpoints: ## the many-endpoints phase alone: ENDPOINTS (100000) over ENDPOINTS/10 tenants, RSS per pod, ready time, fan-out, creates
	deploy/local/kafka start
	cargo build --release --bin hookline
	cargo run --release -p hookline-bench -- --endpoints $(or $(ENDPOINTS),100000) --endpoints-only $(BENCH_ARGS)

kafka-start:
	deploy/local/kafka start

kafka-stop:
	deploy/local/kafka stop
