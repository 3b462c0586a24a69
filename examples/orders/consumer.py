#!/usr/bin/env python3
"""The orders consumer: each OrderPlaced takes stock off and books a shipment, once.

Two handlers per OrderPlaced event:
  stock     UPDATE stock SET on_hand = on_hand - quantity for the order's sku
  shipping  INSERT one row into shipments, with the event's id

The inbox (processed_messages, primary key (message_id, handler)) makes them
happen once however often Kafka delivers the event. For each batch, in ONE
database transaction: insert the batch's (event_id, handler) pairs with
ON CONFLICT DO NOTHING RETURNING, apply the effects of exactly the pairs
that came back (newly claimed), commit; only then commit the Kafka offsets.
A kill before the database commit undoes everything; a kill after it and
before the offset commit gets the batch delivered again, and the inbox turns
the second delivery into a no-op.

Environment (docs/contract.md section 2): CHAOS_BROKERS, CHAOS_TOPIC,
CHAOS_GROUP, CHAOS_INSTANCE, CHAOS_SESSION_TIMEOUT_MS, CHAOS_BATCH_SIZE,
CHAOS_DATABASE_URL, CHAOS_SCHEMA.

Deliberate bugs, one flag each (see the broken-*.toml files):
  --stock-without-inbox  the stock handler is not registered in the inbox:
                         it runs on every delivery. A redelivery after a
                         commit takes the stock off twice.
  --email-without-key    the confirmation email is sent without an
                         idempotency key: a lost answer, retried, sends it twice.
  --inbox-first          the inbox rows are committed in a transaction of
                         their own before the effects run in a second one.
                         A kill between the two commits marks the event
                         handled when it never was: no shipment, no stock.
  --auto-commit          the Kafka client commits the offsets on its own
                         timer (enable.auto.commit, the default 5 s
                         interval) instead of after the database commit:
                         offsets can move past a batch whose transaction
                         then dies, and the batch is lost.
  --check-then-act       no unique guard: the inbox is a table of the
                         consumer's own without a unique key, read with a
                         SELECT, then the effects are applied and the rows
                         inserted with plain INSERTs. Two processes holding
                         the same event at once (a zombie and the new owner
                         of its partition) both find it unhandled and both
                         apply it: the stock is taken off twice.
  --retry-reapplies      a COMMIT that fails (an error, or the connection
                         lost while committing) is retried by applying the
                         batch's effects again on a new connection, with
                         the claim kept from the first attempt instead of
                         claiming the inbox again. If the first COMMIT did
                         happen, the stock is taken off twice; if it did
                         not, the effects land without their inbox rows and
                         a redelivery applies them again.
"""
import json
import urllib.error
import urllib.request
import logging
import os
import signal
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger("consumer")

FLAGS = set(sys.argv[1:])
KNOWN_FLAGS = {"--stock-without-inbox", "--inbox-first", "--email-without-key",
               "--auto-commit", "--check-then-act", "--retry-reapplies"}
STOCK_WITHOUT_INBOX = "--stock-without-inbox" in FLAGS
INBOX_FIRST = "--inbox-first" in FLAGS
# THE BUG (--auto-commit): offsets left to the client's timer.
AUTO_COMMIT = "--auto-commit" in FLAGS
# THE BUG (--check-then-act): an inbox read, then written, with no unique key.
CHECK_THEN_ACT = "--check-then-act" in FLAGS
# THE BUG (--retry-reapplies): a failed COMMIT retried by re-applying the
# effects under the claim remembered from the first attempt.
RETRY_REAPPLIES = "--retry-reapplies" in FLAGS
# THE BUG (--email-without-key): the confirmation call carries no
# idempotency key, so a retry after a lost answer sends a second email.
EMAIL_WITHOUT_KEY = "--email-without-key" in FLAGS

# With an email provider (CHAOS_PROVIDER_URL, docs/contract.md sections 4a
# and 8), each order also gets a confirmation email: a third handler, claimed
# in the inbox like the others, whose call goes out inside the transaction.
PROVIDER_URL = os.environ.get("CHAOS_PROVIDER_URL")
HANDLERS = ("stock", "shipping") + (("confirmation",) if PROVIDER_URL else ())
PROVIDER_TIMEOUT_SECS = 1.0


@dataclass(frozen=True)
class OrderPlaced:
    event_id: uuid.UUID
    order_id: uuid.UUID
    sku: str
    quantity: int


@dataclass(frozen=True)
class Rejected:
    partition: int
    offset: int
    event_id: str
    payload: str
    error: str


