# The two commands of the README.
.PHONY: run test kafka-start kafka-stop

run:   ## local Kafka + the whole pipeline in one process
	bash scripts/run-local.sh

test:  ## fmt, clippy, unit and integration tests against a real local Kafka
	bash scripts/test.sh

kafka-start:
	deploy/local/kafka start

kafka-stop:
	deploy/local/kafka stop
