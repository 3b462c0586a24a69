#!/usr/bin/env bash
# Creates (or refreshes) the virtual environment the Python example consumers
# run in, outside the repository, and prints its bin directory on stdout.
#
# Usage:
#   PATH="$(scripts/python-env.sh):$PATH" chaos run examples/python/consumer.toml
#   PATH="$(scripts/python-env.sh examples/libraries/faststream-outbox):$PATH" \
#     chaos run examples/libraries/faststream-outbox/orders-fso.toml
#
# With an example folder (one holding a requirements.txt, relative to the
# current directory or absolute) it installs that folder's requirements into
# python-venv-<the folder's name> instead, so each example keeps its own.
#
# The venv lives at ${CHAOS_CACHE_DIR:-$HOME/.cache/chaos}/python-venv. The
# packages of examples/python/requirements.txt are installed with pip only
# when the requirements (or the python3 that made the venv) changed since the
# last install, so a second call returns at once. The bin directory is the
# only line on stdout; progress and errors go to stderr.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${CHAOS_CACHE_DIR:-$HOME/.cache/chaos}"

log() { printf 'python-env: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ $# -eq 0 ]]; then
  REQUIREMENTS="$SCRIPT_DIR/../examples/python/requirements.txt"
  VENV="$CACHE/python-venv"
elif [[ $# -eq 1 ]]; then
  [[ -d "$1" ]] || die "no such folder: $1"
  REQUIREMENTS="$(cd "$1" && pwd)/requirements.txt"
  VENV="$CACHE/python-venv-$(basename "$(cd "$1" && pwd)")"
else
  die "usage: scripts/python-env.sh [example folder]"
fi
STAMP="$VENV/.requirements.sha256"

command -v python3 >/dev/null 2>&1 || die "python3 not found on PATH (install Python 3.9 or newer with its venv module)"
[[ -f "$REQUIREMENTS" ]] || die "missing $REQUIREMENTS"

# The stamp covers the requirements and the interpreter, so a new python3
# (whose venv would be stale) also triggers a rebuild.
want="$( { cat "$REQUIREMENTS"; python3 -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  printf '%s\n' "$VENV/bin"
  exit 0
fi

# A venv from another interpreter, or a half-made one, is rebuilt from scratch.
if [[ -e "$VENV" ]]; then
  log "refreshing $VENV"
  rm -rf "$VENV"
else
  log "creating $VENV"
fi
mkdir -p "$CACHE"
# Debian splits the venv module's pip bootstrap into its own package.
if ! python3 -c 'import ensurepip' >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
  log "installing python3-venv with apt"
  { apt-get update -qq && apt-get install -y -qq python3-venv; } >&2 || die "apt-get install python3-venv failed"
fi
python3 -m venv "$VENV" >&2 || die "python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)"
log "installing $(grep -cv -e '^#' -e '^$' "$REQUIREMENTS") pinned packages"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS" >&2 \
  || die "pip install -r $REQUIREMENTS failed"
printf '%s\n' "$want" >"$STAMP"
log "ready"
printf '%s\n' "$VENV/bin"
