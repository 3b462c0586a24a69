#!/usr/bin/env bash
# The project's test command: brings PostgreSQL and Apache Kafka up if they
# are not already answering, then runs the whole test suite against them.
#
#   scripts/test.sh            # everything (unit + end-to-end on real services)
#   scripts/test.sh <filter>   # extra arguments go to `cargo test`
#
# Services: Docker Compose when a Docker engine answers, the native script
# (scripts/services.sh) otherwise. Installs what a fresh machine lacks.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'test: %s\n' "$*" >&2; }

# The Rust toolchain and a C toolchain (librdkafka and SQLite are built from source).
if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    log "cargo not found: install Rust from https://rustup.rs first"; exit 1
  fi
fi
missing=()
for tool in cc make perl; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing build tools: ${missing[*]}"
    apt-get update -qq && apt-get install -y -qq build-essential perl >/dev/null
  else
    log "missing build tools: ${missing[*]}"; exit 1
  fi
fi

# Headless Chromium: tests/e2e/html.rs renders the HTML report in it.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing chromium (the HTML report's browser test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    log "chromium not found: install Debian's chromium package (tests/e2e/html.rs needs it)"; exit 1
  fi
fi

# The suite's runs keep their schemas, as every run does (for reading after
# a failure), so the suite has a database of its own that it begins empty,
# as its broker begins empty: a day of suites in one database left 12 GB in
# 97,000 files, and PostgreSQL's crash recovery syncs every file before it
# answers. A DATABASE_URL given from outside is used as it is.
fresh_db=
if [ -z "${DATABASE_URL:-}" ]; then
  fresh_db=chaos_test
  export DATABASE_URL="postgres://chaos:chaos@127.0.0.1:5432/$fresh_db"
fi
export KAFKA_BROKERS="${KAFKA_BROKERS:-127.0.0.1:9092}"

log "making the Python examples' virtual environment (scripts/python-env.sh)"
bash scripts/python-env.sh >/dev/null

log "installing the Node.js example's packages (scripts/node-env.sh)"
bash scripts/node-env.sh >/dev/null

log "fetching the JUnit schema and xmllint (scripts/junit-schema.sh)"
bash scripts/junit-schema.sh >/dev/null

# The services start while the build runs: their installs and the JVM's
# start mostly wait, the build mostly computes. After the scripts above,
# so that no two apt-get runs meet on dpkg's lock.
svc_pid=
svc_log="$(mktemp)"
trap 'rm -f "$svc_log"' EXIT
if docker info >/dev/null 2>&1; then
  log "Docker engine found: docker compose up -d --wait"
  docker compose up -d --wait
else
  log "no Docker engine: starting the native services (scripts/services.sh up) while the build runs"
  # A broker this starts begins empty: old runs' topics only slow its start.
  CHAOS_KAFKA_FRESH=1 bash scripts/services.sh up >"$svc_log" 2>&1 &
  svc_pid=$!
fi

log "building"
cargo build --locked --all-targets

if [ -n "$svc_pid" ]; then
  if ! wait "$svc_pid"; then
    cat "$svc_log" >&2
    log "the services did not start (scripts/services.sh up, its output above)"; exit 1
  fi
  cat "$svc_log" >&2
fi
bash scripts/services.sh status || true

if [ -n "$fresh_db" ]; then
  if command -v psql >/dev/null 2>&1; then
    # A Debezium run that was killed leaves its replication slot, and a
    # database with a slot cannot be dropped: the slots go first.
    log "emptying the suite's database ($fresh_db): the last suite's runs (and replication slots) go"
    PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 "postgres://chaos:chaos@127.0.0.1:5432/postgres" \
      -c "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = '$fresh_db' AND active_pid IS NOT NULL" \
      -c "SELECT pg_sleep(0.5)" \
      -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '$fresh_db' AND NOT active" \
      -c "DROP DATABASE IF EXISTS $fresh_db WITH (FORCE)" -c "CREATE DATABASE $fresh_db OWNER chaos"
  else
    log "psql not found: the suite uses the database chaos as it is"
    export DATABASE_URL="postgres://chaos:chaos@127.0.0.1:5432/chaos"
  fi
fi

log "running the test suite against PostgreSQL at ${DATABASE_URL##*@} and Kafka ($KAFKA_BROKERS)"
cargo test --locked "$@"
