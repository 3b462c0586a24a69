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
# artifact). A Spring Boot jar is then extracted (`-Djarmode=tools extract`)
# and started once with its first argument "service" until its context is
# refreshed (`-Dspring.context.exit=onRefresh`) to write a class-data-sharing
# archive: a JVM restarted by chaos starts in about 60% of the time. The
# launcher, named after the pom's artifactId in .../bin, runs
# `exec java $JAVA_OPTS [-XX:SharedArchiveFile=...] -jar <jar> "$@"`, with a
# small heap by default (JAVA_OPTS, default "-Xmx256m -XX:+UseSerialGC
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
RUN_JAR="$HOME_DIR/$ARTIFACT.jar"
CDS=""
rm -rf "$HOME_DIR/app" "$RUN_JAR"
if java -Djarmode=tools -jar "$JAR" extract --destination "$HOME_DIR/app" >/dev/null 2>&1; then
  RUN_JAR="$HOME_DIR/app/$(basename "$JAR")"
  log "training a class-data-sharing archive ($HOME_DIR/app/app.jsa)"
  if (cd "$HOME_DIR/app" && CHAOS_PORT=0 java -XX:ArchiveClassesAtExit=app.jsa -Dspring.context.exit=onRefresh \
        -jar "$RUN_JAR" service >"$HOME_DIR/app/training.log" 2>&1) && [[ -f "$HOME_DIR/app/app.jsa" ]]; then
    CDS="-XX:SharedArchiveFile=$HOME_DIR/app/app.jsa -Xlog:cds=off -Xlog:cds+dynamic=off"
  else
    log "no archive (see $HOME_DIR/app/training.log): the JVM starts without it"
  fi
else
  cp "$JAR" "$RUN_JAR"
fi
cat > "$BIN/$ARTIFACT" <<LAUNCHER
#!/bin/sh
exec java \${JAVA_OPTS:--Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1} $CDS -jar "$RUN_JAR" "\$@"
LAUNCHER
chmod +x "$BIN/$ARTIFACT"
printf '%s\n' "$want" > "$STAMP"
log "built $RUN_JAR"
printf '%s\n' "$BIN"
