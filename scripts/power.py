#!/usr/bin/env python3
"""Measures how often `chaos run` catches each example program, over seeds 1..N,
with the verdict and the time of each run.

    scripts/power.py [--seeds 10|6-10] [--jobs 1] [--chaos target/release/chaos] \
        [--consumer PROGRAM]... [--relay PROGRAM]... [--system DECLARATION.toml]... \
        [SCENARIO.toml]...

`--consumer PROGRAM` and `--relay PROGRAM` run the program under the
recommended scenario for its kind, written by `chaos init --consumer` or
`--relay` with only the command changed, as a user would (`--consumer-email
PROGRAM`: `chaos init --consumer CMD --email`, for a consumer that sends
emails): this is how
docs/your-system.md's power table is made. `--system DECLARATION.toml` runs
a declared system under `chaos init --system --from DECLARATION.toml`: its
declaration unchanged, the recommended faults in place of its own (the file
is written beside the declaration, whose commands are relative to its
folder, and removed afterwards). A PROGRAM ending in `.py` runs
with python3, `.js` or `.mjs` with node; anything else runs as given.
SCENARIO.toml runs a scenario file as it is.

Prints one Markdown row per program: the seeds caught (exit 1) and passed
(exit 0), any other exit, the fastest and slowest run, how many runs
took over 90 s, the faults' firings another end pre-empted of all those
fired, and the reorders the runs saw (writers' held commits overtaken,
keys whose events the topic carries out of order), summed over the seeds. `--jobs N` runs N at once: they share the fault proxy's
Kafka slots, and each time is then a run's own under that load, less what
it waited for slots the others held. It needs PostgreSQL and Kafka
up (scripts/services.sh up) and the Python venv first on PATH
(scripts/python-env.sh). A measurement, not a test: nothing here fails a
build. The suite runs seeds 1 and 2 of every consumer and relay example
under these files (tests/e2e/programs.rs).
"""
import argparse
import concurrent.futures
import json
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


