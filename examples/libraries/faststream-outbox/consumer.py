"""The consumer: a FastStream Kafka subscriber in chaos's group that applies
each OrderPlaced once. faststream-outbox has no inbox; its relay page says
"Downstream consumers should handle duplicates idempotently", and its "How it
works" page "handlers must be idempotent". So, in ONE transaction, the
message's event_id is claimed in processed_messages (INSERT ... ON CONFLICT
DO NOTHING) and, only if the claim is new, the order shipped and its
quantity taken off the stock. The offset is committed after the handler
returned (AckPolicy.NACK_ON_ERROR: ack after success; on an error the
partition is sought back to the message, which comes again).

--no-dedup: THE BUG of broken-no-dedup.toml: no claim, every delivery
applied, as a handler that is not idempotent.
--ack-first: THE BUG of broken-ack-first.toml: FastStream's default ack
policy for Kafka (AckPolicy.ACK_FIRST, the client's auto-commit every 5 s),
so offsets move whether or not the message was handled.

Environment: CHAOS_BROKERS, CHAOS_TOPIC, CHAOS_GROUP, CHAOS_INSTANCE (the
static member id), CHAOS_SESSION_TIMEOUT_MS, CHAOS_DATABASE_URL, CHAOS_SCHEMA.
"""
import asyncio
import os
import sys

from sqlalchemy import text
from sqlalchemy.ext.asyncio import async_sessionmaker

from faststream import AckPolicy, FastStream
from faststream.kafka import KafkaBroker, KafkaMessage

from common import INSTANCE, engine, logger

log = logger("consumer")
NO_DEDUP = "--no-dedup" in sys.argv[1:]
ACK_FIRST = "--ack-first" in sys.argv[1:]

session_factory = async_sessionmaker(engine(), expire_on_commit=False)
broker = KafkaBroker(os.environ.get("CHAOS_BROKERS", "127.0.0.1:9092"))

CLAIM = text("INSERT INTO processed_messages (message_id) VALUES (:id) ON CONFLICT DO NOTHING RETURNING message_id")
SHIP = text("INSERT INTO shipments (order_id, message_id) VALUES (:order_id, :id)")
TAKE = text("UPDATE stock SET on_hand = on_hand - :qty WHERE sku = :sku")

options = {}
if not ACK_FIRST:
    options["ack_policy"] = AckPolicy.NACK_ON_ERROR


@broker.subscriber(
    os.environ.get("CHAOS_TOPIC", "orders"),
    group_id=os.environ.get("CHAOS_GROUP", "orders"),
    group_instance_id=INSTANCE,
    session_timeout_ms=int(os.environ.get("CHAOS_SESSION_TIMEOUT_MS", "10000")),
    auto_offset_reset="earliest",
    **options,
)
async def handle(body: dict, msg: KafkaMessage) -> None:
    event_id = msg.headers["event_id"]
    async with session_factory() as session, session.begin():
        if not NO_DEDUP:
            if (await session.execute(CLAIM, {"id": event_id})).first() is None:
                return  # handled before: a duplicate or a redelivery
        await session.execute(SHIP, {"order_id": body["order_id"], "id": event_id})
        await session.execute(TAKE, {"qty": body["quantity"], "sku": body["sku"]})


app = FastStream(broker)

if __name__ == "__main__":
    asyncio.run(app.run())
