#!/usr/bin/env python3
"""BROKEN ON PURPOSE: claims only rows past the highest `seq` it has published.

"seq only grows, so remember the last one we published and ask for the rows
after it" sounds like an optimisation, and the producing, acking and marking
are relay.py's. But `seq` is handed out at INSERT, and transactions commit in
their own order: a payment service transaction that inserted row 41 and
commits after row 42's transaction becomes visible once the cursor has passed
41. No claim of this process looks at it again (docs/contract.md section 7:
`seq` is never a cursor). A restart starts the cursor over and heals it,
so the bug shows only between restarts. `chaos run relay-seq-cursor.toml`
holds some payment service transactions open before their COMMIT
(`workload.slow_commit`) and reports "unpublished leftover" and "lost event",
exit 1.
"""
from relay import main

# relay.py's claim, past a cursor, returning the seq too.
CLAIM_AFTER = """SELECT id, aggregate_id, event_type, payload::text, seq FROM outbox
                 WHERE published_at IS NULL AND seq > %s ORDER BY seq LIMIT %s
                 FOR UPDATE SKIP LOCKED"""
MARK = "UPDATE outbox SET published_at = clock_timestamp() WHERE id = ANY(%s)"

cursor = 0  # BUG: the highest seq published, taken for "everything below is done"


def publish_batch_past_cursor(conn, publisher, batch_size):
    global cursor
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(CLAIM_AFTER, (cursor, batch_size))
        rows = cur.fetchall()
        if rows:
            publisher.send([row[:4] for row in rows])
            cur.execute(MARK, ([row[0] for row in rows],))
    if rows:
        cursor = max(cursor, max(row[4] for row in rows))
    return len(rows)


if __name__ == "__main__":
    main(publish_batch_past_cursor)
