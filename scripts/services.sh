#!/usr/bin/env bash
# Brings up the services the chaos tests need, natively (no Docker), on 127.0.0.1 only:
#   - PostgreSQL 15 (Debian's package, cluster 15/main) on 127.0.0.1:5432,
#     role/password/database chaos/chaos/chaos;
#   - Apache Kafka 4.x, one KRaft broker+controller, on 127.0.0.1:9092 (controller on 9093),
#     its jars fetched from Maven Central with Maven into a cache outside the repository;
#   - Kafka Connect's runtime and Debezium's PostgreSQL connector (jars only: each Debezium run
#     starts its own worker, examples/debezium/connect.py), fetched the same way.
#
# Usage: scripts/services.sh up     [postgres|kafka]   start (idempotent; fast when already up)
#        scripts/services.sh down   [postgres|kafka]   stop
#        scripts/services.sh status [postgres|kafka]   one line per service; exit 0 iff all up
#        scripts/services.sh up|status connect         fetch (or check) Kafka Connect + Debezium's jars
#        scripts/services.sh up|down|status cluster    a second Kafka: three KRaft nodes (broker and controller
#                                                      each) on 127.0.0.1:29092, 29094, 29096, replication factor 3,
#                                                      min.insync.replicas 2; beside the single broker, never by default
#        scripts/services.sh pid kafka                 the broker's pid (what chaos's broker.pause
#                                                      and broker.kill signal; chaos finds it by its port)
#        scripts/services.sh restart-immediate postgres   pg_ctl restart -m immediate: no checkpoint,
#                                                      crash recovery on start (chaos's db.restart runs it)
#
# Environment:
#   CHAOS_CACHE_DIR        cache for Kafka jars, config, data and log (default ~/.cache/chaos)
#   CHAOS_KAFKA_VERSION    Kafka version to fetch (default 4.1.1; others tried if it fails)
#   CHAOS_KAFKA_HEAP       broker -Xmx (default 1g)
#   CHAOS_CLUSTER_HEAP     -Xmx of each of the cluster's three nodes (default 512m)
#   CHAOS_CONNECT_LIB      where Kafka Connect's and Debezium's jars go (default $CHAOS_CACHE_DIR/connect/lib)
#   CHAOS_KAFKA_FRESH      1: a broker this call starts begins empty (the old runs' topics go).
#                          scripts/test.sh sets it: thousands of old topics (4.2 GB measured) kept
#                          the broker loading for over 90 s. Unset, a restart keeps every topic.
#
# Progress goes to stderr, prefixed "services:"; status lines go to stdout.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${CHAOS_CACHE_DIR:-$HOME/.cache/chaos}"

PG_VERSION=15
PG_CLUSTER=main
PG_PORT=5432
PG_USER=chaos
PG_PASSWORD=chaos
PG_DB=chaos
PG_URL="postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB"

KAFKA_DIR="$CACHE/kafka"
KAFKA_LIB="$KAFKA_DIR/lib"
KAFKA_MARKER="$KAFKA_LIB/.complete"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_CONF="$KAFKA_DIR/server.properties"
KAFKA_LOG="$KAFKA_DIR/kafka.log"
KAFKA_PID="$KAFKA_DIR/kafka.pid"
KAFKA_POM="$SCRIPT_DIR/kafka/pom.xml"
KAFKA_VERSION="${CHAOS_KAFKA_VERSION:-4.1.1}"
KAFKA_FALLBACK_VERSIONS="4.1.0 4.0.1 4.0.0"
SLF4J_VERSION=2.0.16
KAFKA_PORT=9092
KAFKA_CONTROLLER_PORT=9093
KAFKA_HEAP="${CHAOS_KAFKA_HEAP:-1g}"
# Logged once by kafka.Kafka's KafkaRaftServer when the broker and controller are fully up.
KAFKA_READY_LINE="Kafka Server started"
KAFKA_READY_TIMEOUT_S=90
KAFKA_STOP_TIMEOUT_S=30
PG_READY_TIMEOUT_S=30
# How long pg_ctl waits for a starting server. A server that was not shut
# down cleanly recovers before it answers, which outlasted pg_ctl's default
# 60 s on a busy machine while it was still making progress.
PG_START_TIMEOUT_S=300

