#!/usr/bin/env python3
"""A notifier that applies each payment event's effects exactly once.

It follows docs/contract.md: read a batch from Kafka, then in ONE database
transaction claim every (event, handler) pair in the inbox and apply the
effects of the pairs that were newly claimed; commit; only then commit the
Kafka offsets. A kill anywhere in that sequence is safe: before the database
commit nothing happened, and after it the redelivered batch finds its inbox
rows and does nothing.

Run it with `chaos run examples/python/consumer.toml` (see README.md).
"""
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException

log = logging.getLogger("consumer")

# Which handlers each event feeds, and the status it gives the projection.
HANDLERS = {
    "payment.authorized": ("projection",),
    "payment.captured": ("projection", "receipts", "loyalty"),
}
STATUS = {"payment.authorized": "authorized", "payment.captured": "captured"}
FIELDS = {"payment_id": str, "account_id": int, "amount_cents": int}


@dataclass(frozen=True)
class Event:
    event_id: uuid.UUID
    event_type: str
    payment_id: uuid.UUID
    account_id: int
    amount_cents: int
    partition: int  # the loyalty stripe


@dataclass(frozen=True)
class DeadLetter:
    message_id: str
    partition: int
    offset: int
    payload: str
    error: str


def decode(msg):
    """Returns an Event, or a DeadLetter saying why the message is not one."""
    headers = dict(msg.headers() or [])
    raw_id = (headers.get("event_id") or b"").decode("utf-8", "replace")
    payload = (msg.value() or b"").decode("utf-8", "replace").replace("\x00", "")

    def dead(error):
        message_id = raw_id or f"p{msg.partition()}-o{msg.offset()}"
        return DeadLetter(message_id, msg.partition(), msg.offset(), payload, error)

    try:
        event_id = uuid.UUID(raw_id)
    except ValueError:
        return dead(f"event_id header is not a UUID: {raw_id!r}")
    event_type = (headers.get("event_type") or b"").decode("utf-8", "replace")
    if event_type not in HANDLERS:
        return dead(f"unknown event_type {event_type!r}")
    try:
        value = json.loads(payload)
    except ValueError as e:
        return dead(f"value is not JSON: {e}")
    # Strict: exactly these three fields, of these types (bool is an int in
    # Python, so it is excluded by hand).
    if not isinstance(value, dict) or set(value) != set(FIELDS):
        return dead(f"value must have exactly the fields {sorted(FIELDS)}")
    for name, kind in FIELDS.items():
        if not isinstance(value[name], kind) or isinstance(value[name], bool):
            return dead(f"{name} has the wrong type: {value[name]!r}")
    # Outside the columns' range the insert would fail the whole batch; and
    # the payment service only ever writes positive amounts.
    if not (-2**31 <= value["account_id"] < 2**31 and 0 < value["amount_cents"] < 2**63):
        return dead("account_id or amount_cents out of range")
    try:
        payment_id = uuid.UUID(value["payment_id"])
    except ValueError:
        return dead(f"payment_id is not a UUID: {value['payment_id']!r}")
    return Event(event_id, event_type, payment_id, value["account_id"],
                 value["amount_cents"], msg.partition())


class EmailFailed(Exception):
    """The provider did not confirm the email: roll back, try again with the same key."""


def email_key(event):
    """The receipt email's idempotency key: the message and the handler, the
    same as its inbox claim, so a retry or a redelivery carries it again and
    the provider sends nothing new."""
    return f"{event.event_id}:receipts"


# The key each email carries; the broken example without a key replaces it.
EMAIL_KEY = email_key

# No proxy from the environment: the provider is on 127.0.0.1.
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def send_receipt_email(event):
    """The receipt as an email, through the provider chaos runs
    (CHAOS_PROVIDER_URL, docs/contract.md section 4a). Called inside the
    receipt's transaction, before its commit: any failure raises, and the
    transaction rolls back."""
    url = os.environ.get("CHAOS_PROVIDER_URL")
    if not url:
        return
    body = json.dumps({
        "to": f"account-{event.account_id}@customers.example",
        "subject": "Your receipt",
        "payment_id": str(event.payment_id),
        "message_id": str(event.event_id),
        "amount_cents": event.amount_cents,
    }).encode()
    headers = {"Content-Type": "application/json"}
    key = EMAIL_KEY(event)
    if key:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(f"{url}/v1/emails", data=body, headers=headers, method="POST")
    try:
        with _http.open(request, timeout=2) as answer:
            answer.read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        # A refusal (HTTPError is a URLError), a reset, a timeout: the email
        # may or may not have gone out; only a retry with the same key is safe.
        raise EmailFailed(f"receipt email of payment {event.payment_id}: {e}") from e