def recommended(chaos, kind, program, into, email=False):
    """Writes `chaos init --KIND "CMD" [--email]` into the folder and returns its path."""
    out = os.path.join(into, f"{kind}{'-email' if email else ''}-{os.path.basename(program)}.toml")
    extra = ["--email"] if email else []
    subprocess.run([chaos, "init", f"--{kind}", command_for(program), *extra, out],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def recommended_system(chaos, declaration):
    """Writes `chaos init --system --from DECLARATION` beside it and returns its path."""
    folder, name = os.path.split(os.path.abspath(declaration))
    # The pid in the name: two measurements of one declaration at once
    # never take each other's file.
    out = os.path.join(folder, f".power-{os.getpid()}-{name}")
    subprocess.run([chaos, "init", "--system", "--from", declaration, out],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def seeds_of(text):
    """`10` is seeds 1..10; `6-10` is seeds 6..10."""
    first, _, last = text.partition("-")
    try:
        seeds = list(range(int(first), int(last) + 1)) if last else list(range(1, int(first) + 1))
    except ValueError:
        seeds = []
    if not seeds or seeds[0] < 1:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: give a count (10) or a range (6-10) of seeds from 1")
    return seeds


def run_one(chaos, path, label, seed, reports):
    """One run: its exit code and its time, less any wait for the fault
    proxy's Kafka slots that runs beside it held (`--jobs`)."""
    start = time.monotonic()
    ran = subprocess.run([chaos, "run", path, "--seed", str(seed), "--reports-dir", reports, "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    took = time.monotonic() - start
    try:
        report = json.loads(ran.stdout)
    except ValueError:
        report = {}
    components = report.get("components") or {}
    waited = components.get("waited_for_ports_ms", 0) / 1000
    took -= waited
    # What the faults did: their firings and those another end pre-empted,
    # and the evidence of the reorders (writers' holds overtaken, keys
    # whose events the topic carries out of order).
    faults = report.get("faults") or []
    fired = sum(f.get("fired", 0) for f in faults)
    preempted = sum(f.get("preempted", 0) for f in faults)
    overtaken = components.get("writer_holds_overtaken", 0)
    reordered = (report.get("counts") or {}).get("reordered_payments", 0)
    print(f"  {label} seed {seed}: exit {ran.returncode} in {took:.1f} s, {preempted} of {fired} firings pre-empted,"
          f" {overtaken} writer holds overtaken, {reordered} keys reordered"
          + (f" (and {waited:.1f} s waiting for the proxy's slots)" if waited else "")
          + (f"; why: {report.get('reason')}" if ran.returncode not in (0, 1) else ""), file=sys.stderr, flush=True)
    return ran.returncode, took, (fired, preempted, overtaken, reordered)


def row(results, seeds):
    """The Markdown cells of one program's runs, in seed order."""
    codes = [c for c, _, _ in results]
    times = [t for _, t, _ in results]
    fired, preempted, overtaken, reordered = (sum(x) for x in zip(*(e for _, _, e in results)))
    n = len(seeds)
    other = ", ".join(f"seed {s}: exit {c}" for s, c in zip(seeds, codes) if c not in (0, 1)) or "none"
    over = sum(t > 90 for t in times)
    share = f"{preempted}/{fired} ({100 * preempted / fired:.1f}%)" if fired else "0/0"
    evidence = [f"{overtaken} writer holds overtaken"] if overtaken else []
    evidence += [f"{reordered} keys reordered"] if reordered else []
    return (f"| {codes.count(1)}/{n} | {codes.count(0)}/{n} | {other} | "
            f"{min(times):.0f}-{max(times):.0f} s | {over} | {share} | {', '.join(evidence) or 'none'} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=seeds_of, default=seeds_of("10"), metavar="N|A-B")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="runs at once (they share the fault proxy's Kafka slots); the times are then each run's own under that load")
    ap.add_argument("--chaos", default="target/release/chaos")
    ap.add_argument("--consumer", action="append", default=[], metavar="PROGRAM")
    ap.add_argument("--consumer-email", action="append", default=[], metavar="PROGRAM",
                    help="a consumer that sends each receipt as an email: `chaos init --consumer CMD --email`")
    ap.add_argument("--relay", action="append", default=[], metavar="PROGRAM")
    ap.add_argument("--system", action="append", default=[], metavar="DECLARATION",
                    help="a declared system: `chaos init --system --from DECLARATION`")
    ap.add_argument("--reports", metavar="DIR",
                    help="keep every run's reports (and its processes' logs) in DIR; by default they go with a temporary folder")
    ap.add_argument("scenarios", nargs="*")
    a = ap.parse_args()
    if not (a.consumer or a.consumer_email or a.relay or a.system or a.scenarios):
        ap.error("nothing to measure: give --consumer PROGRAM, --relay PROGRAM, --system DECLARATION or a scenario file")
    if a.jobs < 1:
        ap.error("--jobs must be 1 or more")
    chaos = os.path.abspath(a.chaos)
    print(f"seeds {a.seeds[0]}-{a.seeds[-1]}, {a.jobs} run(s) at once", file=sys.stderr)
    print("| program | scenario | caught (exit 1) | passed (exit 0) | other | run times | over 90 s "
          "| pre-empted of fired | reorders seen |")
    print("|---|---|---|---|---|---|---|---|---|")
    written = []
    try:
        with tempfile.TemporaryDirectory() as work:
            reports = os.path.abspath(a.reports) if a.reports else os.path.join(work, "reports")
            rows = []
            for kind, programs, email in (("consumer", a.consumer, False), ("consumer", a.consumer_email, True),
                                          ("relay", a.relay, False)):
                for program in programs:
                    path = recommended(chaos, kind, program, work, email)
                    flags = f"--{kind}" + (" --email" if email else "")
                    rows.append((f"`{os.path.basename(program)}` | `chaos init {flags}`", path, program))
            for declaration in a.system:
                path = recommended_system(chaos, declaration)
                written.append(path)
                rows.append((f"`{os.path.basename(declaration)}` | `chaos init --system --from`", path, declaration))
            rows += [(f"`{program_of(path)}` | `{path}`", path, path) for path in a.scenarios]
            with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
                futures = [[pool.submit(run_one, chaos, path, label, seed, reports) for seed in a.seeds]
                           for _, path, label in rows]
                for (name, _, _), runs in zip(rows, futures):
                    print(f"| {name} {row([f.result() for f in runs], a.seeds)}", flush=True)
    finally:
        for path in written:
            os.remove(path)


if __name__ == "__main__":
    main()
