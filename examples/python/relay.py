#!/usr/bin/env python3
"""An outbox relay that never loses an event.

It follows docs/contract.md, section 7: in ONE database transaction, claim a
batch of unpublished outbox rows (FOR UPDATE SKIP LOCKED), produce them, wait
until the broker has acknowledged every message, and only then mark the rows
published and commit. A kill anywhere in that sequence is safe: before the
commit the rows are still unpublished (PostgreSQL rolls the transaction back
when the connection drops) and are published again, at worst twice, which the
consumers' inbox absorbs. An event is marked only once it is on the topic.

Run it with `chaos run examples/python/relay.toml` (see README.md).
"""
import logging
import os
import signal
import sys
import time

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger("relay")

# SKIP LOCKED: several relays run at once and never wait on each other's
# batches. payload::text is the value exactly as PostgreSQL renders it, sent
# unchanged; the verifier compares it with the row as JSON, by value (key order
# and spacing aside), so any changed value is a `message mismatch`.
CLAIM = """SELECT id, aggregate_id, event_type, payload::text FROM outbox
           WHERE published_at IS NULL ORDER BY seq LIMIT %s
           FOR UPDATE SKIP LOCKED"""
# clock_timestamp(), not now(): the latency clock stops when the mark is
# written, not when the transaction began.
MARK = "UPDATE outbox SET published_at = clock_timestamp() WHERE id = ANY(%s)"

IDLE_SLEEP_SECS = 0.02   # an empty claim: wait a little before the next one
RETRY_SLEEP_SECS = 0.5   # after a failed batch: do not spin on a sick broker
MESSAGE_TIMEOUT_MS = 30000


class DeliveryFailed(Exception):
    """Some message of the batch has no ack: the batch must not be marked."""


class Publisher:
    """An idempotent producer that publishes a batch and waits for every ack."""

    def __init__(self, brokers, topic):
        self.topic = topic
        self.fatal = None
        self.producer = Producer({
            "bootstrap.servers": brokers,
            # Idempotence: the broker drops the copies of a retried send, and
            # a partition keeps its order across retries. It implies acks=all,
            # written out because it is the point: an ack means every in-sync
            # replica has the message.
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,  # a batch leaves in one request, without waiting long
            # A message the broker cannot take is reported as failed after
            # this, so a flush never outlasts it by much.
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            "client.id": os.environ.get("CHAOS_INSTANCE", "relay"),
            "error_cb": self._on_error,
            # No partitioner here: the default one hashes the key, so every
            # event of one payment lands on one partition.
        })

    def _note(self, err):
        # A fatal error (the idempotent producer lost track of its sequence
        # numbers) leaves this producer unusable; main() replaces it.
        if err.fatal() or err.code() == KafkaError._FATAL:
            self.fatal = err

    def _on_error(self, err):
        self._note(err)
        log.warning("producer: %s", err)

    def send(self, rows):
        """Produces rows and returns once the broker has acked every one of them."""
        failures = []

        def report(err, _msg):
            if err is not None:
                self._note(err)
                failures.append(err)

        try:
            for event_id, aggregate_id, event_type, payload in rows:
                self.producer.produce(
                    self.topic,
                    key=str(aggregate_id),  # str(UUID): the 36-character lowercase form
                    value=payload.encode("utf-8"),
                    headers=[("event_id", str(event_id)), ("event_type", event_type)],
                    on_delivery=report)
        except KafkaException as e:
            self._note(e.args[0])
            raise DeliveryFailed(f"produce refused: {e}") from e
        except BufferError as e:  # the local queue is full
            raise DeliveryFailed(f"produce refused: {e}") from e
        # flush() serves the delivery reports; it returns how many messages
        # are still without one.
        left = self.producer.flush(MESSAGE_TIMEOUT_MS / 1000 + 5)
        if left:
            raise DeliveryFailed(f"{left} of {len(rows)} messages without a delivery report")
        if failures:
            raise DeliveryFailed(f"{len(failures)} of {len(rows)} deliveries failed: {failures[0]}")


def publish_batch(conn, publisher, batch_size):
    """Claims, publishes and marks one batch; returns its size (0: nothing to do)."""
    # An exception inside the block rolls the transaction back: the rows stay
    # unpublished and are claimed again. Messages of it that did reach the
    # broker are published twice; that is allowed, losing one is not.
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(CLAIM, (batch_size,))
        rows = cur.fetchall()
        if rows:
            publisher.send(rows)                             # 1. every ack...
            cur.execute(MARK, ([row[0] for row in rows],))   # 2. ...then the mark
    return len(rows)                                         # 3. committed here


def connect():
    # PGAPPNAME is read by libpq itself. autocommit: transactions are opened
    # explicitly with conn.transaction(), so no session sits idle in one.
    return psycopg.connect(os.environ["CHAOS_DATABASE_URL"], autocommit=True,
                           options=f"-c search_path={os.environ['CHAOS_SCHEMA']}")


def main(publish=publish_batch):
    # SIGTERM only raises a flag: the batch in hand is finished (acked and
    # marked) before the loop looks at it. Installed first, so that a SIGTERM
    # during start-up is a clean exit too.
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {os.environ.get('CHAOS_INSTANCE', '-')} %(message)s")
    log.info("start: incarnation %s", os.environ.get("CHAOS_INCARNATION", "?"))
    brokers, topic = os.environ["CHAOS_BROKERS"], os.environ["CHAOS_TOPIC"]
    batch_size = int(os.environ.get("CHAOS_BATCH_SIZE", "20"))
    publisher, conn = Publisher(brokers, topic), connect()

    while not stopping:
        try:
            if conn.closed:  # lost in an earlier round
                conn = connect()
            n = publish(conn, publisher, batch_size)
        except DeliveryFailed as e:
            log.warning("batch rolled back, claiming again: %s", e)
            if publisher.fatal:
                log.warning("producer is unusable, starting a new one")
                publisher = Publisher(brokers, topic)
            time.sleep(RETRY_SLEEP_SECS)
            continue
        except psycopg.Error as e:
            # Rolled back as a whole. Exiting would end the run (exit 5), so
            # reconnect if the connection is gone and carry on.
            log.warning("database error, batch rolled back: %s", e)
            time.sleep(RETRY_SLEEP_SECS)
            continue
        if n:
            log.info("published a batch of %d", n)
        else:
            time.sleep(IDLE_SLEEP_SECS)
    log.info("SIGTERM: stopping")
    publisher.producer.flush(5)
    conn.close()


if __name__ == "__main__":
    main()
