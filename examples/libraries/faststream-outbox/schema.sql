-- The orders system on faststream-outbox. chaos applies this file once, in
-- the run's own schema, before any process starts: every name is unqualified.

-- What the service stores for each order it accepts (examples/orders).
CREATE TABLE orders (
    order_id  uuid PRIMARY KEY,
    sku       text NOT NULL,
    quantity  integer NOT NULL CHECK (quantity > 0),
    placed_at timestamptz NOT NULL DEFAULT now()
);

-- The library's outbox table, exactly as `make_outbox_table(metadata,
-- table_name="outbox")` of faststream-outbox 0.19.0 declares it (the library
-- leaves the migration to its user). Regenerate with:
--   python -c 'from common import outbox_table as t; from sqlalchemy.schema import CreateTable, CreateIndex; \
--     from sqlalchemy.dialects import postgresql as p; d = p.dialect(); print(CreateTable(t).compile(dialect=d)); \
--     [print(CreateIndex(i).compile(dialect=d)) for i in t.indexes]'
-- payload is the message body as JSON bytes; headers hold the ones the
-- service passes to broker.publish (event_id, event_type) beside the
-- library's own. The relay DELETEs a row once the handler (the Kafka send)
-- returned.
CREATE TABLE outbox (
    id BIGSERIAL NOT NULL,
    queue VARCHAR(255) NOT NULL,
    payload BYTEA NOT NULL,
    headers JSONB,
    attempts_count BIGINT DEFAULT '0' NOT NULL,
    deliveries_count BIGINT DEFAULT '0' NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    next_attempt_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    first_attempt_at TIMESTAMP WITH TIME ZONE,
    last_attempt_at TIMESTAMP WITH TIME ZONE,
    acquired_at TIMESTAMP WITH TIME ZONE,
    acquired_token UUID,
    timer_id VARCHAR(255),
    PRIMARY KEY (id),
    CONSTRAINT outbox_lease_ck CHECK ((acquired_token IS NULL) = (acquired_at IS NULL))
);
CREATE INDEX outbox_leased_idx ON outbox (queue, next_attempt_at, id) WHERE acquired_token IS NOT NULL;
CREATE INDEX outbox_pending_idx ON outbox (queue, next_attempt_at, id) WHERE acquired_token IS NULL;
CREATE UNIQUE INDEX outbox_timer_id_uq ON outbox (queue, timer_id) WHERE timer_id IS NOT NULL;

-- The warehouse: each order's quantity is taken off here, once.
CREATE TABLE stock (
    sku     text PRIMARY KEY,
    on_hand integer NOT NULL
);
INSERT INTO stock (sku, on_hand) VALUES ('apple', 1000), ('pear', 1000), ('plum', 1000);

-- One shipment per order; message_id is the event that caused it. No
-- unique key: a second delivery handled again shows as a second row.
CREATE TABLE shipments (
    shipment_id bigserial PRIMARY KEY,
    order_id    uuid NOT NULL,
    message_id  uuid NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The consumer's idempotency record ("handlers must be idempotent", the
-- library's at-least-once contract): one row per event handled, written in
-- the transaction of its effects. The primary key makes a redelivery a no-op.
CREATE TABLE processed_messages (
    message_id   uuid PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
