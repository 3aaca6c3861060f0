#!/usr/bin/env bash
# /opt/kafka/bin/kafka-run-class.sh of the image built by deploy/docker/kafka/build: runs a Kafka
# class on /opt/kafka/libs/* with the JVM flags from the same variables as the release's script
# (KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_GC_LOG_OPTS, KAFKA_JMX_OPTS,
# KAFKA_LOG4J_OPTS, KAFKA_OPTS). The release's tool scripts (kafka-topics.sh, ...) are symlinks
# to it; under such a name it runs that script's class.
#
#   kafka-run-class.sh CLASS [args]   |   kafka-topics.sh [args]   |   kafka-run-class.sh --tool-names
set -euo pipefail

# The release's bin/ scripts whose classes are in the image's jars (deploy/local/pom.xml).
declare -A tools=(
  [kafka-server-start.sh]=kafka.Kafka
  [kafka-storage.sh]=kafka.tools.StorageTool
  [kafka-configs.sh]=kafka.admin.ConfigCommand
  [kafka-dump-log.sh]=kafka.tools.DumpLogSegments
  [kafka-broker-api-versions.sh]=org.apache.kafka.tools.BrokerApiVersionsCommand
  [kafka-topics.sh]=org.apache.kafka.tools.TopicCommand
  [kafka-console-producer.sh]=org.apache.kafka.tools.ConsoleProducer
  [kafka-console-consumer.sh]=org.apache.kafka.tools.consumer.ConsoleConsumer
  [kafka-consumer-groups.sh]=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
  [kafka-get-offsets.sh]=org.apache.kafka.tools.GetOffsetShell
  [kafka-delete-records.sh]=org.apache.kafka.tools.DeleteRecordsCommand
  [kafka-log-dirs.sh]=org.apache.kafka.tools.LogDirsCommand
  [kafka-metadata-quorum.sh]=org.apache.kafka.tools.MetadataQuorumCommand
  [kafka-features.sh]=org.apache.kafka.tools.FeatureCommand
  [kafka-cluster.sh]=org.apache.kafka.tools.ClusterTool
  [kafka-acls.sh]=org.apache.kafka.tools.AclCommand
  [kafka-transactions.sh]=org.apache.kafka.tools.TransactionsCommand
  [kafka-leader-election.sh]=org.apache.kafka.tools.LeaderElectionCommand
  [kafka-reassign-partitions.sh]=org.apache.kafka.tools.reassign.ReassignPartitionsCommand
  [kafka-producer-perf-test.sh]=org.apache.kafka.tools.ProducerPerformance
  [kafka-consumer-perf-test.sh]=org.apache.kafka.tools.ConsumerPerformance
)

home=/opt/kafka
name=${0##*/}
case $name in
  kafka-run-class.sh)
    if [[ ${1:-} == --tool-names ]]; then
      printf '%s\n' "${!tools[@]}"
      exit 0
    fi
    (($# >= 1)) || { echo "usage: $name CLASS [args]" >&2; exit 2; }
    class=$1
    shift
    ;;
  *)
    class=${tools[$name]:-}
    [[ -n $class ]] || { echo "$name: not a tool of this image" >&2; exit 2; }
    ;;
esac

if [[ $class == kafka.Kafka ]]; then
  # The release defaults to -Xmx1G -Xms1G; a local stack needs less.
  : "${KAFKA_HEAP_OPTS:=-Xmx512m}"
  : "${KAFKA_LOG4J_OPTS:=-Dlog4j2.configurationFile=$home/config/log4j2.properties}"
  : "${KAFKA_JVM_PERFORMANCE_OPTS:=-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true}"
else
  : "${KAFKA_HEAP_OPTS:=-Xmx256M}"
  : "${KAFKA_LOG4J_OPTS:=-Dlog4j2.configurationFile=$home/config/tools-log4j2.properties}"
  # Tools live for seconds (the compose healthcheck runs one every 5 s): the client compiler
  # and the serial collector cost less CPU there than the release's G1 + C2 defaults.
  : "${KAFKA_JVM_PERFORMANCE_OPTS:=-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true}"
fi

# Unquoted in the release's script: each variable holds several flags.
read -r -a heap <<<"$KAFKA_HEAP_OPTS"
read -r -a perf <<<"$KAFKA_JVM_PERFORMANCE_OPTS"
read -r -a gc_log <<<"${KAFKA_GC_LOG_OPTS:-}"
read -r -a jmx <<<"${KAFKA_JMX_OPTS:-}"
read -r -a log4j <<<"$KAFKA_LOG4J_OPTS"
read -r -a opts <<<"${KAFKA_OPTS:-}"

exec "${JAVA_HOME:+$JAVA_HOME/bin/}java" "${heap[@]}" "${perf[@]}" "${gc_log[@]}" "${jmx[@]}" "${log4j[@]}" \
  -cp "${CLASSPATH:+$CLASSPATH:}$home/libs/*" "${opts[@]}" "$class" "$@"
