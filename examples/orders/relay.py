#!/usr/bin/env python3
"""The orders relay: publishes order_events to Kafka, never losing one.

In ONE database transaction: claim a batch of unpublished rows (FOR UPDATE
SKIP LOCKED, oldest first), produce them with an idempotent producer, wait
until the broker has acknowledged every message, and only then set
published_at and commit. A kill anywhere before that commit leaves the rows
unpublished (PostgreSQL rolls the claim back when the connection drops), so
they go out again, perhaps twice; the consumer's inbox absorbs the copy. A
row is marked only once it is on the topic.

Each message: key = order_id as text (so all of an order's events share a
partition), headers event_id and event_type, value = body::text exactly as
PostgreSQL renders it.

Environment (docs/contract.md sections 2 and 7): CHAOS_BROKERS, CHAOS_TOPIC,
CHAOS_DATABASE_URL, CHAOS_SCHEMA, CHAOS_BATCH_SIZE, CHAOS_INSTANCE.

--delete: delete the published rows instead of setting published_at (the
outbox stays small without a cleanup job); declared with
`published = "delete"` (orders-delete.toml).

--envelope: publish order_envelopes instead, the envelope outbox that
`service.py --envelope` writes (orders-envelope.toml): each row is one
serialized envelope, decoded here into the same message as above (key,
headers event_id and event_type, value the event's body); rows are claimed
and marked by their row_id.

Deliberate bugs, one flag each:
  --stall-after-restart  an incarnation after the first never publishes
                         (as a relay whose cursor got stuck would): the rows
                         written after its restart wait forever. chaos must
                         say `stalled relay`, not `missing effect` and not
                         INCOMPLETE (broken-relay-stalls.toml).
  --seq-cursor           THE CLASSIC MISTAKE OF AN INSERT-ORDERED CURSOR: the
                         relay keeps its read position as the highest `seq`
                         it has published, in a one-row table of its own
                         (relay_cursor, created if missing), and reads
                         `WHERE seq > cursor ORDER BY seq`. It looks right:
                         seq only grows, the cursor survives restarts, the
                         relays take turns on the cursor row (FOR UPDATE),
                         and the produce, the acks, the mark and the cursor's
                         advance are one transaction. But seq is taken at
                         INSERT, and transactions commit in their own order:
                         a service transaction that took seq 41 and commits
                         after the one that took seq 42 was read becomes
                         visible below the cursor, and no read ever looks
                         at it again. Its order is never published, shipped
                         or taken off the stock. chaos must say `stalled
                         relay` and `unpublished leftover`
                         (broken-relay-seq-cursor.toml).
  --mark-first           marks the claimed rows published and commits the
                         mark, then produces them and waits for the acks
                         ("don't hold row locks while waiting on the
                         broker"). Between that commit and the acks the
                         batch exists only in this process: a kill there
                         loses it, and no relay claims the rows again.
                         chaos must say `lost event`
                         (broken-relay-mark-first.toml).
  --mark-range           produces its claimed batch and waits for every
                         ack, as it should, but marks by range: every
                         unpublished row up to the highest `seq` it sent
                         (`WHERE seq <= max_sent AND published_at IS
                         NULL`), not the rows it sent. A row below that seq
                         that it never sent is marked with them: one whose
                         transaction committed after the claim (seq is
                         taken at INSERT), or one another relay claimed and
                         then gave back (killed, or its delivery failed).
                         chaos must say `lost event`
                         (broken-relay-mark-range.toml).
"""
import json
import logging
import os
import signal
import sys
import time

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger("relay")

# SKIP LOCKED: two relays run at once and never wait on each other's
# batches. ORDER BY seq publishes the oldest first; published_at IS NULL,
# not "seq > the last one I saw", decides what is left, because a
# transaction that took a low seq may commit after a higher one.
CLAIM = """SELECT event_id, order_id, event_type, body::text FROM order_events
           WHERE published_at IS NULL ORDER BY seq LIMIT %s
           FOR UPDATE SKIP LOCKED"""
