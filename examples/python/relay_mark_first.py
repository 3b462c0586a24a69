#!/usr/bin/env python3
"""BROKEN ON PURPOSE: marks the batch published and commits BEFORE producing it.

"Commit the claim first so the row locks are not held while we wait for the
broker" sounds reasonable, and the producing and flushing is relay.py's. But
between the commit and the broker's ack the batch exists only in this
process's memory: a kill there loses it. The rows say published, no relay
ever claims them again, and the events never reach the topic. `chaos run
relay-mark-first.toml` reports "lost event" and exits 1.
"""
from relay import CLAIM, MARK, main


def publish_batch_mark_first(conn, publisher, batch_size):
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(CLAIM, (batch_size,))
        rows = cur.fetchall()
        if rows:
            cur.execute(MARK, ([row[0] for row in rows],))  # BUG: the mark goes first...
    publisher.send(rows)  # ...so a kill before every ack loses the batch
    return len(rows)


if __name__ == "__main__":
    main(publish_batch_mark_first)
