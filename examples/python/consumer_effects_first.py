#!/usr/bin/env python3
"""BROKEN ON PURPOSE: commits each effect as it goes (autocommit, one
statement at a time) and records them in the inbox in a later transaction.

It has an inbox and checks it before acting, so it looks safe; it is the
shape "process the message, then mark it processed" takes in a lot of code.
But a kill after the effects' commit and before the inbox's leaves effects
with no inbox row: the redelivered message passes the check and its receipt
is sent, and its points credited, a second time. `chaos run
effects-first.toml` reports "duplicate effect" and exits 1.
"""
from consumer import HANDLERS, DeadLetter, apply, decode, log, record_dead_letter, run


def handle_message(conn, msg):
    event = decode(msg)
    if isinstance(event, DeadLetter):
        log.warning("dead letter %s: %s", event.message_id, event.error)
        with conn.transaction(), conn.cursor() as cur:
            record_dead_letter(cur, event)
        return
    with conn.cursor() as cur:
        # The check: which handlers already took this event?
        cur.execute("SELECT handler FROM inbox WHERE message_id = %s", (event.event_id,))
        done = {row[0] for row in cur.fetchall()}
    todo = [h for h in HANDLERS[event.event_type] if h not in done]
    if not todo:
        return
    # Each effect is its own statement on an autocommit connection, as
    # repository calls in many services are: each commits on its own.
    with conn.cursor() as cur:
        for handler in todo:
            apply(cur, event, handler)
    # BUG: a kill anywhere above keeps the effects committed so far and
    # loses the mark below.
    with conn.transaction(), conn.cursor() as cur:
        for handler in todo:
            cur.execute("INSERT INTO inbox (message_id, handler) VALUES (%s, %s) "
                        "ON CONFLICT DO NOTHING", (event.event_id, handler))


def handle_batch(conn, msgs):
    for msg in msgs:
        handle_message(conn, msg)


if __name__ == "__main__":
    run(handle_batch)  # the offsets after the database, as they should be
