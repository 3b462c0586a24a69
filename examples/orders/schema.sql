-- The orders system's tables. chaos applies this file once, in the run's own
-- schema, before any process starts: so every name here is unqualified.

-- What the service stores for each order it accepts.
CREATE TABLE orders (
    order_id  uuid PRIMARY KEY,
    sku       text NOT NULL,
    quantity  integer NOT NULL CHECK (quantity > 0),
    placed_at timestamptz NOT NULL DEFAULT now()
);

-- The outbox: one row per event, written in the same transaction as the
-- order. The relay publishes rows whose published_at is NULL, then sets it.
-- seq is only an ordering hint for the relay (publish the oldest first); it
-- is taken at insert time, not commit time, so it is never used as a cursor.
CREATE TABLE order_events (
    event_id     uuid PRIMARY KEY,
    seq          bigserial NOT NULL,
    order_id     uuid NOT NULL,
    event_type   text NOT NULL,
    body         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
-- Keeps the relay's claim cheap however many published rows pile up.
CREATE INDEX order_events_unpublished ON order_events (seq) WHERE published_at IS NULL;

-- The same outbox in Debezium's default layout, for `service.py --debezium`
-- (examples/debezium: the outbox event router's defaults, id, aggregatetype,
-- aggregateid, type, payload). Debezium reads inserts from the write-ahead
-- log, so nothing here marks a row published; with --debezium-delete the
-- table even stays empty. The other services leave it empty.
CREATE TABLE outbox (
    id            uuid PRIMARY KEY,
    aggregatetype text NOT NULL,
    aggregateid   text NOT NULL,
    type          text NOT NULL,
    payload       jsonb NOT NULL
);

-- The same outbox as an envelope outbox, for `service.py --envelope` and
-- `relay.py --envelope` (orders-envelope.toml): as many outbox libraries
-- keep it, one serialized envelope per row under a row id of its own, the
-- event's id, key and type inside it with its body:
--   {"eventId": "<uuid>", "key": "<order_id>", "type": "OrderPlaced", "body": {...}}
-- bytea, not jsonb: the library serializes, the database only stores.
-- orders-envelope.toml reads the fields out with expressions, so the table
-- needs no generated columns. The other services leave it empty.
CREATE TABLE order_envelopes (
    row_id       bigserial PRIMARY KEY,
    envelope     bytea NOT NULL,
    published_at timestamptz
);
CREATE INDEX order_envelopes_unpublished ON order_envelopes (row_id) WHERE published_at IS NULL;

-- The warehouse: the "stock" handler takes each order's quantity off here.
-- chaos checks that, per sku, 1000 - on_hand equals the quantities ordered,
-- so the starting figure must match the query in the .toml files.
CREATE TABLE stock (
    sku     text PRIMARY KEY,
    on_hand integer NOT NULL
);
INSERT INTO stock (sku, on_hand) VALUES ('apple', 1000), ('pear', 1000), ('plum', 1000);

-- The "shipping" handler's effect: one shipment per order. message_id is
-- the event that caused it, so chaos can tell which delivery did it.
CREATE TABLE shipments (
    shipment_id bigserial PRIMARY KEY,
    order_id    uuid NOT NULL,
    message_id  uuid NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- A backstop, not the mechanism: the inbox already makes shipping happen
-- once. If a bug ever let a second shipment through, this turns it into an
-- error instead of a second parcel.
CREATE UNIQUE INDEX shipments_one_per_order ON shipments (order_id);

-- The consumer's inbox: one row per (event, handler) that took effect. The
-- primary key is what makes a redelivered event a no-op.
CREATE TABLE processed_messages (
    message_id   uuid NOT NULL,
    handler      text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, handler)
);

-- Messages the consumer could not read (not an OrderPlaced it understands).
-- They are parked here rather than retried forever or dropped silently.
CREATE TABLE rejected_messages (
    topic_partition integer NOT NULL,
    topic_offset    bigint NOT NULL,
    event_id        text,
    payload         text,
    error           text NOT NULL,
    PRIMARY KEY (topic_partition, topic_offset)
);

-- For consumer_apply_later.py: the inbox as a durable queue (seed 000).
-- Each message is stored on receipt, its offsets committed; a poller applies
-- the pending rows later. The primary key makes a redelivery store nothing.
CREATE TABLE inbox_queue (
    message_id  uuid PRIMARY KEY,
    order_id    uuid NOT NULL,
    sku         text NOT NULL,
    quantity    integer NOT NULL,
    status      text NOT NULL DEFAULT 'pending',
    received_at timestamptz NOT NULL DEFAULT now()
);