# clock_timestamp(), not now(): the moment of the mark, not of the claim.
MARK = "UPDATE order_events SET published_at = clock_timestamp() WHERE event_id = ANY(%s)"
# --delete: the rows go once they are on the topic.
FLAGS = set(sys.argv[1:])
if "--delete" in FLAGS:
    MARK = "DELETE FROM order_events WHERE event_id = ANY(%s)"
STALL_AFTER_RESTART = "--stall-after-restart" in FLAGS
SEQ_CURSOR = "--seq-cursor" in FLAGS
MARK_FIRST = "--mark-first" in FLAGS
MARK_RANGE = "--mark-range" in FLAGS

# --mark-range (THE BUG): the claim also reads seq, and the mark covers
# everything unpublished up to the highest seq sent.
CLAIM_WITH_SEQ = """SELECT event_id, order_id, event_type, body::text, seq FROM order_events
                    WHERE published_at IS NULL ORDER BY seq LIMIT %s
                    FOR UPDATE SKIP LOCKED"""
MARK_UP_TO = """UPDATE order_events SET published_at = clock_timestamp()
                WHERE seq <= %s AND published_at IS NULL"""

# --seq-cursor (THE BUG): the read position, the highest seq published, in a
# one-row table the relay makes itself in its default schema (search_path is
# the run's schema), so that it outlives a restart.
CURSOR_TABLE = """CREATE TABLE IF NOT EXISTS relay_cursor (
                      one      boolean PRIMARY KEY DEFAULT true CHECK (one),
                      last_seq bigint NOT NULL)"""
CURSOR_ROW = "INSERT INTO relay_cursor (one, last_seq) VALUES (true, 0) ON CONFLICT (one) DO NOTHING"
# The relays take turns: whoever holds the cursor row reads past it.
CURSOR_LOCK = "SELECT last_seq FROM relay_cursor FOR UPDATE"
READ_PAST = """SELECT event_id, order_id, event_type, body::text, seq FROM order_events
               WHERE seq > %s ORDER BY seq LIMIT %s"""
CURSOR_ADVANCE = "UPDATE relay_cursor SET last_seq = %s"
# --envelope: the same claim and mark on the envelope outbox, by row_id.
ENVELOPE = "--envelope" in FLAGS
if ENVELOPE:
    CLAIM = """SELECT row_id, envelope FROM order_envelopes
               WHERE published_at IS NULL ORDER BY row_id LIMIT %s
               FOR UPDATE SKIP LOCKED"""
    MARK = "UPDATE order_envelopes SET published_at = clock_timestamp() WHERE row_id = ANY(%s)"
    if "--delete" in FLAGS:
        MARK = "DELETE FROM order_envelopes WHERE row_id = ANY(%s)"

IDLE_SLEEP_SECS = 0.02   # nothing to publish: look again soon
RETRY_SLEEP_SECS = 0.2   # after a failed batch: do not spin on a sick broker
MESSAGE_TIMEOUT_MS = 30000


class DeliveryFailed(Exception):
    """Some message of the batch has no ack: the batch must not be marked."""