# Events of the order's life this consumer is told of and has no handler
# for (the Debezium example's service writes an OrderConfirmed after each
# OrderPlaced): nothing to do, and nothing wrong with them.
NO_HANDLER = {"OrderConfirmed"}


def decode(msg):
    """An OrderPlaced, None for an event with no handler, or a Rejected
    saying why the message is neither."""
    headers = dict(msg.headers() or [])
    raw_id = (headers.get("event_id") or b"").decode("utf-8", "replace")
    payload = (msg.value() or b"").decode("utf-8", "replace").replace("\x00", "")

    def reject(error):
        return Rejected(msg.partition(), msg.offset(), raw_id, payload, error)

    try:
        event_id = uuid.UUID(raw_id)
    except ValueError:
        return reject(f"event_id header is not a UUID: {raw_id!r}")
    event_type = (headers.get("event_type") or b"").decode("utf-8", "replace")
    if event_type in NO_HANDLER:
        return None
    if event_type != "OrderPlaced":
        return reject(f"unknown event_type {event_type!r}")
    try:
        body = json.loads(payload)
    except ValueError as e:
        return reject(f"value is not JSON: {e}")
    if not isinstance(body, dict) or set(body) != {"order_id", "sku", "quantity"}:
        return reject("value must have exactly order_id, sku and quantity")
    quantity = body["quantity"]
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 0 < quantity < 2**31:
        return reject(f"quantity is not a positive integer: {quantity!r}")
    if not isinstance(body["sku"], str) or not body["sku"]:
        return reject(f"sku is not a non-empty string: {body['sku']!r}")
    try:
        order_id = uuid.UUID(body["order_id"])
    except (ValueError, TypeError, AttributeError):
        return reject(f"order_id is not a UUID: {body['order_id']!r}")
    return OrderPlaced(event_id, order_id, body["sku"], quantity)


def distinct_events(decoded):
    """The batch's events, each once: a relay that crashed after its acks
    publishes an event twice, and both copies can land in one batch."""
    events, seen = [], set()
    for d in decoded:
        if isinstance(d, OrderPlaced) and d.event_id not in seen:
            seen.add(d.event_id)
            events.append(d)
    return events


def claim(cur, pairs):
    """Inserts the (event_id, handler) pairs into the inbox and returns the
    ones that were not there yet: the work this transaction now owns. A
    concurrent claimer of the same pair (a zombie still holding the batch)
    makes this wait for its outcome, then skip the pair if it committed."""
    if not pairs:
        return set()
    cur.execute(
        """INSERT INTO processed_messages (message_id, handler)
           SELECT * FROM unnest(%s::uuid[], %s::text[])
           ON CONFLICT DO NOTHING RETURNING message_id, handler""",
        ([p[0] for p in pairs], [p[1] for p in pairs]))
    return set(cur.fetchall())


def take_stock(cur, events):
    """The stock handler for these events: one UPDATE per sku, in sku order,
    so two consumers touching the same skus lock them in the same order and
    do not deadlock each other."""
    per_sku = defaultdict(int)
    for e in events:
        per_sku[e.sku] += e.quantity
    for sku in sorted(per_sku):
        cur.execute("UPDATE stock SET on_hand = on_hand - %s WHERE sku = %s", (per_sku[sku], sku))
        if cur.rowcount != 1:
            # An sku the warehouse does not carry: a real system would park
            # the order for a human. Logged, not fatal.
            log.warning("no stock row for sku %r", sku)


def ship(cur, events):
    """The shipping handler for these events: one shipment per order."""
    if events:
        cur.execute(
            """INSERT INTO shipments (order_id, message_id)
               SELECT * FROM unnest(%s::uuid[], %s::uuid[])""",
            ([e.order_id for e in events], [e.event_id for e in events]))


class ProviderFailed(Exception):
    """The provider did not say the email went out: the batch rolls back
    and comes again, and the retry carries the same idempotency key."""


def confirm(events):
    """The confirmation handler: one email per order, keyed by the event and
    the handler. Called inside the transaction, before its commit: a crash
    after the call and before the commit brings the event back, and the
    provider answers the repeated key without sending again."""
    for e in events:
        body = json.dumps({"to": f"order-{e.order_id}@customers.example", "subject": "Your order",
                           "order_id": str(e.order_id), "message_id": str(e.event_id)}).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": f"{e.event_id}:confirmation"}
        if EMAIL_WITHOUT_KEY:
            del headers["Idempotency-Key"]
        req = urllib.request.Request(f"{PROVIDER_URL}/v1/emails", data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=PROVIDER_TIMEOUT_SECS) as resp:
                resp.read()
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            # A 503, a 409 for a key in use, a lost answer or a timeout: the
            # email may or may not have gone; only a retry with the key is safe.
            raise ProviderFailed(f"order {e.order_id}: {err}") from err


