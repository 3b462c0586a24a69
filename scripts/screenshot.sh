#!/usr/bin/env bash
# A headless Chromium screenshot of an HTML report (or any local page):
#
#   scripts/screenshot.sh <report.html> <out.png> [WIDTHxHEIGHT]   # default 1100x2400
#
# CHAOS_SCREENSHOT_SCALE (default 1) scales the page: 0.75 gives a smaller
# picture of the same layout. Installs Debian's chromium package when it is
# missing and apt-get is there (as root), as scripts/test.sh installs build
# tools. Chromium gets CHAOS_SCREENSHOT_TIMEOUT seconds (default 60), so a
# stuck browser never hangs the caller. Prints the picture's path.
set -euo pipefail

log() { printf 'screenshot: %s\n' "$*" >&2; }

if [ $# -lt 2 ]; then
  log "usage: scripts/screenshot.sh <report.html> <out.png> [WIDTHxHEIGHT]"; exit 2
fi
page=$1 out=$2 size=${3:-1100x2400}
[ -f "$page" ] || { log "no such file: $page"; exit 2; }
case $size in *x*) ;; *) log "size must be WIDTHxHEIGHT, got $size"; exit 2;; esac

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing chromium (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    browser=$(command -v chromium)
  else
    log "chromium not found; install Debian's chromium package"; exit 1
  fi
fi

# Chromium wants an absolute file URL and a profile of its own, so that
# concurrent calls (tests) never share one.
abs=$(cd "$(dirname "$page")" && pwd)/$(basename "$page")
mkdir -p "$(dirname "$out")"
out_abs=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
rm -f "$out_abs"
timeout -k 5 "${CHAOS_SCREENSHOT_TIMEOUT:-60}" "$browser" --headless --no-sandbox --disable-gpu \
  --hide-scrollbars --user-data-dir="$profile" --window-size="${size/x/,}" \
  --force-device-scale-factor="${CHAOS_SCREENSHOT_SCALE:-1}" \
  --screenshot="$out_abs" "file://$abs" >/dev/null 2>&1 || true
if [ ! -s "$out_abs" ]; then
  log "chromium wrote no screenshot of $page"; exit 1
fi
echo "$out_abs"
