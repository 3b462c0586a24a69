#!/usr/bin/env bash
# Installs the packages the Node.js example consumers need (kafkajs and pg,
# pinned in examples/node/package.json and package-lock.json), outside the
# repository, and prints the folder to put in NODE_PATH on stdout.
#
# Usage:
#   NODE_PATH="$(scripts/node-env.sh)" PATH="$(scripts/python-env.sh):$PATH" \
#     chaos run examples/node/orders-node.toml
#   NODE_PATH="$(scripts/node-env.sh examples/libraries/pg-transactional-outbox)" \
#     chaos run examples/libraries/pg-transactional-outbox/orders-pto.toml
#
# With no argument it installs examples/node's packages into node-env; with
# an example folder (one holding a package.json and a package-lock.json,
# relative to the current directory or absolute) it installs that folder's
# into node-env-<the folder's name>, so each example keeps its own.
#
# The packages live at ${CHAOS_CACHE_DIR:-$HOME/.cache/chaos}/node-env, beside
# the Python venv. They are installed with `npm ci` from a copy of the
# package.json and the lock file only when those (or the node that installed
# them) changed since the last install, so a second call returns at once.
# The node_modules folder is the only line on stdout; progress and errors go
# to stderr.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${CHAOS_CACHE_DIR:-$HOME/.cache/chaos}"

log() { printf 'node-env: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ $# -eq 0 ]]; then
  EXAMPLE="$SCRIPT_DIR/../examples/node"
  ENV_DIR="$CACHE/node-env"
elif [[ $# -eq 1 ]]; then
  [[ -d "$1" ]] || die "no such folder: $1"
  EXAMPLE="$(cd "$1" && pwd)"
  ENV_DIR="$CACHE/node-env-$(basename "$EXAMPLE")"
else
  die "usage: scripts/node-env.sh [example folder]"
fi
STAMP="$ENV_DIR/.lock.sha256"

# A machine without Node.js gets Debian's, as root with apt-get: the
# examples are written for Node.js 20; kafkajs 2.2.4 and pg 8 also run on
# older ones, with a warning from npm about package.json's engines.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    log "installing nodejs and npm (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; } >&2 \
      || die "apt-get install nodejs npm failed"
  fi
fi
command -v node >/dev/null 2>&1 || die "node not found on PATH (install Node.js 20 or newer, e.g. Debian's nodejs and npm packages)"
command -v npm >/dev/null 2>&1 || die "npm not found on PATH (install npm, e.g. Debian's npm package)"
for f in package.json package-lock.json; do
  [[ -f "$EXAMPLE/$f" ]] || die "missing $EXAMPLE/$f"
done

# The stamp covers the manifest, the lock file and the node version, so a new
# node (whose packages might not fit it) also triggers a reinstall.
want="$( { cat "$EXAMPLE/package.json" "$EXAMPLE/package-lock.json"; node --version; } | sha256sum | cut -d' ' -f1)"

if [[ -d "$ENV_DIR/node_modules" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  printf '%s\n' "$ENV_DIR/node_modules"
  exit 0
fi

# Stale or half made: installed again from scratch (npm ci empties
# node_modules itself; the stamp goes first so that a failed install is
# never taken for a good one).
if [[ -e "$ENV_DIR" ]]; then
  log "refreshing $ENV_DIR"
  rm -f "$STAMP"
else
  log "creating $ENV_DIR"
fi
mkdir -p "$ENV_DIR"
cp "$EXAMPLE/package.json" "$EXAMPLE/package-lock.json" "$ENV_DIR/"
log "installing the locked packages with npm ci"
(cd "$ENV_DIR" && npm ci --no-audit --no-fund --loglevel=error) >&2 \
  || die "npm ci in $ENV_DIR failed (the registry unreachable, or a lock file out of step with package.json?)"
printf '%s\n' "$want" >"$STAMP"
log "ready"
printf '%s\n' "$ENV_DIR/node_modules"