def record_rejected(cur, decoded):
    rejected = [d for d in decoded if isinstance(d, Rejected)]
    for r in rejected:
        log.warning("rejected p%d@%d: %s", r.partition, r.offset, r.error)
        # ON CONFLICT: a redelivered bad message is recorded once.
        cur.execute(
            """INSERT INTO rejected_messages (topic_partition, topic_offset, event_id, payload, error)
               VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
            (r.partition, r.offset, r.event_id, r.payload, r.error))


def apply_claimed(cur, events, claimed, shipper=ship):
    take_stock(cur, [e for e in events if (e.event_id, "stock") in claimed])
    shipper(cur, [e for e in events if (e.event_id, "shipping") in claimed])
    if PROVIDER_URL:
        confirm([e for e in events if (e.event_id, "confirmation") in claimed])


def handle_correct(conn, events, decoded):
    pairs = [(e.event_id, h) for e in events for h in HANDLERS]
    with conn.transaction(), conn.cursor() as cur:
        claimed = claim(cur, pairs)
        apply_claimed(cur, events, claimed)
        record_rejected(cur, decoded)
    return len(claimed), len(pairs)


def handle_stock_without_inbox(conn, events, decoded):
    """THE BUG (--stock-without-inbox): only shipping is claimed in the
    inbox; the stock is taken off for every event of every delivery, as if
    the decrement were "obviously" harmless to run again. One transaction,
    so nothing is half done, but a redelivered batch decrements again."""
    pairs = [(e.event_id, "shipping") for e in events]
    with conn.transaction(), conn.cursor() as cur:
        claimed = claim(cur, pairs)
        take_stock(cur, events)                       # not guarded by the claim
        ship(cur, [e for e in events if (e.event_id, "shipping") in claimed])
        record_rejected(cur, decoded)
    return len(claimed), len(pairs)


def handle_inbox_first(conn, events, decoded):
    """THE BUG (--inbox-first): "mark the message as received" commits on
    its own, then the handlers run in a second transaction. If the process
    dies between the two commits, the redelivery finds the inbox rows, skips
    the handlers, and the order is never shipped nor taken off the stock."""
    pairs = [(e.event_id, h) for e in events for h in HANDLERS]
    with conn.transaction(), conn.cursor() as cur:
        claimed = claim(cur, pairs)
    # <- the window: claimed and committed, nothing applied yet
    with conn.transaction(), conn.cursor() as cur:
        apply_claimed(cur, events, claimed)
        record_rejected(cur, decoded)
    return len(claimed), len(pairs)


def ship_unless_shipped(cur, events):
    """The shipping handler of --check-then-act and --retry-reapplies, as it
    is written by someone who counts on the shipments' unique index rather
    than on the inbox: each shipment is inserted under a savepoint, and a
    unique violation is taken for "already shipped" and skipped. With the
    plain ship() above, a second shipment would fail the whole transaction,
    the stock decrement included, and the index would hide the mistake; a
    system without that index (or whose effects have no natural key) has
    nothing to hide it. The stock has no key to refuse a second decrement."""
    for e in events:
        try:
            with cur.connection.transaction():
                cur.execute("INSERT INTO shipments (order_id, message_id) VALUES (%s, %s)",
                            (e.order_id, e.event_id))
        except psycopg.errors.UniqueViolation:
            log.info("order %s already shipped", e.order_id)


# --check-then-act: the consumer's own inbox, made by the consumer in its
# default schema (the run's), as someone writes it who has not met
# ON CONFLICT: a log of what was handled, with no unique key.
HANDLED_TABLE = """CREATE TABLE IF NOT EXISTS handled_messages (
                       message_id uuid NOT NULL,
                       handler    text NOT NULL,
                       handled_at timestamptz NOT NULL DEFAULT now())"""
handled_table_ready = []


def handle_check_then_act(conn, events, decoded):
    """THE BUG (--check-then-act): "have I handled this?" is a SELECT, and
    "I handled it" a plain INSERT, with nothing unique between them. One
    transaction, at PostgreSQL's default READ COMMITTED: it sees what other
    transactions had committed when each statement began, and nothing makes
    a second reader of the same event wait. Two processes holding the same
    event at once (a consumer paused past its session timeout wakes up a
    zombie with its batch in hand while the new owner of its partition
    handles the same messages) both find it unhandled and both apply it."""
    if not handled_table_ready:
        # Two consumers starting at once can race on CREATE TABLE IF NOT
        # EXISTS; the loser's error rolls the batch back and it comes again.
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(HANDLED_TABLE)
        handled_table_ready.append(True)
    pairs = [(e.event_id, h) for e in events for h in HANDLERS]
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT message_id, handler FROM handled_messages WHERE message_id = ANY(%s)",
                    ([e.event_id for e in events],))
        seen = set(cur.fetchall())
        todo = {p for p in pairs if p not in seen}
        # <- the window: another process can read "not handled" until this commits
        apply_claimed(cur, events, todo, ship_unless_shipped)
        if todo:
            cur.executemany("INSERT INTO handled_messages (message_id, handler) VALUES (%s, %s)",
                            sorted(todo, key=lambda p: (str(p[0]), p[1])))
        record_rejected(cur, decoded)
    return len(todo), len(pairs)


def handle_retry_reapplies(conn, events, decoded):
    """THE BUG (--retry-reapplies): the claim and the effects are one
    transaction, as they should be, but a COMMIT that fails is taken for a
    blip: "the claim came back, so these pairs are ours", and the effects
    are applied again on a new connection under the claim remembered from
    the first attempt, without claiming the inbox again. A COMMIT can fail
    after it took effect (the connection lost before its acknowledgement
    came): the retry then takes the stock off a second time. If it did not
    take effect, the retry's effects land without their inbox rows, and the
    next delivery of the batch claims and applies them again."""
    pairs = [(e.event_id, h) for e in events for h in HANDLERS]
    claimed, committing = set(), False
    try:
        with conn.transaction(), conn.cursor() as cur:
            claimed = claim(cur, pairs)
            apply_claimed(cur, events, claimed, ship_unless_shipped)
            record_rejected(cur, decoded)
            committing = True
    except psycopg.OperationalError as e:
        if not committing:
            raise  # failed before the COMMIT: rolled back, the batch comes again
        log.warning("COMMIT failed (%s); the %d claimed pairs are ours, applying them again "
                    "on a new connection", e, len(claimed))
        with connect() as retry, retry.transaction(), retry.cursor() as cur:
            apply_claimed(cur, events, claimed, ship_unless_shipped)
            record_rejected(cur, decoded)
    return len(claimed), len(pairs)


if STOCK_WITHOUT_INBOX:
    HANDLE = handle_stock_without_inbox
elif INBOX_FIRST:
    HANDLE = handle_inbox_first
elif CHECK_THEN_ACT:
    HANDLE = handle_check_then_act
elif RETRY_REAPPLIES:
    HANDLE = handle_retry_reapplies
else:
    HANDLE = handle_correct


def handle_batch(conn, msgs):
    """Applies a batch; safe to call again with the same messages. Retries
    what PostgreSQL asks to retry; any other error propagates."""
    decoded = [decode(m) for m in msgs]
    events = distinct_events(decoded)
    for attempt in range(8):
        try:
            claimed, pairs = HANDLE(conn, events, decoded)
            log.info("batch of %d: %d of %d pairs claimed", len(msgs), claimed, pairs)
            return
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as e:
            # Rolled back as a whole; nothing applied. Two members holding
            # overlapping batches during a rebalance can lock inbox rows in
            # different orders; trying again is safe.
            log.warning("%s; retrying the batch (attempt %d)", type(e).__name__, attempt + 1)
            time.sleep(min(0.02 * 2 ** attempt, 0.5))
    raise RuntimeError("batch kept deadlocking")


def is_fatal(err):
    # A fatal error can reach us as an error whose code is _FATAL without
    # its fatal() flag set.
    return err.fatal() or err.code() == KafkaError._FATAL


def commit_offsets(consumer, msgs):
    """Commits the batch's offsets, synchronously, after the database commit.

    The batch's own offsets, never commit() without arguments: that commits
    every offset the client has stored, and a batch that was rolled back
    and rewound is stored as consumed. A later batch of another partition
    would then commit past it, and a kill before it comes again would lose
    it. (chaos found this one: tests/e2e/declared.rs.)"""
    last = {}
    for m in msgs:
        tp = (m.topic(), m.partition())
        last[tp] = max(last.get(tp, m.offset()), m.offset())
    offsets = [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
    try:
        # A zombie whose partitions moved is refused; that is fine, the new
        # owner redelivers and the inbox absorbs it.
        consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as e:
        if is_fatal(e.args[0]):
            raise
        log.warning("offset commit failed, the batch will come again: %s", e)


def make_consumer():
    consumer = Consumer({
        "bootstrap.servers": os.environ["CHAOS_BROKERS"],
        "group.id": os.environ["CHAOS_GROUP"],
        # Static membership: a restarted process in the same slot takes its
        # predecessor's partitions at once, without waiting out a session.
        "group.instance.id": os.environ["CHAOS_INSTANCE"],
        # Offsets are committed by hand, after the database: never on a timer.
        # (--auto-commit, THE BUG: the client's timer commits them, every
        # auto.commit.interval.ms, left at its default of 5 s, whatever the
        # batch in hand has come to.)
        "enable.auto.commit": AUTO_COMMIT,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": int(os.environ.get("CHAOS_SESSION_TIMEOUT_MS", "6000")),
        "client.id": os.environ["CHAOS_INSTANCE"],
    })
    consumer.subscribe([os.environ["CHAOS_TOPIC"]])
    return consumer


def connect():
    return psycopg.connect(os.environ["CHAOS_DATABASE_URL"], autocommit=True, connect_timeout=5,
                           options=f"-c search_path={os.environ['CHAOS_SCHEMA']}")


def main():
    # SIGTERM raises a flag: the batch in hand is finished first. Installed
    # first, so that a SIGTERM during start-up is a clean exit too.
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {os.environ.get('CHAOS_INSTANCE', '-')} %(message)s")
    unknown = FLAGS - KNOWN_FLAGS
    if unknown:
        log.error("unknown arguments: %s", " ".join(sorted(unknown)))
        sys.exit(2)
    log.info("start: incarnation %s%s", os.environ.get("CHAOS_INCARNATION", "?"),
             "".join(f" ({f})" for f in sorted(FLAGS)))
    batch_size = int(os.environ.get("CHAOS_BATCH_SIZE", "20"))

    # The database first: the harness strikes a process only once its
    # session shows, and a consumer without its database has nothing to do.
    conn = None
    while conn is None and not stopping:
        try:
            conn = connect()
        except psycopg.Error as e:
            log.warning("database not reachable yet: %s", e)
            time.sleep(0.5)
    consumer = make_consumer() if not stopping else None

    while not stopping:
        msgs = []
        for m in consumer.consume(num_messages=batch_size, timeout=0.5):
            if m.error() is None:
                msgs.append(m)
            elif is_fatal(m.error()):
                # Fenced (another process took this static member's place)
                # or the like: this client is done. A fresh one rejoins;
                # exiting would end the run.
                log.warning("fatal consumer error, starting a new consumer: %s", m.error())
                msgs = []
                consumer = restart_consumer(consumer)
                break
            elif m.error().code() != KafkaError._PARTITION_EOF:
                log.warning("consumer: %s", m.error())
        if not msgs:
            continue
        try:
            if conn.closed or conn.broken:
                conn = connect()
            handle_batch(conn, msgs)      # 1. inbox and effects, committed
            if not AUTO_COMMIT:             # (--auto-commit: the client's timer does it)
                commit_offsets(consumer, msgs)  # 2. only then the batch's offsets
        except (psycopg.Error, RuntimeError, ProviderFailed) as e:
            # Rolled back. Rewind to the last committed offsets, so the
            # batch comes again rather than being skipped by the next poll.
            log.warning("batch rolled back, it will come again: %s", e)
            consumer = rewind(consumer, msgs)
            time.sleep(0.2)
        except KafkaException as e:
            log.warning("fatal offset commit error, starting a new consumer: %s", e)
            consumer = restart_consumer(consumer)
    log.info("SIGTERM: stopping")
    if consumer is not None:
        consumer.close()
    if conn is not None:
        conn.close()


def rewind(consumer, msgs):
    """Moves back to the start of a batch that was rolled back, so that the
    next poll hands it over again instead of the messages after it."""
    first = {}
    for m in msgs:
        tp = (m.topic(), m.partition())
        first[tp] = min(first.get(tp, m.offset()), m.offset())
    try:
        for (topic, partition), offset in first.items():
            consumer.seek(TopicPartition(topic, partition, offset))
        return consumer
    except KafkaException as e:
        # Not ours any more (a rebalance took it): whoever has it now reads
        # from the committed offset anyway. A fresh client is the simple way
        # to drop whatever this one still had in hand.
        log.warning("rewind failed (%s), starting a new consumer", e)
        return restart_consumer(consumer)


def restart_consumer(consumer):
    """A new client in place of one whose position can no longer be trusted
    (it consumed a batch that was rolled back) or that is fenced. The new
    one starts from the group's committed offsets."""
    try:
        consumer.close()
    except Exception as e:  # a fenced client may refuse even this
        log.warning("closing the consumer: %s", e)
    return make_consumer()


if __name__ == "__main__":
    main()
