#!/usr/bin/env python3
"""Plants realistic bugs in the reference pipeline, one at a time, and checks
that `chaos run` does not pass with any of them: the verifier's adversary.

Each plant is a one-place source change a real team could make. For each,
the script patches the source, builds the debug binary, runs the scenario
on the embedded backends (or on the real services when DATABASE_URL and
KAFKA_BROKERS are set), restores the source, and prints the verdict. A plant
that passes (exit 0) is a hole in the verifier; the script exits 1 then.

    scripts/plant-bugs.py              # every plant
    scripts/plant-bugs.py NAME ...     # some of them

Not part of the test suite: every plant is a rebuild (about 20 s each).
The working tree must be clean under src/ (the script restores it with git).
"""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (file, text to find, replacement, scenario)
PLANTS = {
    "receipt-on-the-wrong-event": (
        "src/pipeline/inbox.rs",
        "plan.receipts.push((e.body.payment_id, e.event_id));",
        "plan.receipts.push((e.body.payment_id, uuid::Uuid::from_u128(e.event_id.as_u128() ^ 1)));",
        "scenarios/payments.toml",
    ),
    "receipt-on-some-authorized-events": (
        "src/pipeline/inbox.rs",
        "        if e.kind == EventKind::Captured {\n            if may_apply(e.event_id, HANDLER_RECEIPTS) {",
        "        if e.kind == EventKind::Authorized && e.body.amount_cents % 97 == 0 {\n"
        "            plan.receipts.push((e.body.payment_id, e.event_id));\n        }\n"
        "        if e.kind == EventKind::Captured {\n            if may_apply(e.event_id, HANDLER_RECEIPTS) {",
        "scenarios/payments.toml",
    ),
    "loyalty-to-the-wrong-account": (
        "src/pipeline/inbox.rs",
        "*plan.loyalty.entry((e.body.account_id, e.lane)).or_default() += e.body.amount_cents;\n"
        "                plan.credits.push((e.event_id, e.body.account_id, e.body.amount_cents));",
        "*plan.loyalty.entry((e.body.account_id ^ 1, e.lane)).or_default() += e.body.amount_cents;\n"
        "                plan.credits.push((e.event_id, e.body.account_id ^ 1, e.body.amount_cents));",
        "scenarios/payments.toml",
    ),
    "authorized-routed-to-no-handler": (
        "src/pipeline/inbox.rs",
        "        EventKind::Authorized => &[Handler::Projection],\n        EventKind::Captured => &[Handler::Projection, Handler::Receipts, Handler::Loyalty],\n    }\n}\n\n/// The (event, handler)",
        "        EventKind::Authorized => &[],\n        EventKind::Captured => &[Handler::Projection, Handler::Receipts, Handler::Loyalty],\n    }\n}\n\n/// The (event, handler)",
        "scenarios/payments.toml",
    ),
    "one-payment-fewer": (
        "src/pipeline/workload.rs",
        "    (first..(first + size).min(payments))\n",
        "    (first..(first + size).min(payments)).filter(|i| *i != 500)\n",
        "scenarios/payments.toml",
    ),
    "notifier-crash-that-does-nothing": (
        "src/pipeline/notifier.rs",
        "ctx.faults.halt_for(FaultPoint::NotifierBeforeOffsetCommit, fires).await;\n        }\n        fires > 0\n",
        "ctx.faults.halt_for(FaultPoint::NotifierBeforeOffsetCommit, fires).await;\n        }\n        false\n",
        "scenarios/payments.toml",
    ),
    "mark-despite-a-failed-produce": (
        "src/pipeline/relay.rs",
        "            return self.produce_failed(cause, rows.len(), refuse.is_some(), shutdown).await;",
        "            let _ = (cause, shutdown);",
        "scenarios/smoke.toml",
    ),
    "relay-corrupts-some-payloads": (
        "src/broker/kafka/producer.rs",
        "let mut record = FutureRecord::to(topic).key(e.key.as_bytes()).payload(e.payload).headers(headers);",
        "let bad: Vec<u8> = e.payload.iter().map(|b| if *b == b'9' && e.key.ends_with('0') { b'8' } else { *b }).collect();\n"
        "                let mut record = FutureRecord::to(topic).key(e.key.as_bytes()).payload(&bad).headers(headers);",
        "scenarios/payments.toml",
    ),
    "read-stops-one-early": (
        "src/broker/kafka/mod.rs",
        "        spans.push(Span { low, high, read: 0, skipped: 0 });",
        "        let high = (high - 1).max(low);\n        spans.push(Span { low, high, read: 0, skipped: 0 });",
        "scenarios/payments.toml",
    ),
    "verifier-skips-partition-0": (
        "src/broker/kafka/mod.rs",
        "        if high > low {\n            tpl.add",
        "        if high > low && p != 0 {\n            tpl.add",
        "scenarios/payments.toml",
    ),
    # A partition from the row's outbox position, not the payment's key:
    # both events of a payment land on one partition only when the gap
    # between them lines up with it, as it always did while 4 producers
    # took turns in a fixed order (the captured row 4 rows after the
    # authorized one). The seeded workload shape breaks that arithmetic.
    "relay-partition-from-row-position": (
        "src/pipeline/relay.rs",
        "e.lane = how.refuse.filter(|f| f.row == i).map(|f| f.lane);",
        "e.lane = Some((r.seq % 4) as i32);\n            let _ = (i, how.refuse);",
        "scenarios/payments.toml",
    ),
    # Reached only when a database transaction fails: `store.commit_refused`
    # in smoke.toml refuses notifier commits on both backends.
    "notifier-acks-after-a-failed-transaction": (
        "src/pipeline/notifier.rs",
        "            Err(e) => {\n                ctx.faults.settled(held);\n                return Step::End(Ending::Error { what: \"a batch transaction\", cause: e.to_string() });\n            }",
        "            Err(e) => {\n                tracing::warn!(cause = %e, \"batch failed; moving on\");\n                self.commit(&next);\n                ctx.faults.settled(held);\n                return Step::Continue;\n            }",
        "scenarios/smoke.toml",
    ),
    # Reached only when the second of the two commits fails: the payment
    # stays, its event is never written.
    "payment-and-outbox-in-two-transactions": (
        "src/store/sqlite.rs",
        "            q.execute(&mut *tx.tx).await.map_err(|e| Error::db(\"inserting payments\", e))?;\n        }\n        if outbox {",
        "            q.execute(&mut *tx.tx).await.map_err(|e| Error::db(\"inserting payments\", e))?;\n        }\n"
        "        tx.commit_through(&self.gate, \"authorize\").await?;\n"
        "        let mut tx = self.begin_write(\"authorize's events\").await?;\n        if outbox {",
        "scenarios/smoke.toml",
    ),
}


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, **kw)