log() { printf 'services: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

now_ms() { date +%s%3N; }
elapsed_since() { # start_ms -> "12.3"
  local d=$(( $(now_ms) - $1 ))
  printf '%d.%d' $((d / 1000)) $(((d % 1000) / 100))
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_open() {
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

as_postgres() { # run a command as the postgres OS user, from a directory it can read
  (cd / && runuser -u postgres -- "$@")
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------------------

pg_cluster_line() { # "15 main 5432 online postgres ..." or nothing
  pg_lsclusters -h 2>/dev/null | awk -v v="$PG_VERSION" -v c="$PG_CLUSTER" '$1 == v && $2 == c'
}

pg_online() {
  command -v pg_lsclusters >/dev/null 2>&1 || return 1
  [[ "$(pg_cluster_line | awk '{print $4}')" == online* ]]
}

pg_install() {
  if ! command -v pg_ctlcluster >/dev/null 2>&1 || [[ ! -x /usr/lib/postgresql/$PG_VERSION/bin/postgres ]]; then
    log "installing postgresql-$PG_VERSION (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "postgresql-$PG_VERSION" >&2
  fi
  if [[ -z "$(pg_cluster_line)" ]]; then
    log "creating cluster $PG_VERSION/$PG_CLUSTER"
    pg_createcluster -p "$PG_PORT" "$PG_VERSION" "$PG_CLUSTER" >&2
  fi
  local port
  port="$(pg_cluster_line | awk '{print $3}')"
  [[ "$port" == "$PG_PORT" ]] || die "cluster $PG_VERSION/$PG_CLUSTER uses port $port, expected $PG_PORT"
}

# Bind to 127.0.0.1 only (Debian's default 'localhost' also binds ::1), and
# size memory and WAL for a million-payment run. Durability is untouched:
# synchronous_commit and fsync stay on. Returns 0 if changed.
pg_configure() {
  local confd="/etc/postgresql/$PG_VERSION/$PG_CLUSTER/conf.d"
  local conf="$confd/chaos.conf"
  # shared_buffers: Debian's 128 MB default is smaller than one run's
  # indexes, so every commit wrote back pages it would soon dirty again.
  # max_wal_size / checkpoint_timeout: the default 1 GB of WAL forced a
  # checkpoint (and full-page images after it) every few seconds of a bench.
  # commit_delay / commit_siblings: with three or more other transactions
  # open, a commit waits 200 us so that one WAL flush serves several (group
  # commit). Each commit still waits for its own flush. Bench scenario, six
  # interleaved pairs: median 22,188 events/s against 20,696 without.
  # max_connections: every run holds a pool per component process and the
  # fault proxy's lanes, about 20 connections; the suite runs up to six
  # runs at once (its power tests side by side, beside another test), and
  # Debian's 100 ran out ("sorry, too many clients already").
  # recovery_init_sync_method: a crash recovery (db.restart's immediate
  # stop, or a machine that stopped under the server) first syncs the data
  # directory, by default with one fsync per file. With a day of runs' schemas
  # (12 GB, 97,000 files) that took over 2 minutes on a cold, busy machine,
  # and 9.2 s warm; syncfs syncs the file system in one call: 2.7 s warm.
  # wal_level = logical: Debezium's connector reads the WAL through a
  # logical replication slot (pgoutput); each Debezium run has its own slot
  # and walsender, and a killed worker's slot lingers until dropped, so
  # there is room for a suite's worth of them.
  local want="# written by chaos scripts/services.sh
listen_addresses = '127.0.0.1'
max_connections = 300
shared_buffers = '1GB'
wal_buffers = '64MB'
max_wal_size = '8GB'
checkpoint_timeout = '30min'
commit_delay = 200
commit_siblings = 3
recovery_init_sync_method = syncfs
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32"
  mkdir -p "$confd"
  if [[ -f "$conf" && "$(cat "$conf")" == "$want" ]]; then
    return 1
  fi
  printf '%s\n' "$want" >"$conf"
  return 0
}

pg_wait_ready() {
  local deadline=$(( $(now_ms) + PG_READY_TIMEOUT_S * 1000 ))
  until pg_isready -q -h 127.0.0.1 -p "$PG_PORT"; do
    if (( $(now_ms) > deadline )); then
      log "postgres not ready after ${PG_READY_TIMEOUT_S}s; last lines of its log:"
      tail -n 30 "/var/log/postgresql/postgresql-$PG_VERSION-$PG_CLUSTER.log" >&2 || true
      return 1
    fi
    sleep 0.2
  done
}

# pg_ctlcluster start|restart [options], waiting up to PG_START_TIMEOUT_S
# for a server that recovers first. A server still starting when even
# that runs out is left to pg_wait_ready, not reported failed.
pg_start() {
  if ! PGCTLTIMEOUT="$PG_START_TIMEOUT_S" pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" "$@" >&2; then
    pg_online || die "postgres did not start (pg_ctlcluster $*); see /var/log/postgresql/postgresql-$PG_VERSION-$PG_CLUSTER.log"
  fi
}

pg_ensure_role_and_db() {
  as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$PG_PORT" -d postgres >/dev/null <<SQL
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE $PG_USER;
  END IF;
END
\$\$;
ALTER ROLE $PG_USER WITH LOGIN SUPERUSER PASSWORD '$PG_PASSWORD';
SELECT 'CREATE DATABASE $PG_DB OWNER $PG_USER'
  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PG_DB')
\gexec
SQL
}

postgres_up() {
  pg_install
  local changed=0
  pg_configure && changed=1
  if pg_online; then
    if (( changed )); then
      log "postgres: configuration changed, restarting cluster $PG_VERSION/$PG_CLUSTER"
      pg_start restart
    fi
  else
    log "postgres: starting cluster $PG_VERSION/$PG_CLUSTER (after an unclean stop it recovers first; up to ${PG_START_TIMEOUT_S}s)"
    pg_start start
  fi
  pg_wait_ready || die "postgres did not become ready"
  pg_ensure_role_and_db
  if ! PGCONNECT_TIMEOUT=5 psql -X -qAt "$PG_URL" -c 'select 1' >/dev/null; then
    die "password login failed: psql $PG_URL (check /etc/postgresql/$PG_VERSION/$PG_CLUSTER/pg_hba.conf)"
  fi
  log "postgres: up at 127.0.0.1:$PG_PORT ($PG_URL)"
}

postgres_down() {
  if pg_online; then
    log "postgres: stopping cluster $PG_VERSION/$PG_CLUSTER"
    pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" stop >&2
  else
    log "postgres: already down"
  fi
}

postgres_status() {
  if pg_online && pg_isready -q -h 127.0.0.1 -p "$PG_PORT"; then
    local ver
    ver="$(PGCONNECT_TIMEOUT=3 psql -X -qAt "$PG_URL" -c 'show server_version' 2>/dev/null | awk '{print $1}' || true)"
    printf 'postgres  up    127.0.0.1:%s  (cluster %s/%s%s)\n' "$PG_PORT" "$PG_VERSION" "$PG_CLUSTER" "${ver:+, PostgreSQL $ver}"
    return 0
  fi
  printf 'postgres  down\n'
  return 1
}

# ---------------------------------------------------------------------------------------------
# Kafka
# ---------------------------------------------------------------------------------------------

kafka_need_tools() {
  if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
    log "installing Java 17 and Maven (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq openjdk-17-jre-headless maven >&2
  fi
}

kafka_installed_version() { # version recorded in the marker, or nothing
  [[ -f "$KAFKA_MARKER" ]] && sed -n 's/^kafka=//p' "$KAFKA_MARKER"
  return 0
}

kafka_fetch() {
  local have
  have="$(kafka_installed_version)"
  if [[ -n "$have" ]] && grep -qx "slf4j=$SLF4J_VERSION" "$KAFKA_MARKER" \
     && ls "$KAFKA_LIB"/kafka_2.13-"$have".jar >/dev/null 2>&1; then
    if [[ "$have" == "$KAFKA_VERSION" || -z "${CHAOS_KAFKA_VERSION:-}" ]]; then
      return 0
    fi
  fi
  kafka_need_tools
  mkdir -p "$KAFKA_DIR"
  local v tmp="$KAFKA_DIR/lib.tmp" mvnlog="$KAFKA_DIR/mvn.log" t0
  for v in "$KAFKA_VERSION" $KAFKA_FALLBACK_VERSIONS; do
    log "kafka: fetching org.apache.kafka:kafka_2.13:$v + slf4j-simple:$SLF4J_VERSION from Maven Central"
    t0=$(now_ms)
    rm -rf "$tmp"
    if mvn -B -q -f "$KAFKA_POM" dependency:copy-dependencies \
         -Dkafka.version="$v" -Dslf4j.version="$SLF4J_VERSION" \
         -DoutputDirectory="$tmp" >"$mvnlog" 2>&1 \
       && [[ -f "$tmp/kafka_2.13-$v.jar" ]]; then
      rm -rf "$KAFKA_LIB"
      mv "$tmp" "$KAFKA_LIB"
      printf 'kafka=%s\nslf4j=%s\n' "$v" "$SLF4J_VERSION" >"$KAFKA_MARKER"
      log "kafka: fetched Kafka $v ($(ls "$KAFKA_LIB" | wc -l) jars) in $(elapsed_since "$t0")s"
      return 0
    fi
    log "kafka: fetching Kafka $v failed; last lines of $mvnlog:"
    tail -n 15 "$mvnlog" >&2 || true
  done
  rm -rf "$tmp"
  die "could not fetch any Kafka version ($KAFKA_VERSION $KAFKA_FALLBACK_VERSIONS)"
}

# The fault proxy's slots (src/proxy/kafka.rs: SLOTS, BROKER_BASE,
# ADVERTISED_BASE): listener SLOT<i> on 19200+i, advertised at 19100+i,
# where the proxy listens for slot i, so that a client that bootstraps
# through a slot is sent back to it for every connection.
KAFKA_PROXY_SLOTS=20
kafka_slot_listeners() { # $1: listen | advertise | map
  local i out=""
  for ((i = 0; i < KAFKA_PROXY_SLOTS; i++)); do
    case "$1" in
      listen) out+=",SLOT$i://127.0.0.1:$((19200 + i))" ;;
      advertise) out+=",SLOT$i://127.0.0.1:$((19100 + i))" ;;
      map) out+=",SLOT$i:PLAINTEXT" ;;
    esac
  done
  printf '%s' "$out"
}

# The three-node cluster (`up cluster`): node i's broker on 29092 + 2(i-1),
# its controller on the next port; each node has its own folder, and the
# kafka_* functions below act on whichever node the globals describe.
CLUSTER_DIR="$CACHE/kafka-cluster"
CLUSTER_NODES=3
cluster_node() { # $1: node 1..3; points the kafka_* globals at it
  KAFKA_NODE="$1"
  KAFKA_DIR="$CLUSTER_DIR/node$1"
  KAFKA_DATA="$KAFKA_DIR/data"
  KAFKA_CONF="$KAFKA_DIR/server.properties"
  KAFKA_LOG="$KAFKA_DIR/kafka.log"
  KAFKA_PID="$KAFKA_DIR/kafka.pid"
  KAFKA_PORT=$((29092 + 2 * ($1 - 1)))
  KAFKA_CONTROLLER_PORT=$((KAFKA_PORT + 1))
  KAFKA_HEAP="${CHAOS_CLUSTER_HEAP:-512m}"
  # Stopped together, the nodes lose their quorum and a controlled shutdown
  # hangs; the cluster's data is throwaway, so SIGKILL comes after 5 s.
  KAFKA_STOP_TIMEOUT_S=5
}

cluster_voters() {
  local i out=""
  for ((i = 1; i <= CLUSTER_NODES; i++)); do
    out+="${out:+,}$i@127.0.0.1:$((29093 + 2 * (i - 1)))"
  done
  printf '%s' "$out"
}

kafka_cluster_config() {
  cat <<EOF
# Generated by scripts/services.sh (chaos); rewritten on every 'up cluster'.
# Node $KAFKA_NODE of three KRaft nodes, each broker and controller, on 127.0.0.1 only.
process.roles=broker,controller
node.id=$KAFKA_NODE
controller.quorum.voters=$(cluster_voters)
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$KAFKA_DATA
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
auto.create.topics.enable=false
delete.topic.enable=true
# The controller fences a broker that stopped heartbeating after 2 s (not
# the default 9 s), so a killed leader's partitions move within seconds.
broker.session.timeout.ms=2000
broker.heartbeat.interval.ms=500
EOF
}

kafka_config() { # the broker's configuration, on stdout
  if [[ -n "${KAFKA_NODE:-}" ]]; then
    kafka_cluster_config
    return
  fi
  cat <<EOF
# Generated by scripts/services.sh (chaos); rewritten on every 'up'.
# One KRaft node that is both broker and controller, bound to 127.0.0.1 only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
# SLOT0.. are the fault proxy's: each advertised at the proxy's port.
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT$(kafka_slot_listeners listen)
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT$(kafka_slot_listeners advertise)
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT$(kafka_slot_listeners map)
inter.broker.listener.name=PLAINTEXT
log.dirs=$KAFKA_DATA
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
auto.create.topics.enable=false
delete.topic.enable=true
EOF
}

kafka_config_changed() { # the running broker's configuration is not what this script writes
  [[ -f "$KAFKA_CONF" ]] && ! cmp -s <(kafka_config) "$KAFKA_CONF"
}

kafka_write_config() {
  local tmp="$KAFKA_CONF.tmp"
  kafka_config >"$tmp"
  if [[ -f "$KAFKA_CONF" ]] && cmp -s "$tmp" "$KAFKA_CONF"; then
    rm -f "$tmp"
  else
    mv "$tmp" "$KAFKA_CONF"
  fi
}

kafka_java() { # run a class from the Kafka jars
  java -cp "$KAFKA_LIB/*" "$@"
}

kafka_format() {
  if [[ -f "$KAFKA_DATA/meta.properties" ]]; then
    return 0
  fi
  local cid
  if [[ -n "${KAFKA_NODE:-}" ]]; then
    # The cluster's nodes share one cluster id, made once.
    cid="$(cat "$CLUSTER_DIR/cluster.id")"
  else
    cid="$(kafka_java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
  fi
  [[ "$cid" =~ ^[A-Za-z0-9_-]{22}$ ]] || die "StorageTool random-uuid gave '$cid'"
  log "kafka: formatting $KAFKA_DATA (cluster id $cid)"
  mkdir -p "$KAFKA_DATA"
  kafka_java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn kafka.tools.StorageTool \
    format -t "$cid" -c "$KAFKA_CONF" >"$KAFKA_DIR/format.log" 2>&1 \
    || { cat "$KAFKA_DIR/format.log" >&2; die "kafka storage format failed"; }
}

# Pid of our broker if it is alive (pid file checked against the process's command line).
kafka_pid() {
  local pid
  [[ -f "$KAFKA_PID" ]] || return 1
  pid="$(cat "$KAFKA_PID" 2>/dev/null)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $KAFKA_CONF" || return 1
  echo "$pid"
}

kafka_tail_log() {
  log "last 30 lines of $KAFKA_LOG:"
  tail -n 30 "$KAFKA_LOG" >&2 || true
}

kafka_start_process() {
  : >"$KAFKA_LOG"
  # setsid: not in the caller's process group, so a Ctrl-C on a test run leaves it alone;
  # all three standard streams redirected, so a caller reading our output never waits on it.
  setsid nohup java "-Xmx$KAFKA_HEAP" -Xms256m -XX:+UseG1GC -Djava.awt.headless=true \
    -Dorg.slf4j.simpleLogger.defaultLogLevel=info \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    '-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss.SSS' \
    -Dorg.slf4j.simpleLogger.log.state.change.logger=warn \
    -Dorg.slf4j.simpleLogger.log.org.apache.kafka.common.config.AbstractConfig=warn \
    -cp "$KAFKA_LIB/*" kafka.Kafka "$KAFKA_CONF" </dev/null >>"$KAFKA_LOG" 2>&1 &
  echo $! >"$KAFKA_PID"
}

# 0 ready; 1 timed out; 2 the process died.
kafka_wait_ready() {
  local pid="$1" deadline=$(( $(now_ms) + KAFKA_READY_TIMEOUT_S * 1000 ))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      return 2
    fi
    if grep -qF "$KAFKA_READY_LINE" "$KAFKA_LOG" 2>/dev/null && port_open "$KAFKA_PORT"; then
      return 0
    fi
    if (( $(now_ms) > deadline )); then
      return 1
    fi
    sleep 0.5
  done
}

kafka_up() {
  local pid
  if pid="$(kafka_pid)" && port_open "$KAFKA_PORT" && kafka_config_changed; then
    # A broker started by an older version of this script: the fault
    # proxy's listeners may be missing.
    log "kafka: running (pid $pid) with another configuration than this script writes; restarting it"
    kafka_down
  fi
  if pid="$(kafka_pid)"; then
    if port_open "$KAFKA_PORT"; then
      log "kafka: already up (pid $pid)"
      return 0
    fi
    log "kafka: pid $pid alive but port $KAFKA_PORT not open yet; waiting"
    if kafka_wait_ready "$pid"; then
      log "kafka: up at 127.0.0.1:$KAFKA_PORT (pid $pid)"
      return 0
    fi
    kafka_tail_log
    die "kafka (pid $pid) did not become ready; try: $0 down kafka && $0 up kafka"
  fi
  rm -f "$KAFKA_PID"
  local p
  for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
    if port_open "$p"; then
      die "port 127.0.0.1:$p is in use by another process (not our broker: no live pid in $KAFKA_PID)"
    fi
  done

  kafka_fetch
  mkdir -p "$KAFKA_DIR"
  kafka_write_config
  if [[ "${CHAOS_KAFKA_FRESH:-0}" == 1 && -d "$KAFKA_DATA" ]]; then
    log "kafka: starting empty (CHAOS_KAFKA_FRESH=1: the old runs' topics in $KAFKA_DATA go)"
    rm -rf "$KAFKA_DATA"
  fi
  local attempt rc
  for attempt in 1 2; do
    kafka_format
    log "kafka: starting broker (Kafka $(kafka_installed_version), KRaft)"
    kafka_start_process
    pid="$(cat "$KAFKA_PID")"
    rc=0
    kafka_wait_ready "$pid" || rc=$?
    if (( rc == 0 )); then
      log "kafka: up at 127.0.0.1:$KAFKA_PORT (pid $pid)"
      return 0
    fi
    if (( rc == 1 )); then
      kafka_tail_log
      kafka_stop_pid "$pid"
      rm -f "$KAFKA_PID"
      die "kafka did not become ready within ${KAFKA_READY_TIMEOUT_S}s"
    fi
    # The process died during startup.
    rm -f "$KAFKA_PID"
    kafka_tail_log
    if (( attempt == 1 )) && [[ -d "$KAFKA_DATA" ]]; then
      log "kafka: broker exited during startup; wiping $KAFKA_DATA and reformatting once"
      rm -rf "$KAFKA_DATA"
      continue
    fi
    die "kafka broker exited during startup"
  done
}

kafka_stop_pid() {
  local pid="$1" deadline=$(( $(now_ms) + KAFKA_STOP_TIMEOUT_S * 1000 ))
  kill -TERM "$pid" 2>/dev/null || return 0
  while kill -0 "$pid" 2>/dev/null; do
    if (( $(now_ms) > deadline )); then
      log "kafka: pid $pid still alive after ${KAFKA_STOP_TIMEOUT_S}s; kill -9"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
      break
    fi
    sleep 0.2
  done
}

kafka_down() {
  local pid t0
  if pid="$(kafka_pid)"; then
    t0=$(now_ms)
    log "kafka: stopping pid $pid"
    kafka_stop_pid "$pid"
    log "kafka: stopped in $(elapsed_since "$t0")s"
  else
    log "kafka: already down"
  fi
  rm -f "$KAFKA_PID"
}

kafka_status() {
  local pid
  if pid="$(kafka_pid)" && port_open "$KAFKA_PORT"; then
    printf 'kafka     up    127.0.0.1:%s  pid %s  (Apache Kafka %s, KRaft)\n' \
      "$KAFKA_PORT" "$pid" "$(kafka_installed_version)"
    return 0
  fi
  if [[ -n "${pid:-}" ]]; then
    printf 'kafka     starting  pid %s (port %s not open yet)\n' "$pid" "$KAFKA_PORT"
  else
    printf 'kafka     down\n'
  fi
  return 1
}

# ---------------------------------------------------------------------------------------------
# Kafka Connect + Debezium (jars only)
# ---------------------------------------------------------------------------------------------

CONNECT_LIB="${CHAOS_CONNECT_LIB:-$CACHE/connect/lib}"
CONNECT_POM="$SCRIPT_DIR/connect/pom.xml"
CONNECT_MARKER="$CONNECT_LIB/.complete"
DEBEZIUM_VERSION=3.6.1.Final

connect_up() {
  if [[ -f "$CONNECT_MARKER" ]] && grep -qx "kafka=$KAFKA_VERSION debezium=$DEBEZIUM_VERSION" "$CONNECT_MARKER"; then
    return 0
  fi
  kafka_need_tools
  local tmp="$CONNECT_LIB.tmp" mvnlog t0
  mvnlog="$(dirname "$CONNECT_LIB")/mvn.log"
  mkdir -p "$(dirname "$CONNECT_LIB")"
  log "connect: fetching connect-runtime:$KAFKA_VERSION + debezium-connector-postgres:$DEBEZIUM_VERSION from Maven Central"
  t0=$(now_ms)
  rm -rf "$tmp"
  if ! mvn -B -q -f "$CONNECT_POM" dependency:copy-dependencies \
       -Dkafka.version="$KAFKA_VERSION" -Ddebezium.version="$DEBEZIUM_VERSION" -Dslf4j.version="$SLF4J_VERSION" \
       -DoutputDirectory="$tmp" >"$mvnlog" 2>&1 \
     || [[ ! -f "$tmp/connect-runtime-$KAFKA_VERSION.jar" || ! -f "$tmp/debezium-connector-postgres-$DEBEZIUM_VERSION.jar" ]]; then
    tail -n 15 "$mvnlog" >&2 || true
    rm -rf "$tmp"
    die "could not fetch Kafka Connect $KAFKA_VERSION with Debezium $DEBEZIUM_VERSION (log: $mvnlog)"
  fi
  rm -rf "$CONNECT_LIB"
  mv "$tmp" "$CONNECT_LIB"
  printf 'kafka=%s debezium=%s\n' "$KAFKA_VERSION" "$DEBEZIUM_VERSION" >"$CONNECT_MARKER"
  log "connect: fetched $(ls "$CONNECT_LIB" | wc -l) jars into $CONNECT_LIB in $(elapsed_since "$t0")s"
}

# Nothing runs between runs: each Debezium run's worker dies with the run.
connect_down() { :; }

connect_status() {
  if [[ -f "$CONNECT_MARKER" ]]; then
    printf 'connect   ready %s  (%s)\n' "$CONNECT_LIB" "$(cat "$CONNECT_MARKER")"
    return 0
  fi
  printf 'connect   missing (scripts/services.sh up connect fetches it)\n'
  return 1
}

# ---------------------------------------------------------------------------------------------

usage() {
  sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

services_of() { # $1: optional service name; prints the services it names, or fails
  case "${1:-all}" in
    all) echo "postgres kafka connect" ;;
    postgres|pg) echo postgres ;;
    kafka) echo kafka ;;
    connect) echo connect ;;
    cluster) echo cluster ;;
    *) return 1 ;;
  esac
}

