#!/usr/bin/env python3
"""BROKEN ON PURPOSE: claims the batch in the inbox in one transaction and
applies the effects of what it claimed in a second one.

Both steps are the ones consumer.py takes, the offsets are committed after
both, and a redelivered batch is absorbed by the inbox claim: it looks
exactly-once. But a kill after the claim's commit and before the effects'
leaves inbox rows for effects that never happened, and the redelivery finds
the pairs claimed and does nothing. `chaos run two-transactions.toml`
reports "missing effect" and exits 1.
"""
from consumer import HANDLERS, apply_claimed, claim, decode, distinct_events, run


def handle_batch(conn, msgs):
    decoded = [decode(m) for m in msgs]
    events = distinct_events(decoded)
    pairs = [(e.event_id, h) for e in events for h in HANDLERS[e.event_type]]
    with conn.transaction(), conn.cursor() as cur:
        claimed = claim(cur, pairs)
    # BUG: the claim is committed; a kill here loses the effects for good.
    with conn.transaction(), conn.cursor() as cur:
        apply_claimed(cur, events, claimed, decoded)


if __name__ == "__main__":
    run(handle_batch)  # the offsets after both transactions, as they should be