def plant(name):
    path, old, new, scenario = PLANTS[name]
    full = os.path.join(ROOT, path)
    text = open(full).read()
    if old not in text:
        return f"{name}: the code it plants in has changed; update scripts/plant-bugs.py", False
    open(full, "w").write(text.replace(old, new, 1))
    try:
        build = run(["cargo", "build", "-q"], capture_output=True, text=True)
        if build.returncode != 0:
            return f"{name}: does not build: {build.stderr.strip().splitlines()[-1:]}", False
        with tempfile.TemporaryDirectory() as reports:
            ran = run(
                ["target/debug/chaos", "run", scenario, "--json", "--reports-dir", reports],
                capture_output=True,
                text=True,
                timeout=600,
            )
        try:
            r = json.loads(ran.stdout)
            found = ", ".join(f"{a['count']} x {a['name']}" for a in r["anomalies"]) or "no anomaly"
            line = f"{name}: exit {ran.returncode}, {r['verdict']}: {found}"
        except (json.JSONDecodeError, KeyError):
            line = f"{name}: exit {ran.returncode}: {ran.stderr.strip()[-200:]}"
        return line, ran.returncode != 0
    finally:
        run(["git", "checkout", "-q", "--", path])


def check():
    """--check: every plant still finds the code it plants in (no build, no run)."""
    stale = [n for n, (path, old, _, _) in PLANTS.items() if old not in open(os.path.join(ROOT, path)).read()]
    for n in stale:
        print(f"stale plant {n}: its text is no longer in {PLANTS[n][0]}; update scripts/plant-bugs.py")
    print(f"{len(PLANTS) - len(stale)}/{len(PLANTS)} plants find their code")
    return 1 if stale else 0


def main():
    if sys.argv[1:] == ["--check"]:
        return check()
    names = sys.argv[1:] or list(PLANTS)
    unknown = [n for n in names if n not in PLANTS]
    if unknown:
        print(f"unknown plant(s): {', '.join(unknown)}; known: {', '.join(PLANTS)}", file=sys.stderr)
        return 2
    if run(["git", "diff", "--quiet", "--", "src"]).returncode != 0:
        print("src/ has uncommitted changes; commit or stash them first (the script restores src/ with git)",
              file=sys.stderr)
        return 2
    holes = 0
    for n in names:
        line, caught = plant(n)
        print(("caught  " if caught else "MISSED  ") + line, flush=True)
        holes += not caught
    run(["cargo", "build", "-q"])
    print(f"{len(names) - holes}/{len(names)} plants caught")
    return 1 if holes else 0


if __name__ == "__main__":
    sys.exit(main())
