#!/usr/bin/env python3
"""The orders consumer with its inbox used as a durable queue (seed 000):
it stores each OrderPlaced in inbox_queue and acknowledges Kafka at once;
a poller in the same process applies the stored work later, claiming rows
with FOR UPDATE SKIP LOCKED, so any instance may apply any row.

  receive: INSERT INTO inbox_queue ... ON CONFLICT (message_id) DO NOTHING,
           commit; then the batch's offsets
  apply:   every half second, up to 5 pending rows FOR UPDATE SKIP LOCKED:
           take the stock off, ship, mark them done; one transaction

It is correct: a kill before the store's commit gets the batch again; a kill
after it loses nothing, the rows are durable; a kill mid-apply rolls the
apply back and leaves the rows pending for the next poll. But its effects
come after its offsets: its group has no lag long before its work is done.
So it declares its pending work ([system] pending in the .toml files), and
chaos waits for that to empty before it judges.

Deliberate bug, one flag:
  --stall-after-restart  an incarnation after the first never applies (as a
                         poison guard that gave up for good would): what it
                         stored waits forever. chaos must say `stalled
                         consumer`, not `missing effect` and not INCOMPLETE.
"""
import logging
import os
import signal
import sys
import time

import psycopg

import consumer as orders  # decode, distinct_events, take_stock, ship, record_rejected, make_consumer, connect

log = logging.getLogger("consumer_apply_later")

FLAGS = set(sys.argv[1:])
STALL_AFTER_RESTART = "--stall-after-restart" in FLAGS
APPLY_EVERY_SECS = 0.5
APPLY_AT_MOST = 5


def store(conn, msgs):
    """The receive half: the batch's orders into the queue, once each."""
    decoded = [orders.decode(m) for m in msgs]
    events = orders.distinct_events(decoded)
    with conn.transaction(), conn.cursor() as cur:
        if events:
            cur.execute(
                """INSERT INTO inbox_queue (message_id, order_id, sku, quantity)
                   SELECT * FROM unnest(%s::uuid[], %s::uuid[], %s::text[], %s::int[])
                   ON CONFLICT (message_id) DO NOTHING""",
                ([e.event_id for e in events], [e.order_id for e in events],
                 [e.sku for e in events], [e.quantity for e in events]))
        orders.record_rejected(cur, decoded)
    return len(events)


def apply_some(conn):
    """The apply half: up to APPLY_AT_MOST pending rows, oldest first, in
    one transaction. An empty claim ends with ROLLBACK: it changed nothing."""
    done = 0
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            """SELECT message_id, order_id, sku, quantity FROM inbox_queue
               WHERE status = 'pending' ORDER BY received_at LIMIT %s FOR UPDATE SKIP LOCKED""",
            (APPLY_AT_MOST,))
        rows = cur.fetchall()
        if not rows:
            raise psycopg.Rollback()
        events = [orders.OrderPlaced(r[0], r[1], r[2], r[3]) for r in rows]
        orders.take_stock(cur, events)
        orders.ship(cur, events)
        cur.execute("UPDATE inbox_queue SET status = 'done' WHERE message_id = ANY(%s)",
                    ([e.event_id for e in events],))
        done = len(rows)
    return done


def main():
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {os.environ.get('CHAOS_INSTANCE', '-')} %(message)s")
    unknown = FLAGS - {"--stall-after-restart"}
    if unknown:
        log.error("unknown arguments: %s", " ".join(sorted(unknown)))
        sys.exit(2)
    incarnation = int(os.environ.get("CHAOS_INCARNATION", "0"))
    applies = not (STALL_AFTER_RESTART and incarnation > 0)
    log.info("start: incarnation %d%s", incarnation, "" if applies else " (THE BUG: this one never applies)")
    batch_size = int(os.environ.get("CHAOS_BATCH_SIZE", "20"))
    conn = None
    while conn is None and not stopping:
        try:
            conn = orders.connect()
        except psycopg.Error as e:
            log.warning("database not reachable yet: %s", e)
            time.sleep(0.5)
    consumer = orders.make_consumer() if not stopping else None
    next_apply = time.monotonic()
    while not stopping:
        msgs = [m for m in consumer.consume(num_messages=batch_size, timeout=0.1) if m.error() is None]
        try:
            if conn.closed or conn.broken:
                conn = orders.connect()
            if msgs:
                n = store(conn, msgs)                # 1. stored, committed
                orders.commit_offsets(consumer, msgs)  # 2. only then the offsets
                log.info("stored %d of a batch of %d", n, len(msgs))
            if applies and time.monotonic() >= next_apply:
                next_apply = time.monotonic() + APPLY_EVERY_SECS
                done = apply_some(conn)            # 3. later: the effects
                if done:
                    log.info("applied %d", done)
        except psycopg.Error as e:
            # Rolled back: a stored batch comes again from Kafka (its offsets
            # were not committed); an apply leaves its rows pending.
            log.warning("rolled back: %s", e)
            if msgs:
                consumer = orders.rewind(consumer, msgs)
            time.sleep(0.2)
    log.info("SIGTERM: stopping")
    consumer.close()
    conn.close()


if __name__ == "__main__":
    main()