class Publisher:
    def __init__(self, brokers, topic):
        self.topic = topic
        self.fatal = None
        self.producer = Producer({
            "bootstrap.servers": brokers,
            # Idempotence: the broker drops the copies of its own retries,
            # and a partition keeps its order across them. acks=all is
            # implied; written out because an ack must mean "stored".
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            # A message the broker never takes is reported failed after
            # this, so the flush below never waits much longer.
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            "client.id": os.environ.get("CHAOS_INSTANCE", "orders-relay"),
            "error_cb": self._on_error,
            # The default partitioner hashes the key: one order, one partition.
        })

    def _note(self, err):
        # A fatal error (the idempotent producer lost its sequence) makes
        # this producer unusable; the loop replaces it.
        if err.fatal() or err.code() == KafkaError._FATAL:
            self.fatal = err

    def _on_error(self, err):
        self._note(err)
        log.warning("producer: %s", err)

    def send(self, rows):
        """Returns once the broker has acknowledged every row, or raises."""
        failures = []

        def report(err, _msg):
            if err is not None:
                self._note(err)
                failures.append(err)

        try:
            for event_id, order_id, event_type, body in rows:
                self.producer.produce(
                    self.topic,
                    key=str(order_id),  # str(UUID): the 36-character lowercase form
                    value=body.encode("utf-8"),  # as PostgreSQL rendered it, not re-serialized
                    headers=[("event_id", str(event_id)), ("event_type", event_type)],
                    on_delivery=report)
        except KafkaException as e:
            self._note(e.args[0])
            raise DeliveryFailed(f"produce refused: {e}") from e
        except BufferError as e:  # the local queue is full
            raise DeliveryFailed(f"produce refused: {e}") from e
        # flush() serves the delivery reports and returns how many messages
        # still have none.
        left = self.producer.flush(MESSAGE_TIMEOUT_MS / 1000 + 5)
        if left:
            raise DeliveryFailed(f"{left} of {len(rows)} messages without a delivery report")
        if failures:
            raise DeliveryFailed(f"{len(failures)} of {len(rows)} deliveries failed: {failures[0]}")


def message(row):
    """A claimed row as (event_id, key, event_type, value): an order_events
    row already is one; an envelope is decoded from its UTF-8 JSON."""
    if not ENVELOPE:
        return row
    _row_id, envelope = row
    e = json.loads(bytes(envelope).decode("utf-8"))
    return e["eventId"], e["key"], e["type"], json.dumps(e["body"])


def publish_batch(conn, publisher, batch_size):
    """Claims, publishes and marks one batch; returns its size (0: nothing to do)."""
    # Any exception inside the block rolls the claim back: the rows stay
    # unpublished and are claimed again. What of them reached the broker is
    # then published twice, which is allowed; losing one is not.
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(CLAIM, (batch_size,))
        rows = cur.fetchall()
        if not rows:
            # Nothing claimed: end the transaction with a ROLLBACK, not a
            # COMMIT. It wrote nothing either way, and the fault proxy's
            # kill-after-commit then only strikes commits that marked rows.
            raise psycopg.Rollback()
        publisher.send([message(r) for r in rows])       # 1. every ack...
        cur.execute(MARK, ([row[0] for row in rows],))   # 2. ...then the mark
    return len(rows)                                     # 3. committed here


