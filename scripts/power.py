#!/usr/bin/env python3
"""Measures how often `chaos run` catches each example program, over seeds 1..N,
with the verdict and the time of each run.

    scripts/power.py [--seeds 10] [--chaos target/release/chaos] \
        [--consumer PROGRAM]... [--relay PROGRAM]... [SCENARIO.toml]...

`--consumer PROGRAM` and `--relay PROGRAM` run the program under the
recommended scenario for its kind, written by `chaos init --consumer` or
`--relay` with only the command changed, as a user would: this is how
docs/your-system.md's power table is made. A PROGRAM ending in `.py` runs
with python3, `.js` or `.mjs` with node; anything else runs as given.
SCENARIO.toml runs a scenario file as it is.

Prints one Markdown row per program: the seeds caught (exit 1) and passed
(exit 0), any other exit, and the slowest run. It needs PostgreSQL and Kafka
up (scripts/services.sh up) and the Python venv first on PATH
(scripts/python-env.sh). A measurement, not a test: nothing here fails a
build. The suite runs one seed of the three relays and of two consumers
(the per-message one and auto-commit) under these files
(tests/e2e/programs.rs).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time


def program_of(path):
    text = open(path).read()
    m = re.search(r'^command\s*=\s*\[[^\]]*?"([^"]+\.(?:py|js|mjs))"', text, re.M)
    return os.path.basename(m.group(1)) if m else "the reference pipeline"


def command_for(program):
    """The command line `chaos init` is given: absolute, so the scenario
    can live anywhere."""
    path = os.path.abspath(program)
    if path.endswith(".py"):
        return f"python3 {path}"
    if path.endswith((".js", ".mjs")):
        return f"node {path}"
    return path


def recommended(chaos, kind, program, into):
    """Writes `chaos init --KIND "CMD"` into the folder and returns its path."""
    out = os.path.join(into, f"{kind}-{os.path.basename(program)}.toml")
    subprocess.run([chaos, "init", f"--{kind}", command_for(program), out],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def measure(chaos, path, label, seeds, reports):
    codes, slowest = [], 0.0
    for seed in range(1, seeds + 1):
        start = time.monotonic()
        ran = subprocess.run([chaos, "run", path, "--seed", str(seed), "--reports-dir", reports],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        took = time.monotonic() - start
        slowest = max(slowest, took)
        codes.append(ran.returncode)
        print(f"  {label} seed {seed}: exit {ran.returncode} in {took:.1f} s", file=sys.stderr, flush=True)
    other = ", ".join(f"seed {s}: exit {c}" for s, c in enumerate(codes, 1) if c not in (0, 1)) or "none"
    return f"| {codes.count(1)}/{seeds} | {codes.count(0)}/{seeds} | {other} | {slowest:.0f} s |"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--chaos", default="target/release/chaos")
    ap.add_argument("--consumer", action="append", default=[], metavar="PROGRAM")
    ap.add_argument("--relay", action="append", default=[], metavar="PROGRAM")
    ap.add_argument("scenarios", nargs="*")
    a = ap.parse_args()
    if not (a.consumer or a.relay or a.scenarios):
        ap.error("nothing to measure: give --consumer PROGRAM, --relay PROGRAM or a scenario file")
    chaos = os.path.abspath(a.chaos)
    print("| program | scenario | caught (exit 1) | passed (exit 0) | other | slowest run |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        reports = os.path.join(work, "reports")
        for kind, programs in (("consumer", a.consumer), ("relay", a.relay)):
            for program in programs:
                path = recommended(chaos, kind, program, work)
                row = measure(chaos, path, program, a.seeds, reports)
                print(f"| `{os.path.basename(program)}` | `chaos init --{kind}` {row}", flush=True)
        for path in a.scenarios:
            row = measure(chaos, path, path, a.seeds, reports)
            print(f"| `{program_of(path)}` | `{path}` {row}", flush=True)


if __name__ == "__main__":
    main()