# The three nodes start together: none is ready before a quorum of
# controllers is up.
cluster_up() {
  kafka_fetch
  mkdir -p "$CLUSTER_DIR"
  if [[ ! -f "$CLUSTER_DIR/cluster.id" ]]; then
    kafka_java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn kafka.tools.StorageTool random-uuid 2>/dev/null \
      | tail -n 1 >"$CLUSTER_DIR/cluster.id"
    [[ "$(cat "$CLUSTER_DIR/cluster.id")" =~ ^[A-Za-z0-9_-]{22}$ ]] || die "StorageTool random-uuid failed"
  fi
  local i pids=() rc=0
  for ((i = 1; i <= CLUSTER_NODES; i++)); do
    ( cluster_node "$i"; kafka_up 2>&1 | sed "s/^services: kafka:/services: cluster node $i:/" >&2 ) &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  (( rc == 0 )) || die "the cluster did not come up (logs in $CLUSTER_DIR/node*/kafka.log)"
  log "cluster: up at 127.0.0.1:29092,127.0.0.1:29094,127.0.0.1:29096"
}

cluster_down() {
  local i
  for ((i = 1; i <= CLUSTER_NODES; i++)); do ( cluster_node "$i"; kafka_down ) & done
  wait
}

cluster_status() {
  local i rc=0
  for ((i = 1; i <= CLUSTER_NODES; i++)); do
    ( cluster_node "$i"; kafka_status | sed "s/^kafka    /node $i   /" ) || rc=1
  done
  return "$rc"
}

