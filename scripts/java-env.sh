#!/usr/bin/env bash
# Builds a Java example (a Maven project: a folder holding a pom.xml) outside
# the repository and prints the folder of its launcher on stdout.
#
# Usage:
#   PATH="$(scripts/java-env.sh examples/libraries/spring-modulith):$PATH" \
#     chaos run examples/libraries/spring-modulith/orders-modulith.toml
#
# The folder's sources are copied to
# ${CHAOS_CACHE_DIR:-$HOME/.cache/chaos}/java-<the folder's name>/src, built
# there with `mvn package` (Maven Central, or ~/.m2 offline once it holds every
# artifact), and the jar <artifactId>.jar is wrapped in a launcher named after
# the pom's artifactId in .../bin: `exec java $JAVA_OPTS -jar <jar> "$@"`, with
# a small heap by default (JAVA_OPTS, default "-Xmx256m -XX:+UseSerialGC
# -XX:TieredStopAtLevel=1"). It rebuilds only when the pom, the sources or the
# java changed, so a second call returns at once. Nothing is written in the
# repository. The bin folder is the only line on stdout.
set -euo pipefail

CACHE="${CHAOS_CACHE_DIR:-$HOME/.cache/chaos}"

log() { printf 'java-env: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $# -eq 1 ]] || die "usage: scripts/java-env.sh <example folder with a pom.xml>"
[[ -f "$1/pom.xml" ]] || die "no pom.xml in $1"
SRC="$(cd "$1" && pwd)"
NAME="$(basename "$SRC")"
HOME_DIR="$CACHE/java-$NAME"
BUILD="$HOME_DIR/src"
BIN="$HOME_DIR/bin"
STAMP="$HOME_DIR/.sources.sha256"

command -v java >/dev/null 2>&1 || die "java not found on PATH (Java 17 or newer)"
command -v mvn >/dev/null 2>&1 || die "mvn not found on PATH (Apache Maven 3.8 or newer)"

want="$( { cd "$SRC" && find pom.xml src -type f -print0 | sort -z | xargs -0 sha256sum; java -version 2>&1; } | sha256sum | cut -d' ' -f1)"
ARTIFACT="$(sed -n 's:^  <artifactId>\(.*\)</artifactId>$:\1:p' "$SRC/pom.xml" | head -1)"
[[ -n "$ARTIFACT" ]] || die "no top-level <artifactId> in $SRC/pom.xml"

if [[ -x "$BIN/$ARTIFACT" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  printf '%s\n' "$BIN"
  exit 0
fi

log "building $NAME in $BUILD (mvn package)"
rm -rf "$BUILD"
mkdir -p "$BUILD" "$BIN"
cp -r "$SRC/pom.xml" "$SRC/src" "$BUILD/"
# Offline first (every artifact already in ~/.m2), then online.
if ! (cd "$BUILD" && mvn -q -o -DskipTests package >/dev/null 2>&1); then
  (cd "$BUILD" && mvn -q -DskipTests package >&2) || die "mvn package failed in $BUILD"
fi
JAR="$(ls "$BUILD"/target/*.jar | grep -v -- '-plain.jar$' | head -1)"
[[ -f "$JAR" ]] || die "no jar in $BUILD/target"
cp "$JAR" "$HOME_DIR/$ARTIFACT.jar"
cat > "$BIN/$ARTIFACT" <<LAUNCHER
#!/bin/sh
exec java \${JAVA_OPTS:--Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1} -jar "$HOME_DIR/$ARTIFACT.jar" "\$@"
LAUNCHER
chmod +x "$BIN/$ARTIFACT"
printf '%s\n' "$want" > "$STAMP"
log "built $HOME_DIR/$ARTIFACT.jar"
printf '%s\n' "$BIN"