def apply(cur, event, handler):
    """One handler's effect. Only called for a pair newly claimed in the inbox."""
    if handler == "projection":
        # Never goes back: only a capture may overwrite an existing row, and
        # only one that is still 'authorized'.
        cur.execute(
            """INSERT INTO payment_projection (payment_id, status, event_id)
               VALUES (%s, %s, %s)
               ON CONFLICT (payment_id) DO UPDATE
                 SET status = EXCLUDED.status, event_id = EXCLUDED.event_id
                 WHERE payment_projection.status = 'authorized'
                   AND EXCLUDED.status = 'captured'""",
            (event.payment_id, STATUS[event.event_type], event.event_id))
    elif handler == "receipts":
        cur.execute("INSERT INTO receipts (payment_id, message_id) VALUES (%s, %s)",
                    (event.payment_id, event.event_id))
        send_receipt_email(event)
    elif handler == "loyalty":
        # Striped by partition: a partition has one owner at a time, so two
        # instances never queue behind each other's counter row.
        cur.execute(
            """INSERT INTO loyalty_points (account_id, stripe, points) VALUES (%s, %s, %s)
               ON CONFLICT (account_id, stripe)
                 DO UPDATE SET points = loyalty_points.points + EXCLUDED.points""",
            (event.account_id, event.partition, event.amount_cents))
        cur.execute("INSERT INTO loyalty_credits (event_id, account_id, points) VALUES (%s, %s, %s)",
                    (event.event_id, event.account_id, event.amount_cents))


def record_dead_letter(cur, dl):
    # ON CONFLICT: a redelivered poison message is recorded once.
    cur.execute(
        """INSERT INTO dead_letters (message_id, topic_partition, topic_offset, payload, error)
           VALUES (%s, %s, %s, %s, %s) ON CONFLICT (message_id) DO NOTHING""",
        (dl.message_id, dl.partition, dl.offset, dl.payload, dl.error))


def distinct_events(decoded):
    """The batch's events, each once. A batch may hold two copies of one
    event (a relay republished it): the first is kept. Offset order is kept,
    so authorized-then-captured stays so."""
    events, seen = [], set()
    for d in decoded:
        if isinstance(d, Event) and d.event_id not in seen:
            seen.add(d.event_id)
            events.append(d)
    return events


def claim(cur, pairs):
    """Inserts the (event, handler) pairs into the inbox; returns those no
    one had claimed before."""
    if not pairs:
        return set()
    cur.execute(
        """INSERT INTO inbox (message_id, handler)
           SELECT * FROM unnest(%s::uuid[], %s::text[])
           ON CONFLICT DO NOTHING RETURNING message_id, handler""",
        ([p[0] for p in pairs], [p[1] for p in pairs]))
    return set(cur.fetchall())


def apply_claimed(cur, events, claimed, decoded):
    """The effects of the claimed pairs, and the batch's dead letters."""
    for e in events:
        for h in HANDLERS[e.event_type]:
            if (e.event_id, h) in claimed:
                apply(cur, e, h)
    for d in decoded:
        if isinstance(d, DeadLetter):
            log.warning("dead letter %s: %s", d.message_id, d.error)
            record_dead_letter(cur, d)


