#!/usr/bin/env python3
"""The order service: POST /orders writes the order and its OrderPlaced event.

The transactional outbox: the order row and its outbox row (order_events)
are written in ONE database transaction, and the 201 goes out only after
that commit. So a crash at any instant leaves either both rows or neither,
and an order the client was told about always has its event. The relay
(relay.py) publishes the event later.

    POST /orders  {"order_id": "<uuid>", "sku": "apple", "quantity": 3}
      201  the order was placed now
      200  the same order was placed before (a retry): nothing new is written
      400  the body is not such an order
      409  an order with this id exists with other contents
      503  the database failed: nothing was written, or the answer is unknown
    GET /health   200 once the service has its database connection

Environment (docs/contract.md section 8): CHAOS_PORT, CHAOS_DATABASE_URL,
CHAOS_SCHEMA, CHAOS_INSTANCE; PGAPPNAME is read by libpq itself.

--two-transactions (a deliberate bug, see broken-service-two-transactions.toml):
the order is committed first and the event is written in a second
transaction, as when the "publish" step runs after the repository's save.
A crash between the two commits leaves an order that no one ever hears of.

--debezium: the events go to Debezium's default outbox layout instead,
`outbox (id, aggregatetype, aggregateid, type, payload)` (examples/debezium),
and each order has two: OrderPlaced, then OrderConfirmed. Two events of one
order must reach its consumers in that order, on one partition: what the
router's key decides.
--debezium-delete: the same, and the row is deleted again in the same
transaction, as Debezium's documentation recommends: the insert stays in the
write-ahead log, which is all Debezium reads, and the table stays empty.

--envelope: the event goes to `order_envelopes (row_id, envelope, ...)`
instead, as one serialized envelope per row (orders-envelope.toml), the way
many outbox libraries store it: UTF-8 JSON bytes holding the event's id,
key, type and body. relay.py --envelope publishes it.
"""
import json
import logging
import os
import queue
import signal
import sys
import threading
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg.types.json import Jsonb

log = logging.getLogger("service")

TWO_TRANSACTIONS = "--two-transactions" in sys.argv[1:]
DEBEZIUM_DELETE = "--debezium-delete" in sys.argv[1:]
DEBEZIUM = DEBEZIUM_DELETE or "--debezium" in sys.argv[1:]
ENVELOPE = "--envelope" in sys.argv[1:]
MAX_BODY_BYTES = 64 * 1024

INSERT_ORDER = """INSERT INTO orders (order_id, sku, quantity) VALUES (%s, %s, %s)
                  ON CONFLICT (order_id) DO NOTHING RETURNING order_id"""
INSERT_EVENT = """INSERT INTO order_events (event_id, order_id, event_type, body)
                  VALUES (%s, %s, 'OrderPlaced', %s)"""
if DEBEZIUM:
    INSERT_EVENT = """INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                      VALUES (%s, 'order', %s, 'OrderPlaced', %s)"""
INSERT_ENVELOPE = "INSERT INTO order_envelopes (envelope) VALUES (%s)"
DELETE_EVENT = "DELETE FROM outbox WHERE id = %s"
INSERT_CONFIRMED = """INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                      VALUES (%s, 'order', %s, 'OrderConfirmed', %s)"""
EXISTING = "SELECT sku, quantity FROM orders WHERE order_id = %s"


def connect():
    # autocommit: every transaction is opened explicitly with
    # conn.transaction(), so no session ever sits idle inside one.
    # connect_timeout: a database that does not answer fails the request
    # (503) instead of hanging it.
    return psycopg.connect(os.environ["CHAOS_DATABASE_URL"], autocommit=True, connect_timeout=5,
                           options=f"-c search_path={os.environ['CHAOS_SCHEMA']}")


class Pool:
    """A few idle connections shared by the request threads.

    Not one connection per thread: ThreadingHTTPServer starts a new thread
    for every HTTP connection, so a thread-local connection would mean a new
    database connection for almost every request."""

    def __init__(self, size=16):
        self.idle = queue.LifoQueue(maxsize=size)

    def get(self):
        try:
            return self.idle.get_nowait()
        except queue.Empty:
            return connect()

    def put(self, conn):
        # A connection that broke (reset, server restarted) is dropped; the
        # next request opens a fresh one.
        if conn.closed or conn.broken:
            return
        try:
            self.idle.put_nowait(conn)
        except queue.Full:
            conn.close()


POOL = Pool()


class BadRequest(Exception):
    pass


def parse_order(raw):
    """The order in a request body, checked strictly, or BadRequest."""
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise BadRequest(f"body is not JSON: {e}")
    if not isinstance(body, dict) or set(body) != {"order_id", "sku", "quantity"}:
        raise BadRequest("body must be an object with exactly order_id, sku and quantity")
    order_id, sku, quantity = body["order_id"], body["sku"], body["quantity"]
    if not isinstance(order_id, str):
        raise BadRequest("order_id must be a UUID string")
    try:
        order_id = uuid.UUID(order_id)
    except ValueError:
        raise BadRequest(f"order_id is not a UUID: {order_id!r}")
    if not isinstance(sku, str) or not sku:
        raise BadRequest("sku must be a non-empty string")
    # bool is an int in Python: excluded by hand. The upper bound keeps it in
    # the integer column's range.
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 0 < quantity < 2**31:
        raise BadRequest("quantity must be a positive integer")
    return order_id, sku, quantity


