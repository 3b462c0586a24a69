-- The orders system on Spring Modulith. chaos applies this file once, in the
-- run's own schema, before any process starts: every name is unqualified.

-- What the service stores for each order it accepts (examples/orders).
CREATE TABLE orders (
    order_id  uuid PRIMARY KEY,
    sku       text NOT NULL,
    quantity  integer NOT NULL CHECK (quantity > 0),
    placed_at timestamptz NOT NULL DEFAULT now()
);

-- The event publication registry: Spring Modulith 2.0.3's table, exactly as
-- spring-modulith-events-jdbc ships it for PostgreSQL
-- (org/springframework/modulith/events/jdbc/schemas/v2/schema-postgresql.sql;
-- the application sets spring.modulith.events.jdbc.schema-initialization.enabled
-- to false, since chaos applies this file). One row per event and listener: here
-- one listener, the Kafka externalizer. completion_date stays NULL until Kafka
-- acknowledged the message (completion-mode "update", the default).
CREATE TABLE IF NOT EXISTS event_publication
(
  id                     UUID NOT NULL,
  listener_id            TEXT NOT NULL,
  event_type             TEXT NOT NULL,
  serialized_event       TEXT NOT NULL,
  publication_date       TIMESTAMP WITH TIME ZONE NOT NULL,
  completion_date        TIMESTAMP WITH TIME ZONE,
  status                 TEXT,
  completion_attempts    INT,
  last_resubmission_date TIMESTAMP WITH TIME ZONE,
  PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS event_publication_serialized_event_hash_idx ON event_publication USING hash(serialized_event);
CREATE INDEX IF NOT EXISTS event_publication_by_completion_date_idx ON event_publication (completion_date);

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

-- The consumer's idempotency record: one row per event handled, written in
-- the transaction of its effects. The primary key makes a redelivery a no-op.
CREATE TABLE processed_messages (
    message_id   uuid PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