def handle_batch(conn, msgs):
    """Applies a batch in one transaction. Safe to call again with the same messages."""
    decoded = [decode(m) for m in msgs]
    events = distinct_events(decoded)
    pairs = [(e.event_id, h) for e in events for h in HANDLERS[e.event_type]]
    for attempt in range(8):
        try:
            with conn.transaction(), conn.cursor() as cur:
                # Claim: the rows that come back are the pairs no one applied
                # before. A concurrent claimer (a zombie holding the same
                # batch) makes this wait for its commit, then skip.
                claimed = claim(cur, pairs)
                apply_claimed(cur, events, claimed, decoded)
            log.info("batch of %d: %d pairs claimed of %d", len(msgs), len(claimed), len(pairs))
            return
        except psycopg.errors.DeadlockDetected:
            # Rolled back as a whole; nothing applied. Two instances holding
            # overlapping batches during a rebalance can lock rows in
            # different orders; trying again is safe.
            log.warning("deadlock, retrying batch (attempt %d)", attempt + 1)
        except EmailFailed as e:
            # Rolled back: receipts and claims undone, the email perhaps
            # sent. The retry carries the same idempotency key.
            log.warning("%s; retrying batch (attempt %d)", e, attempt + 1)
            time.sleep(min(0.02 * 2 ** attempt, 0.5))
    raise RuntimeError("batch kept failing")


def is_fatal(err):
    # A fatal error reaches the application as an error event whose code is
    # _FATAL, and its fatal() flag is not always set.
    return err.fatal() or err.code() == KafkaError._FATAL


def commit_offsets(consumer):
    """Commits what was consumed, synchronously. Call only after the database commit."""
    try:
        # Without arguments: the positions of the partitions this consumer
        # still owns. A zombie whose partitions were given away is refused
        # by the broker; that is fine, the new owner redelivers and the
        # inbox absorbs it.
        consumer.commit(asynchronous=False)
    except KafkaException as e:
        if is_fatal(e.args[0]):
            raise
        log.warning("offset commit failed, messages will come again: %s", e)


def make_consumer(**overrides):
    consumer = Consumer({
        "bootstrap.servers": os.environ["CHAOS_BROKERS"],
        "group.id": os.environ["CHAOS_GROUP"],
        # Static membership: a restarted process in the same slot gets its
        # partitions back at once instead of after a rebalance.
        "group.instance.id": os.environ["CHAOS_INSTANCE"],
        "enable.auto.commit": False,  # offsets are committed after the database
        "auto.offset.reset": "earliest",
        # The harness's session timeout (6 s unless the scenario says):
        # short, so a dead member is noticed fast, and the one its pauses
        # outlast to make this process a zombie.
        "session.timeout.ms": int(os.environ.get("CHAOS_SESSION_TIMEOUT_MS", "6000")),
        **overrides,
    })
    consumer.subscribe([os.environ["CHAOS_TOPIC"]])
    return consumer


def connect():
    # PGAPPNAME is read by libpq itself. autocommit: transactions are opened
    # explicitly with conn.transaction(), so no session sits idle in one.
    return psycopg.connect(os.environ["CHAOS_DATABASE_URL"], autocommit=True,
                           options=f"-c search_path={os.environ['CHAOS_SCHEMA']}")


def batches(consumer, batch_size):
    """Yields lists of messages until SIGTERM; the batch in hand is finished first."""
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    while not stopping:
        msgs = []
        for m in consumer.consume(num_messages=batch_size, timeout=0.5):
            if m.error() is None:
                msgs.append(m)
            elif is_fatal(m.error()):
                raise KafkaException(m.error())  # e.g. fenced: this consumer is done
            elif m.error().code() != KafkaError._PARTITION_EOF:
                log.warning("consumer: %s", m.error())
        if msgs:
            yield msgs
    log.info("SIGTERM: stopping")


def setup(**overrides):
    """The consumer (its settings changed by `overrides`), the connection, the batch size."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {os.environ.get('CHAOS_INSTANCE', '-')} %(message)s")
    log.info("start: incarnation %s", os.environ.get("CHAOS_INCARNATION", "?"))
    return make_consumer(**overrides), connect(), int(os.environ.get("CHAOS_BATCH_SIZE", "20"))


def run(handle):
    """The consumer's loop: `handle(conn, msgs)` for each batch, then the
    offsets. The broken examples whose mistake is inside the handling reuse
    it; those whose mistake is the loop's order write their own."""
    consumer, conn, batch_size = setup()
    try:
        for msgs in batches(consumer, batch_size):
            handle(conn, msgs)        # 1. effects and inbox, one transaction
            commit_offsets(consumer)  # 2. only then the offsets
    finally:
        consumer.close()
        conn.close()


def main():
    run(handle_batch)


if __name__ == "__main__":
    main()
