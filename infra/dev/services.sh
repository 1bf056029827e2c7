#!/usr/bin/env bash
# The services the tests and a developer's gateway can use beside the embedded defaults: PostgreSQL
# (Debian's package, local TCP trusted) and Apache Kafka (one KRaft node, broker and controller,
# resolved from Maven Central), and a Python virtual environment from PyPI with the `openai` client the
# researchers' end-to-end test drives and the `safetensors` and `numpy` the harvest page's example uses. Idempotent: a service already answering is used as it is.
#
#   infra/dev/services.sh [start]    install what is missing, start both, wait until each answers,
#                                    print DATABASE_URL=..., KAFKA_BROKERS=... and SVC_PYTHON=...
#                                    (eval-able lines)
#   infra/dev/services.sh env        print those lines for the services that answer now
#   infra/dev/services.sh stop       stop Kafka, keeping its data: start runs it again on the same
#                                    topics and groups (PostgreSQL is the machine's: pg_ctlcluster stops it)
#   infra/dev/services.sh wipe       stop Kafka and delete its data (the jars stay cached)
#   infra/dev/services.sh status     one line per service
#
# Skip a part with --no-postgres / --no-kafka / --no-python (or SVC_SERVICES_SKIP=postgres,kafka,python).
# Settings (environment): PYTHON_OPENAI_VERSION, PYTHON_SAFETENSORS_VERSION, PYTHON_NUMPY_VERSION (the
# pinned versions), PGPORT (5432), KAFKA_VERSION (the pom's), KAFKA_PORT (9092),
# KAFKA_CONTROLLER_PORT (9093), KAFKA_HEAP (512m), SVC_SERVICES_HOME ($XDG_CACHE_HOME or
# ~/.cache, then /svc-services): the broker's jars, data and log live there, outside the checkout;
# KAFKA_DATA_DIR (SVC_SERVICES_HOME/kafka-data-KAFKA_PORT): the broker's data, log and pid file
# elsewhere (a test's private broker), the jars still shared.
# Everything it says goes to stderr; stdout carries only the VAR=value lines.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
pg_port="${PGPORT:-5432}"
kafka_port="${KAFKA_PORT:-9092}"
controller_port="${KAFKA_CONTROLLER_PORT:-9093}"
kafka_heap="${KAFKA_HEAP:-512m}"
home="${SVC_SERVICES_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/svc-services}"
kafka_version="${KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")}"
kafka_home="$home/kafka-$kafka_version"
kafka_data="${KAFKA_DATA_DIR:-$home/kafka-data-$kafka_port}"

say() { echo "services: $*" >&2; }
die() { say "$*"; exit 1; }

command_name="start"
skip=",${SVC_SERVICES_SKIP:-},"
for arg in "$@"; do
  case "$arg" in
    start | env | stop | wipe | status) command_name="$arg" ;;
    --no-postgres) skip="$skip,postgres," ;;
    --no-kafka) skip="$skip,kafka," ;;
    --no-python) skip="$skip,python," ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument '$arg' (start, env, stop, wipe, status, --no-postgres, --no-kafka)" ;;
  esac
done
wanted() { [[ "$skip" != *",$1,"* ]]; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else die "'$*' needs root"; fi; }
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }

# --- PostgreSQL ---------------------------------------------------------------------------------------

pg_url="postgres://postgres@127.0.0.1:${pg_port}/postgres"
pg_answers() { command -v pg_isready >/dev/null && pg_isready -h 127.0.0.1 -p "$pg_port" -q; }