def insert_event(cur, event_id, order_id, event):
    """Writes one OrderPlaced event into the outbox, in the caller's transaction."""
    if ENVELOPE:
        envelope = {"eventId": str(event_id), "key": str(order_id), "type": "OrderPlaced", "body": event}
        cur.execute(INSERT_ENVELOPE, (json.dumps(envelope).encode("utf-8"),))
    else:
        cur.execute(INSERT_EVENT, (event_id, order_id, Jsonb(event)))


def place_order(conn, order_id, sku, quantity):
    """Writes the order and its event; returns (status, answer body)."""
    event = {"order_id": str(order_id), "sku": sku, "quantity": quantity}
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(INSERT_ORDER, (order_id, sku, quantity))
        new = cur.fetchone() is not None
        if new:
            # Only a new order gets an event: a retried request that finds
            # its order already there must not announce it a second time.
            ids = [uuid.uuid4()]
            insert_event(cur, ids[0], order_id, event)
            if DEBEZIUM:
                ids.append(uuid.uuid4())
                cur.execute(INSERT_CONFIRMED, (ids[1], order_id, Jsonb({"order_id": str(order_id)})))
            if DEBEZIUM_DELETE:
                for event_id in ids:
                    cur.execute(DELETE_EVENT, (event_id,))
        else:
            cur.execute(EXISTING, (order_id,))
            existing = cur.fetchone()
    # Committed: only now may the client hear that the order exists.
    if new:
        return HTTPStatus.CREATED, event
    if existing == (sku, quantity):
        return HTTPStatus.OK, event
    return HTTPStatus.CONFLICT, {"error": f"order {order_id} exists with other contents"}


def place_order_two_transactions(conn, order_id, sku, quantity):
    """THE BUG (--two-transactions): the order's commit and the event's are
    two. A crash, a kill or a lost connection between them leaves the order
    stored, and maybe even confirmed to no one, with no event ever to come."""
    event = {"order_id": str(order_id), "sku": sku, "quantity": quantity}
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(INSERT_ORDER, (order_id, sku, quantity))
        new = cur.fetchone() is not None
    if not new:
        return HTTPStatus.OK, event
    with conn.transaction(), conn.cursor() as cur:   # the second transaction
        insert_event(cur, uuid.uuid4(), order_id, event)
    return HTTPStatus.CREATED, event


PLACE = place_order_two_transactions if TWO_TRANSACTIONS else place_order


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.1: a client that keeps its connection open reuses this thread.
    protocol_version = "HTTP/1.1"
    server_version = "orders/1"

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            # The server listens only after its first database connection
            # is open (main()), so being able to answer means being ready.
            # No query here: a health probe should not be a database write
            # or commit the fault proxy could count.
            self.answer(HTTPStatus.OK, {"status": "ok"})
        else:
            self.answer(HTTPStatus.NOT_FOUND, {"error": "not found"})

    def do_POST(self):
        if self.path != "/orders":
            self.answer(HTTPStatus.NOT_FOUND, {"error": "not found"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            self.answer(HTTPStatus.BAD_REQUEST, {"error": "bad Content-Length"})
            return
        raw = self.rfile.read(length)
        try:
            order_id, sku, quantity = parse_order(raw)
        except BadRequest as e:
            self.answer(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            return
        try:
            conn = POOL.get()
        except psycopg.Error as e:
            log.warning("no database connection: %s", e)
            self.answer(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "database unavailable"})
            return
        try:
            status, body = PLACE(conn, order_id, sku, quantity)
        except psycopg.Error as e:
            # Rolled back, or (a connection lost during COMMIT) perhaps
            # committed: either way the client cannot be told "placed", and
            # "not placed" would be a lie half the time. 503: try again with
            # the same order_id, which is safe.
            log.warning("order %s failed: %s", order_id, e)
            status, body = HTTPStatus.SERVICE_UNAVAILABLE, {"error": "database error"}
        finally:
            POOL.put(conn)
        self.answer(status, body)

    def log_message(self, fmt, *args):
        # The access log goes to stderr through logging, like everything else.
        log.debug(fmt, *args)


def main():
    stopping = threading.Event()
    # Installed first, so that a SIGTERM during start-up is a clean exit too.
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {os.environ.get('CHAOS_INSTANCE', '-')} %(message)s")
    log.info("start: incarnation %s%s", os.environ.get("CHAOS_INCARNATION", "?"),
             " (--two-transactions)" if TWO_TRANSACTIONS else "")
    port = int(os.environ["CHAOS_PORT"])

    # One connection before listening: the harness sees the session in
    # pg_stat_activity, and /health never answers before the database does.
    while not stopping.is_set():
        try:
            POOL.put(connect())
            break
        except psycopg.Error as e:
            log.warning("database not reachable yet: %s", e)
            stopping.wait(0.5)
    if stopping.is_set():
        return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True  # an open keep-alive connection never blocks the exit
    # serve_forever in a thread of its own: shutdown() must be called from
    # another thread than the one serving, and the signal handler runs in
    # the main thread.
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info("listening on 127.0.0.1:%d", port)
    stopping.wait()
    log.info("SIGTERM: stopping")
    server.shutdown()
    server.server_close()


if __name__ == "__main__":
    main()
