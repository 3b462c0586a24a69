#!/usr/bin/env python3
"""Measures how often `chaos run` catches each example program: every
scenario given, over seeds 1..N, with the verdict and the time of each run.

    scripts/power.py [--seeds 10] [--chaos target/debug/chaos] SCENARIO.toml...

Prints one Markdown row per scenario: the program, the seeds caught (exit 1)
and passed (exit 0), any other exit, and the slowest run. It needs
PostgreSQL and Kafka up (scripts/services.sh up) and the Python venv first
on PATH (scripts/python-env.sh). A measurement, not a test: nothing here
fails a build.
"""
import argparse
import re
import subprocess
import sys
import tempfile
import time


def program_of(path):
    text = open(path).read()
    m = re.search(r'^command\s*=\s*\[[^\]]*?"([^"]+\.py)"', text, re.M)
    return m.group(1) if m else "the reference pipeline"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--chaos", default="target/debug/chaos")
    ap.add_argument("scenarios", nargs="+")
    a = ap.parse_args()
    print("| program | scenario | caught (exit 1) | passed (exit 0) | other | slowest run |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as reports:
        for path in a.scenarios:
            codes, slowest = [], 0.0
            for seed in range(1, a.seeds + 1):
                start = time.monotonic()
                ran = subprocess.run([a.chaos, "run", path, "--seed", str(seed), "--reports-dir", reports],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                slowest = max(slowest, time.monotonic() - start)
                codes.append(ran.returncode)
                print(f"  {path} seed {seed}: exit {ran.returncode} in {time.monotonic() - start:.1f} s",
                      file=sys.stderr, flush=True)
            other = ", ".join(f"seed {s}: exit {c}" for s, c in enumerate(codes, 1) if c not in (0, 1)) or "none"
            print(f"| `{program_of(path)}` | `{path}` | {codes.count(1)}/{a.seeds} | {codes.count(0)}/{a.seeds} "
                  f"| {other} | {slowest:.0f} s |", flush=True)


if __name__ == "__main__":
    main()