postgres_start() {
  if pg_answers; then
    say "PostgreSQL answers on 127.0.0.1:$pg_port: used as it is"
    return
  fi
  if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    say "installing Debian's postgresql"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  fi
  local version
  version="$(ls /etc/postgresql | sort -V | tail -n 1)"
  local conf="/etc/postgresql/$version/main"
  [ -d "$conf" ] || as_root pg_createcluster "$version" main >&2
  # Local TCP connections are trusted: this is a development and test database on the loopback only
  # (listen_addresses stays localhost). The lines go first so they win over the packaged scram rules.
  if ! grep -q '# svc-services' "$conf/pg_hba.conf"; then
    say "trusting local TCP connections in $conf/pg_hba.conf"
    as_root sed -i '1i host all all 127.0.0.1/32 trust # svc-services\nhost all all ::1/128 trust # svc-services' "$conf/pg_hba.conf"
  fi
  as_root sed -i "s/^#\?port = .*/port = $pg_port/" "$conf/postgresql.conf"
  # The suite opens many short-lived stores across its processes.
  as_root sed -i "s/^#\?max_connections = .*/max_connections = 300/" "$conf/postgresql.conf"
  say "starting PostgreSQL $version"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || as_root pg_ctlcluster --skip-systemctl-redirect "$version" main reload >&2
  for _ in $(seq 1 60); do pg_answers && break; sleep 0.5; done
  pg_answers || die "PostgreSQL did not answer on 127.0.0.1:$pg_port within 30 s (/var/log/postgresql/)"
  psql "$pg_url" -qAtc 'select 1' >/dev/null || die "PostgreSQL answers but refuses postgres@127.0.0.1 without a password (pg_hba.conf)"
}

# --- Apache Kafka -------------------------------------------------------------------------------------

kafka_pid_file="$kafka_data/kafka.pid"
kafka_pid() { [ -f "$kafka_pid_file" ] && kill -0 "$(cat "$kafka_pid_file")" 2>/dev/null && cat "$kafka_pid_file"; }
kafka_listening() { (exec 3<>"/dev/tcp/127.0.0.1/$kafka_port") 2>/dev/null; }
java_tool() { java -Xmx256m -Dlog4j2.configurationFile="$kafka_home/log4j2-tools.yaml" -cp "$kafka_home/libs/*" "$@"; }
# A client can create a topic: the broker has joined its quorum and serves metadata.
kafka_ready() {
  java_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$kafka_port" \
    --create --if-not-exists --topic svc.services.ready --partitions 1 --replication-factor 1 >/dev/null 2>&1
}

kafka_install() {
  # The cache is good for this version and this pom (a changed pom resolves again).
  local stamp
  stamp="$(sha256sum "$here/pom.xml" | cut -c1-16)"
  [ "$(cat "$kafka_home/libs/.complete" 2>/dev/null)" = "$stamp" ] && return
  command -v java >/dev/null || die "Java 17 or later is needed for Kafka (apt-get install openjdk-17-jre-headless)"
  command -v mvn >/dev/null || die "Maven is needed to resolve Kafka's jars from Maven Central (apt-get install maven)"
  say "resolving Apache Kafka $kafka_version from Maven Central into $kafka_home/libs"
  mkdir -p "$kafka_home"
  rm -rf "$kafka_home/libs"
  mvn -q -B -f "$here/pom.xml" -Dkafka.version="$kafka_version" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$kafka_home/libs" >&2
  echo "$stamp" >"$kafka_home/libs/.complete"
}

kafka_configure() {
  mkdir -p "$kafka_data"
  cat >"$kafka_home/log4j2-tools.yaml" <<'YAML'
Configuration:
  Appenders:
    Console: { name: STDERR, target: SYSTEM_ERR, PatternLayout: { pattern: "%d %p %m%n" } }
  Loggers:
    Root: { level: WARN, AppenderRef: [{ ref: STDERR }] }
YAML
  cat >"$kafka_data/log4j2.yaml" <<YAML
Configuration:
  Appenders:
    File: { name: FILE, fileName: "$kafka_data/server.log", PatternLayout: { pattern: "[%d] %p %m (%c)%n" } }
  Loggers:
    Root: { level: INFO, AppenderRef: [{ ref: FILE }] }
    Logger:
      - { name: kafka, level: INFO }
      - { name: org.apache.kafka, level: INFO }
YAML
  # One node, broker and controller on the loopback. The group settings make a new consumer group's
  # first join immediate (Kafka's sample server.properties does the same) and the internal topics fit
  # one node.
  cat >"$kafka_data/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$kafka_port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$kafka_port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$kafka_data/logs
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
auto.create.topics.enable=false
delete.topic.enable=true
log.retention.hours=24
PROPS
}

