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
from consumer import (HANDLERS, DeadLetter, Event, apply, batches, commit_offsets,
                      log, decode, record_dead_letter, setup)


def handle_batch(conn, msgs):
    decoded = [decode(m) for m in msgs]
    events, seen = [], set()
    for d in decoded:
        if isinstance(d, Event) and d.event_id not in seen:
            seen.add(d.event_id)
            events.append(d)
    pairs = [(e.event_id, h) for e in events for h in HANDLERS[e.event_type]]
    claimed = set()
    if pairs:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(
                """INSERT INTO inbox (message_id, handler)
                   SELECT * FROM unnest(%s::uuid[], %s::text[])
                   ON CONFLICT DO NOTHING RETURNING message_id, handler""",
                ([p[0] for p in pairs], [p[1] for p in pairs]))
            claimed = set(cur.fetchall())
    # BUG: the claim is committed; a kill here loses the effects for good.
    with conn.transaction(), conn.cursor() as cur:
        for e in events:
            for h in HANDLERS[e.event_type]:
                if (e.event_id, h) in claimed:
                    apply(cur, e, h)
        for d in decoded:
            if isinstance(d, DeadLetter):
                log.warning("dead letter %s: %s", d.message_id, d.error)
                record_dead_letter(cur, d)


def main():
    consumer, conn, batch_size = setup()
    try:
        for msgs in batches(consumer, batch_size):
            handle_batch(conn, msgs)
            commit_offsets(consumer)  # after the database, as it should be
    finally:
        consumer.close()
        conn.close()


if __name__ == "__main__":
    main()
