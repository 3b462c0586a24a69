#!/usr/bin/env python3
"""Debezium's findings under chaos: for each fault on the relay and each of
Kafka Connect's two modes, N seeds of examples/debezium/debezium.toml with
that fault alone, one run at a time, and a Markdown table of what they
found (docs/findings/debezium.md holds the measured one).

    PATH="$(scripts/python-env.sh):$PATH" python3 scripts/debezium-findings.py \
        --seeds 10 [--faults kill,pause] [--modes at-least-once,exactly-once] \
        [--operations 1000] [--chaos target/release/chaos] [--out findings.json]

Each run's variant is the example with its [faults], [nemesis] and [proxy]
replaced by the row's, its relay command given --mode, and its paths made
absolute, written to a temporary folder. Per row: runs, verdicts, the
faults that fired, duplicate messages on the topic (min-max and total),
lost events, keys split across partitions (split key), stalls, and the
time to recover (the drain: from the workload's end until every event was
on the topic and consumed). Needs the services (scripts/services.sh up).
Progress on stderr; the table on stdout.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "debezium", "debezium.toml")

# The fault of each row, as the TOML that replaces the example's [faults].
# Only the Connect worker is struck (targets), so each row's figures are
# the relay's alone.
FAULTS = {
    "kill": ("the Connect worker SIGKILLed (0.15 a second)", '''
[faults]
process_kill = 0.15
[nemesis]
targets = ["relay-1"]
'''),
    # At 0.1 a second, 600 orders left 8 of 10 runs without one of the two
    # (about 8 seconds drawn): this row wants --operations 1500.
    "pause": ("the Connect worker SIGSTOPped for 8 s (0.15 a second), then killed while it catches up (0.15 a second)", '''
[faults]
process_pause = 0.15
process_kill = 0.15
[nemesis]
targets = ["relay-1"]
pause_secs = 8
'''),
    "db-restart": ("PostgreSQL restarted in immediate mode under the slot, every 15 s", '''
[faults]
db_restart = 1.0
[[nemesis.timeline]]
fault = "db.restart"
at = "5s"
every = "15s"
'''),
    # Once a run: a broker restart takes 10 to 20 s on the two-core
    # machine, so one every 20 s left the broker up for a few seconds in
    # twenty, and a drain that needs two readings in a row never ended.
    "broker-kill": ("the Kafka broker SIGKILLed 5 s into the workload, restarted 5 s later", '''
[faults]
broker_kill = 1.0
[[nemesis.timeline]]
fault = "broker.kill"
at = "5s"
for = "5s"
'''),
    "produce-ack-lost": ("the fault proxy withholds Connect's produce acknowledgements (0.02 each)", '''
[faults]
kafka_produce_ack_lost = 0.02
[proxy]
targets = ["relay"]
kafka = true
'''),
    # Like pause, the two proxy rows want --operations 1500 and 0.15 a
    # second: at 600 orders most runs would draw no fault at all.
    "pg-reset": ("the fault proxy resets Connect's PostgreSQL connections (0.15 a second)", '''
[faults]
net_reset = 0.15
[proxy]
targets = ["relay"]
'''),
    "pg-blackhole": ("the fault proxy holds Connect's PostgreSQL traffic for 3 s (0.15 a second)", '''
[faults]
net_blackhole = 0.15
[proxy]
targets = ["relay"]
blackhole_ms = 3000
'''),
}


def variant(fault, mode, operations, folder):
    text = open(EXAMPLE).read()
    here = os.path.dirname(EXAMPLE)
    text = text.replace('"../orders/', f'"{os.path.join(ROOT, "examples", "orders")}/')
    text = text.replace('["python3", "connect.py"]',
                        f'["python3", "{os.path.join(here, "connect.py")}", "--mode", "{mode}"]')
    text = re.sub(r"(?m)^count = \d+", f"count = {operations}", text)
    # The example's own faults go; the row's take their place.
    text = text[:text.index("[faults]")] + FAULTS[fault][1] + "\n[run]\ndrain_timeout_secs = 120\n"
    path = os.path.join(folder, f"{fault}-{mode}.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def one_run(chaos, path, seed, reports):
    t0 = time.monotonic()
    # The services scripts/services.sh starts, unless the environment names others.
    env = dict(os.environ)
    env.setdefault("DATABASE_URL", "postgres://chaos:chaos@127.0.0.1:5432/chaos")
    env.setdefault("KAFKA_BROKERS", "127.0.0.1:9092")
    out = subprocess.run([chaos, "run", path, "--seed", str(seed), "--json", "--reports-dir", reports],
                         capture_output=True, text=True, env=env)
    try:
        r = json.loads(out.stdout)
    except ValueError:
        return {"code": out.returncode, "error": out.stderr.strip().splitlines()[-1:] or ["no report"]}
    names = {a["name"]: a["count"] for a in r.get("anomalies", [])}
    fired = sum(f.get("fired", 0) for f in r.get("faults", []) if f.get("probability", 0) > 0)
    return {
        "code": out.returncode,
        "verdict": r.get("verdict"),
        "seconds": round(time.monotonic() - t0, 1),
        "fired": fired,
        "duplicates": (r.get("system") or {}).get("duplicate_messages", 0),
        "lost": names.get("lost event", 0),
        # Keys whose events landed on more than one partition: the declared
        # verifier does not yet check the order within a partition.
        "order": names.get("split key", 0),
        "stalled": names.get("stalled relay", 0),
        "drain_s": round((r.get("timings") or {}).get("drain_ms", 0) / 1000, 1),
        "anomalies": names,
        "run_id": r.get("run_id"),
    }


def span(values):
    return f"{min(values)}–{max(values)}" if values and min(values) != max(values) else str(values[0] if values else "-")


def row(fault, mode, runs, seeds):
    ok = [x for x in runs if "verdict" in x]
    verdicts = {}
    for x in runs:
        v = x.get("verdict") or f"exit {x['code']}"
        verdicts[v] = verdicts.get(v, 0) + 1
    dup = [x["duplicates"] for x in ok]
    return "| {} | {} | {} | {} | {} | {} ({} total) | {} | {} | {} | {} s |".format(
        fault, mode, len(runs), ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())),
        span([x["fired"] for x in ok]), span(dup), sum(dup),
        sum(x["lost"] for x in ok), sum(x["order"] for x in ok), sum(1 for x in ok if x["stalled"]),
        span([x["drain_s"] for x in ok]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--modes", default="at-least-once,exactly-once")
    ap.add_argument("--operations", type=int, default=1000)
    ap.add_argument("--chaos", default=os.path.join(ROOT, "target", "release", "chaos"))
    ap.add_argument("--out", help="every run's figures, as JSON")
    a = ap.parse_args()
    faults = a.faults.split(",")
    for f in faults:
        if f not in FAULTS:
            sys.exit(f"debezium-findings.py: unknown fault {f!r}; one of {', '.join(FAULTS)}")
    folder = tempfile.mkdtemp(prefix="chaos-debezium-findings-")
    reports = os.path.join(folder, "reports")
    all_runs, lines = {}, []
    for fault in faults:
        for mode in a.modes.split(","):
            path = variant(fault, mode, a.operations, folder)
            runs = []
            for seed in range(1, a.seeds + 1):
                x = one_run(a.chaos, path, seed, reports)
                print(f"{fault} {mode} seed {seed}: {json.dumps(x)}", file=sys.stderr, flush=True)
                runs.append(x)
            all_runs[f"{fault} {mode}"] = runs
            lines.append(row(fault, mode, runs, a.seeds))
            if a.out:
                with open(a.out, "w") as f:
                    json.dump(all_runs, f, indent=1)
    print("| fault | mode | runs | verdicts | firings per run | duplicates on the topic per run | lost events | per-key order broken | stalled | drain (time to recover) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for line in lines:
        print(line)
    print(f"\n{a.operations} orders (2 events each) per run; reports in {reports}", file=sys.stderr)


if __name__ == "__main__":
    main()
