"""The order service on faststream-outbox: POST /orders stores the order and
its OrderPlaced message in ONE SQLAlchemy transaction, as the library's
quickstart does (`async with session_factory() as session, session.begin():`
the domain write, then `await broker.publish(body, queue=..., session=session)`),
and answers only after the commit.

    POST /orders  {"order_id": "<uuid>", "sku": "apple", "quantity": 3}
      201  placed now          200  placed before (the same order again)
      400  not such an order   409  the same id with other contents
      503  the database failed: nothing written, or the answer unknown
    GET /health   200

The message body is {"order_id", "sku", "quantity"}; its headers, stored in
the outbox row by publish(headers=...), are event_id (a fresh UUID, the
event's stable id) and event_type (OrderPlaced).

--two-transactions: THE BUG of broken-two-transactions.toml. The order is
committed, then the message published in a second transaction: what the
library exists to prevent ("the row commits atomically with the caller's
domain writes").

A tiny HTTP/1.1 server on asyncio (one request per connection is enough for
chaos's workload); environment: CHAOS_PORT, CHAOS_DATABASE_URL, CHAOS_SCHEMA.
"""
import asyncio
import json
import os
import signal
import sys
import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import async_sessionmaker

from faststream_outbox import OutboxBroker

from common import QUEUE, engine, logger, outbox_table

log = logger("service")
TWO_TRANSACTIONS = "--two-transactions" in sys.argv[1:]

ENGINE = engine()
broker = OutboxBroker(ENGINE, outbox_table=outbox_table)
session_factory = async_sessionmaker(ENGINE, expire_on_commit=False)

INSERT_ORDER = text("""INSERT INTO orders (order_id, sku, quantity) VALUES (:id, :sku, :qty)
                       ON CONFLICT (order_id) DO NOTHING RETURNING order_id""")
EXISTING = text("SELECT sku, quantity FROM orders WHERE order_id = :id")


class BadRequest(Exception):
    pass


def parse_order(raw):
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise BadRequest(f"body is not JSON: {e}")
    if not isinstance(body, dict) or set(body) != {"order_id", "sku", "quantity"}:
        raise BadRequest("body must be an object with exactly order_id, sku and quantity")
    try:
        order_id = uuid.UUID(body["order_id"])
    except (ValueError, TypeError, AttributeError):
        raise BadRequest("order_id must be a UUID string")
    sku, quantity = body["sku"], body["quantity"]
    if not isinstance(sku, str) or not sku:
        raise BadRequest("sku must be a non-empty string")
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 0 < quantity < 2**31:
        raise BadRequest("quantity must be a positive integer")
    return order_id, sku, quantity


async def publish(session, order_id, sku, quantity):
    await broker.publish(
        {"order_id": str(order_id), "sku": sku, "quantity": quantity},
        queue=QUEUE,
        session=session,
        headers={"event_id": str(uuid.uuid4()), "event_type": "OrderPlaced"},
    )


async def place_order(order_id, sku, quantity):
    """Writes the order and its message; returns (status, answer)."""
    async with session_factory() as session, session.begin():
        new = (await session.execute(INSERT_ORDER, {"id": order_id, "sku": sku, "qty": quantity})).first()
        if new is not None and not TWO_TRANSACTIONS:
            await publish(session, order_id, sku, quantity)   # the same transaction
        if new is None:
            row = (await session.execute(EXISTING, {"id": order_id})).first()
    if new is not None and TWO_TRANSACTIONS:
        async with session_factory() as session, session.begin():   # THE BUG: a second transaction
            await publish(session, order_id, sku, quantity)
    if new is not None:
        return 201, {"order_id": str(order_id), "placed": True}
    if row is not None and (row.sku, row.quantity) == (sku, quantity):
        return 200, {"order_id": str(order_id), "placed": False}
    return 409, {"error": f"order {order_id} exists with other contents"}


async def answer(writer, status, body):
    reason = {200: "OK", 201: "Created", 400: "Bad Request", 404: "Not Found",
              409: "Conflict", 503: "Service Unavailable"}[status]
    data = json.dumps(body).encode()
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await writer.drain()


async def handle(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        raw = await reader.readexactly(length) if length else b""
        if method == "GET" and path == "/health":
            return await answer(writer, 200, {"ok": True})
        if method != "POST" or path != "/orders":
            return await answer(writer, 404, {"error": "not found"})
        try:
            order_id, sku, quantity = parse_order(raw)
        except BadRequest as e:
            return await answer(writer, 400, {"error": str(e)})
        try:
            status, body = await place_order(order_id, sku, quantity)
        except Exception as e:  # the database failed, or its answer was lost
            log.warning("order %s failed: %r", order_id, e)
            return await answer(writer, 503, {"error": "database unavailable"})
        await answer(writer, status, body)
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def main():
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await asyncio.start_server(handle, "127.0.0.1", int(os.environ.get("CHAOS_PORT", "8080")))
    log.info("listening on %s%s", os.environ.get("CHAOS_PORT", "8080"),
             " (two transactions: THE BUG)" if TWO_TRANSACTIONS else "")
    async with server:
        await stop.wait()
    await ENGINE.dispose()


if __name__ == "__main__":
    asyncio.run(main())