kafka_start() {
  if kafka_listening; then
    if [ -z "$(kafka_pid)" ]; then
      say "something listens on 127.0.0.1:$kafka_port: used as a Kafka broker as it is"
      return
    fi
  else
    kafka_install
    kafka_configure
    if [ ! -f "$kafka_data/logs/meta.properties" ]; then
      say "formatting Kafka's storage in $kafka_data/logs"
      java_tool kafka.tools.StorageTool format --ignore-formatted -t "$(java_tool kafka.tools.StorageTool random-uuid)" \
        -c "$kafka_data/server.properties" >&2
    fi
    say "starting Apache Kafka $kafka_version on 127.0.0.1:$kafka_port (heap $kafka_heap, log $kafka_data/server.log)"
    # setsid: the broker outlives this script and the shell that ran it (stop it with 'stop').
    setsid java -Xms"$kafka_heap" -Xmx"$kafka_heap" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
      -Dlog4j2.configurationFile="$kafka_data/log4j2.yaml" -Dkafka.logs.dir="$kafka_data" \
      -cp "$kafka_home/libs/*" kafka.Kafka "$kafka_data/server.properties" \
      >"$kafka_data/stdout.log" 2>&1 </dev/null &
    echo $! >"$kafka_pid_file"
  fi
  for _ in $(seq 1 90); do
    if kafka_listening && kafka_ready; then
      say "Kafka answers on 127.0.0.1:$kafka_port"
      return
    fi
    if [ -f "$kafka_pid_file" ] && [ -z "$(kafka_pid)" ]; then
      tail -n 30 "$kafka_data/stdout.log" "$kafka_data/server.log" >&2 2>/dev/null || true
      die "Kafka exited while starting (above: the end of its logs)"
    fi
    sleep 1
  done
  die "Kafka did not create a topic within 90 s ($kafka_data/server.log)"
}

kafka_stop() {
  local pid
  pid="$(kafka_pid || true)"
  if [ -z "$pid" ]; then
    say "Kafka (ours) is not running"
    return
  fi
  say "stopping Kafka (pid $pid)"
  kill "$pid"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
  rm -f "$kafka_pid_file"
}

# --- Python: the openai client, safetensors and NumPy ------------------------------------------------

# Pinned so a run is repeatable; test/api/openai-python.test.ts drives the gateway with openai, and
# test/docs/harvest-in-python.test.ts runs docs/harvest-in-python.md's Python (safetensors, NumPy).
# The venv is named by its package set: a changed set is a new venv, never one half upgraded.
python_openai_version="${PYTHON_OPENAI_VERSION:-3.63.0}"
python_safetensors_version="${PYTHON_SAFETENSORS_VERSION:-0.7.0}"
python_numpy_version="${PYTHON_NUMPY_VERSION:-2.3.5}"
venv="$home/python-openai-$python_openai_version-safetensors-$python_safetensors_version-numpy-$python_numpy_version"
python_ready() { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import openai, safetensors.numpy, numpy' 2>/dev/null; }

python_start() {
  if python_ready; then return; fi
  command -v python3 >/dev/null || die "python3 is needed for the Python tests (or skip them: --no-python)"
  say "installing openai $python_openai_version, safetensors $python_safetensors_version and numpy $python_numpy_version from PyPI into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" >&2 || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "openai==$python_openai_version" "safetensors==$python_safetensors_version" "numpy==$python_numpy_version" >&2
  python_ready || die "openai, safetensors or numpy does not import from $venv"
}

# --- commands -----------------------------------------------------------------------------------------

print_env() {
  if wanted postgres && pg_answers; then echo "DATABASE_URL=$pg_url"; fi
  if wanted kafka && kafka_listening; then echo "KAFKA_BROKERS=127.0.0.1:$kafka_port"; fi
  if wanted python && python_ready; then echo "SVC_PYTHON=$venv/bin/python"; fi
}

case "$command_name" in
  start)
    started=$SECONDS
    if wanted postgres; then postgres_start; fi
    if wanted kafka; then kafka_start; fi
    if wanted python; then python_start; fi
    say "ready in $((SECONDS - started)) s"
    print_env
    ;;
  env) print_env ;;
  stop) kafka_stop ;;
  wipe)
    kafka_stop
    say "deleting $kafka_data"
    rm -rf "$kafka_data"
    ;;
  status)
    if pg_answers; then say "postgres: answers on 127.0.0.1:$pg_port"; else say "postgres: not answering on 127.0.0.1:$pg_port"; fi
    if kafka_listening; then say "kafka: listening on 127.0.0.1:$kafka_port"; else say "kafka: not listening on 127.0.0.1:$kafka_port"; fi
    if python_ready; then say "python: $venv/bin/python imports openai, safetensors and numpy"; else say "python: not installed in $venv"; fi
    ;;
esac
