#!/usr/bin/env bash
# Fetches the JUnit XML schema CI systems read, and makes sure xmllint is
# there to check a file against it; prints the schema's path on stdout.
#
# Usage:
#   xmllint --noout --schema "$(scripts/junit-schema.sh)" junit.xml
#
# The schema is junit-10.xsd, the one Jenkins' xUnit plugin validates
# against (the strictest of the common readers). It is not kept in the
# repository: it ships inside pytest's source distribution (pinned below),
# which pip downloads from PyPI once into
# ${CHAOS_CACHE_DIR:-$HOME/.cache/chaos}/junit-schema. xmllint comes from
# Debian's libxml2-utils, installed when missing and apt-get is usable.
# The path is the only line on stdout; progress and errors go to stderr.
set -euo pipefail

PYTEST_VERSION=8.3.4
CACHE="${CHAOS_CACHE_DIR:-$HOME/.cache/chaos}/junit-schema"
XSD="$CACHE/junit-10.xsd"

log() { printf 'junit-schema: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if ! command -v xmllint >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing xmllint (libxml2-utils)"
    apt-get install -y -qq libxml2-utils >/dev/null 2>&1 \
      || { apt-get update -qq && apt-get install -y -qq libxml2-utils >/dev/null; } \
      || die "could not install libxml2-utils with apt-get"
  else
    die "xmllint not found: install libxml2-utils (Debian) or libxml2 (elsewhere)"
  fi
fi

if [[ ! -s "$XSD" ]]; then
  command -v python3 >/dev/null 2>&1 || die "python3 not found: pip fetches the schema from PyPI"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  log "fetching pytest $PYTEST_VERSION's source distribution from PyPI for junit-10.xsd"
  python3 -m pip download --quiet --no-deps --no-binary :all: --dest "$tmp" "pytest==$PYTEST_VERSION" >&2 \
    || die "pip could not download pytest==$PYTEST_VERSION (is PyPI reachable?)"
  tar -xzf "$tmp/pytest-$PYTEST_VERSION.tar.gz" -C "$tmp" "pytest-$PYTEST_VERSION/testing/example_scripts/junit-10.xsd" \
    || die "pytest-$PYTEST_VERSION.tar.gz has no testing/example_scripts/junit-10.xsd"
  mkdir -p "$CACHE"
  mv "$tmp/pytest-$PYTEST_VERSION/testing/example_scripts/junit-10.xsd" "$XSD"
fi
printf '%s\n' "$XSD"