def publish_batch_mark_first(conn, publisher, batch_size):
    """THE BUG (--mark-first): claims and marks in one transaction and
    commits, so no row lock is held while the broker is waited for; then
    produces the batch and waits for every ack. A kill after the COMMIT and
    before the acks, or a delivery that fails, leaves rows marked published
    that are not on the topic, and nothing ever claims them again."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(CLAIM, (batch_size,))
        rows = cur.fetchall()
        if not rows:
            raise psycopg.Rollback()
        cur.execute(MARK, ([row[0] for row in rows],))   # 1. the mark, committed...
    publisher.send([message(r) for r in rows])           # 2. ...then the produce and its acks
    return len(rows)


def publish_batch_mark_range(conn, publisher, batch_size):
    """THE BUG (--mark-range): claims, produces and waits for every ack in
    one transaction, as publish_batch does, then marks "everything up to
    where I got": every unpublished row whose seq is at most the highest
    seq it sent. Rows it never sent are in that range: an order committed
    after the claim with a lower seq (its transaction took the seq first),
    and rows another relay claimed and gave back (the UPDATE waits for that
    relay's locks; if it rolls back, they are marked here)."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(CLAIM_WITH_SEQ, (batch_size,))
        rows = cur.fetchall()
        if not rows:
            raise psycopg.Rollback()
        publisher.send([row[:4] for row in rows])
        cur.execute(MARK_UP_TO, (max(row[4] for row in rows),))
    return len(rows)


def ensure_cursor(conn):
    """--seq-cursor: the cursor table and its one row, made if missing. Two
    relays starting at once can race on CREATE TABLE IF NOT EXISTS; the
    loser's error goes to the loop, which calls this again."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(CURSOR_TABLE)
        cur.execute(CURSOR_ROW)


def publish_batch_past_cursor(conn, publisher, batch_size):
    """--seq-cursor: reads, publishes and marks the rows past the cursor, and
    advances it, in one transaction; returns the batch's size."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(CURSOR_LOCK)
        (last_seq,) = cur.fetchone()
        cur.execute(READ_PAST, (last_seq, batch_size))
        rows = cur.fetchall()
        if not rows:
            raise psycopg.Rollback()
        publisher.send([row[:4] for row in rows])
        cur.execute(MARK, ([row[0] for row in rows],))
        # THE BUG: "everything up to here is published". A row below this
        # seq whose transaction has not committed yet is skipped for ever.
        cur.execute(CURSOR_ADVANCE, (rows[-1][4],))
    return len(rows)


def connect():
    # autocommit: transactions are opened with conn.transaction(), so the
    # session never idles inside one between batches.
    return psycopg.connect(os.environ["CHAOS_DATABASE_URL"], autocommit=True, connect_timeout=5,
                           options=f"-c search_path={os.environ['CHAOS_SCHEMA']}")


def main():
    # SIGTERM only raises a flag: the batch in hand is finished (acked and
    # marked) or rolled back before the loop looks at it. Installed first,
    # so that a SIGTERM during start-up is a clean exit too.
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {os.environ.get('CHAOS_INSTANCE', '-')} %(message)s")
    unknown = FLAGS - {"--delete", "--stall-after-restart", "--seq-cursor", "--envelope",
                       "--mark-first", "--mark-range"}
    if unknown:
        log.error("unknown arguments: %s", " ".join(sorted(unknown)))
        sys.exit(2)
    incarnation = int(os.environ.get("CHAOS_INCARNATION", "0"))
    publishes = not (STALL_AFTER_RESTART and incarnation > 0)
    log.info("start: incarnation %d%s", incarnation, "" if publishes else " (THE BUG: this one never publishes)")
    brokers, topic = os.environ["CHAOS_BROKERS"], os.environ["CHAOS_TOPIC"]
    batch_size = int(os.environ.get("CHAOS_BATCH_SIZE", "20"))
    publisher, conn = Publisher(brokers, topic), None
    cursor_ready = False

    while not stopping:
        try:
            if conn is None or conn.closed:
                conn = connect()
            if SEQ_CURSOR:
                if not cursor_ready:
                    ensure_cursor(conn)
                    cursor_ready = True
                n = publish_batch_past_cursor(conn, publisher, batch_size)
            elif MARK_FIRST:
                n = publish_batch_mark_first(conn, publisher, batch_size)
            elif MARK_RANGE:
                n = publish_batch_mark_range(conn, publisher, batch_size)
            else:
                n = publish_batch(conn, publisher, batch_size) if publishes else 0
        except DeliveryFailed as e:
            log.warning("batch rolled back, claiming again: %s", e)
            if publisher.fatal:
                log.warning("producer is unusable, starting a new one")
                publisher = Publisher(brokers, topic)
            time.sleep(RETRY_SLEEP_SECS)
            continue
        except psycopg.Error as e:
            # Rolled back as a whole. Exiting on our own would end the run,
            # so reconnect if the connection is gone and carry on.
            log.warning("database error, batch rolled back: %s", e)
            if conn is not None and conn.broken:
                conn.close()
            time.sleep(RETRY_SLEEP_SECS)
            continue
        if n:
            log.info("published a batch of %d", n)
        else:
            time.sleep(IDLE_SLEEP_SECS)
    log.info("SIGTERM: stopping")
    publisher.producer.flush(5)
    if conn is not None:
        conn.close()


if __name__ == "__main__":
    main()
