"""The relay: the library's outbox subscriber with a Kafka publisher stacked
on it, the standalone shape of its "Relay to a foreign broker" page and its
quickstart, word for word but for the names chaos gives:

    @publisher_kafka
    @broker_outbox.subscriber(QUEUE)
    async def relay(body, msg) -> KafkaResponse

The subscriber claims rows (SELECT ... FOR UPDATE SKIP LOCKED, then a lease:
acquired_token, acquired_at), calls the handler, FastStream publishes what it
returned to Kafka, and the row is DELETEd (by its lease token) once that
returned. A row whose lease (60 s, the default) ran out is claimed again.

The message: value = the outbox body; key = the order id (FastStream's
KafkaResponse(key=...)); headers = the row's, event_id and event_type among
them (the page's "Header propagation": Response(body, headers=msg.headers)).

Environment: CHAOS_BROKERS, CHAOS_TOPIC, CHAOS_DATABASE_URL, CHAOS_SCHEMA.
"""
import asyncio
import os

from faststream import FastStream
from faststream.kafka import KafkaBroker, KafkaResponse

from faststream_outbox import OutboxBroker
from faststream_outbox.annotations import OutboxMessage

from common import QUEUE, engine, logger, outbox_table

log = logger("relay")

broker_outbox = OutboxBroker(engine(), outbox_table=outbox_table)
broker_kafka = KafkaBroker(os.environ.get("CHAOS_BROKERS", "127.0.0.1:9092"))
publisher_kafka = broker_kafka.publisher(os.environ.get("CHAOS_TOPIC", "orders"))


@publisher_kafka
@broker_outbox.subscriber(QUEUE)
async def relay(body: dict, msg: OutboxMessage) -> KafkaResponse:
    return KafkaResponse(body, key=body["order_id"].encode(), headers=msg.headers)


app = FastStream(broker_outbox, on_startup=[broker_kafka.connect])

if __name__ == "__main__":
    asyncio.run(app.run())