main() {
  local cmd="${1:-}" services s t0 rc=0
  if ! services="$(services_of "${2:-}")" || (( $# > 2 )); then
    log "unknown service '${2:-}' (postgres|kafka|connect|cluster)"
    usage
  fi
  case "$cmd" in
    up)
      t0=$(now_ms)
      for s in $services; do "${s}_up"; done
      log "up in $(elapsed_since "$t0")s"
      ;;
    down)
      for s in $services; do "${s}_down"; done
      ;;
    status)
      for s in $services; do "${s}_status" || rc=1; done
      return "$rc"
      ;;
    pid)
      [[ "${2:-}" == kafka ]] || usage
      kafka_pid || { log "kafka: not running"; return 1; }
      ;;
    restart-immediate)
      [[ "${2:-}" == postgres || "${2:-}" == pg ]] || usage
      # Every backend is killed without a checkpoint; the server recovers
      # from its WAL on the way up, as after a crash. On a busy machine that
      # recovery outlasted pg_ctl's 60 s wait ("server did not start in
      # time") while the server was still coming up: pg_ctl waits longer,
      # and a server still starting is waited for, not reported failed.
      pg_start restart -m immediate
      pg_wait_ready || die "postgres did not become ready after restart -m immediate"
      ;;
    -h|--help|help) usage ;;
    *) usage ;;
  esac
}

main "$@"
