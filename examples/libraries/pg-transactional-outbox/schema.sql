-- The orders system on pg-transactional-outbox 0.5.7. chaos applies this file
-- once, in the run's own schema, before any process starts: every name here
-- is unqualified, and the programs set search_path to CHAOS_SCHEMA and give
-- the library dbSchema = nextMessagesFunctionSchema = CHAOS_SCHEMA.

-- What the service stores for each order it accepts (examples/orders' shape).
CREATE TABLE orders (
    order_id  uuid PRIMARY KEY,
    sku       text NOT NULL,
    quantity  integer NOT NULL CHECK (quantity > 0),
    placed_at timestamptz NOT NULL DEFAULT now()
);

-- The warehouse: the consumer's OrderPlaced handler takes each order's
-- quantity off here. chaos checks that, per sku, 1000 - on_hand equals the
-- quantities ordered, so the starting figure must match the .toml files.
CREATE TABLE stock (
    sku     text PRIMARY KEY,
    on_hand integer NOT NULL
);
INSERT INTO stock (sku, on_hand) VALUES ('apple', 1000), ('pear', 1000), ('plum', 1000);

-- The handler's other effect: one shipment per order. message_id is the
-- inbox message (= the outbox message's id, the event_id header) that caused
-- it. Deliberately no unique key on order_id: the library's inbox is what
-- must make shipping happen once, and a second shipment stays visible.
CREATE TABLE shipments (
    shipment_id bigserial PRIMARY KEY,
    order_id    uuid NOT NULL,
    message_id  uuid NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- ---------------------------------------------------------------------------
-- The library's tables, polling functions and indexes, exactly as its
-- DatabaseSetup helper (dist/setup/database-setup.js: dropAndCreateTable,
-- createPollingFunction, setupPollingIndexes) writes them for
-- {outboxOrInbox: 'outbox', table: 'outbox', nextMessagesName:
-- 'next_outbox_messages'} and the same for 'inbox', with three changes only:
--   * the schema qualification dropped (the helper writes <schema>.outbox;
--     here the run's schema is the search_path chaos applies this file in,
--     and the one the programs' connections set, so the functions' bodies
--     find the tables at call time);
--   * its CREATE SCHEMA IF NOT EXISTS and its DROP ... IF EXISTS lines left
--     out (a fresh schema; an unqualified DROP could reach another schema on
--     the search_path);
--   * no roles and grants (dropAndCreateHandlerAndListenerRoles,
--     grantPermissions): the README allows a single role for polling, and
--     every program here connects as the run's user.
-- Regenerate the original with:
--   node -e 'const {DatabaseSetup:D}=require("pg-transactional-outbox");
--     const c={outboxOrInbox:"outbox",schema:"s",table:"outbox",nextMessagesName:"next_outbox_messages"};
--     console.log(D.dropAndCreateTable(c)+D.createPollingFunction(c)+D.setupPollingIndexes(c))'
-- ---------------------------------------------------------------------------

CREATE TABLE outbox (
  id uuid PRIMARY KEY,
  aggregate_type TEXT NOT NULL,
  aggregate_id TEXT NOT NULL,
  message_type TEXT NOT NULL,
  segment TEXT,
  concurrency TEXT NOT NULL DEFAULT 'sequential',
  payload JSONB NOT NULL,
  metadata JSONB,
  locked_until TIMESTAMPTZ NOT NULL DEFAULT to_timestamp(0),
  created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  processed_at TIMESTAMPTZ,
  abandoned_at TIMESTAMPTZ,
  started_attempts smallint NOT NULL DEFAULT 0,
  finished_attempts smallint NOT NULL DEFAULT 0
);
ALTER TABLE outbox ADD CONSTRAINT outbox_concurrency_check
  CHECK (concurrency IN ('sequential', 'parallel'));

CREATE OR REPLACE FUNCTION next_outbox_messages(
  max_size integer, lock_ms integer)
    RETURNS SETOF outbox
    LANGUAGE 'plpgsql'

AS $BODY$
DECLARE
  loop_row outbox%ROWTYPE;
  message_row outbox%ROWTYPE;
  ids uuid[] := '{}';
BEGIN

  IF max_size < 1 THEN
    RAISE EXCEPTION 'The max_size for the next messages batch must be at least one.' using errcode = 'MAXNR';
  END IF;

  -- get (only) the oldest message of every segment but only return it if it is not locked
  FOR loop_row IN
    SELECT * FROM outbox m WHERE m.id in (SELECT DISTINCT ON (segment) id
      FROM outbox
      WHERE processed_at IS NULL AND abandoned_at IS NULL
      ORDER BY segment, created_at) order by created_at
  LOOP
    BEGIN
      EXIT WHEN cardinality(ids) >= max_size;

      SELECT *
        INTO message_row
        FROM outbox
        WHERE id = loop_row.id
        FOR NO KEY UPDATE NOWAIT; -- throw/catch error when locked

      IF message_row.locked_until > NOW() THEN
        CONTINUE;
      END IF;

      ids := array_append(ids, message_row.id);
    EXCEPTION
      WHEN lock_not_available THEN
        CONTINUE;
      WHEN serialization_failure THEN
        CONTINUE;
    END;
  END LOOP;

  -- if max_size not reached: get the oldest parallelizable message independent of segment
  IF cardinality(ids) < max_size THEN
    FOR loop_row IN
      SELECT * FROM outbox
        WHERE concurrency = 'parallel' AND processed_at IS NULL AND abandoned_at IS NULL AND locked_until < NOW()
          AND id NOT IN (SELECT UNNEST(ids))
        order by created_at
    LOOP
      BEGIN
        EXIT WHEN cardinality(ids) >= max_size;

        SELECT *
          INTO message_row
          FROM outbox
          WHERE id = loop_row.id
          FOR NO KEY UPDATE NOWAIT; -- throw/catch error when locked

        ids := array_append(ids, message_row.id);
      EXCEPTION
        WHEN lock_not_available THEN
          CONTINUE;
        WHEN serialization_failure THEN
          CONTINUE;
      END;
    END LOOP;
  END IF;

  -- set a short lock value so the the workers can each process a message
  IF cardinality(ids) > 0 THEN

    RETURN QUERY
      UPDATE outbox
        SET locked_until = clock_timestamp() + (lock_ms || ' milliseconds')::INTERVAL, started_attempts = started_attempts + 1
        WHERE ID = ANY(ids)
        RETURNING *;

  END IF;
END;
$BODY$;

CREATE INDEX outbox_segment_idx ON outbox (segment);
CREATE INDEX outbox_created_at_idx ON outbox (created_at);
CREATE INDEX outbox_processed_at_idx ON outbox (processed_at);
CREATE INDEX outbox_abandoned_at_idx ON outbox (abandoned_at);
CREATE INDEX outbox_locked_until_idx ON outbox (locked_until);

CREATE TABLE inbox (
  id uuid PRIMARY KEY,
  aggregate_type TEXT NOT NULL,
  aggregate_id TEXT NOT NULL,
  message_type TEXT NOT NULL,
  segment TEXT,
  concurrency TEXT NOT NULL DEFAULT 'sequential',
  payload JSONB NOT NULL,
  metadata JSONB,
  locked_until TIMESTAMPTZ NOT NULL DEFAULT to_timestamp(0),
  created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  processed_at TIMESTAMPTZ,
  abandoned_at TIMESTAMPTZ,
  started_attempts smallint NOT NULL DEFAULT 0,
  finished_attempts smallint NOT NULL DEFAULT 0
);
ALTER TABLE inbox ADD CONSTRAINT inbox_concurrency_check
  CHECK (concurrency IN ('sequential', 'parallel'));

CREATE OR REPLACE FUNCTION next_inbox_messages(
  max_size integer, lock_ms integer)
    RETURNS SETOF inbox
    LANGUAGE 'plpgsql'

AS $BODY$
DECLARE
  loop_row inbox%ROWTYPE;
  message_row inbox%ROWTYPE;
  ids uuid[] := '{}';
BEGIN

  IF max_size < 1 THEN
    RAISE EXCEPTION 'The max_size for the next messages batch must be at least one.' using errcode = 'MAXNR';
  END IF;

  -- get (only) the oldest message of every segment but only return it if it is not locked
  FOR loop_row IN
    SELECT * FROM inbox m WHERE m.id in (SELECT DISTINCT ON (segment) id
      FROM inbox
      WHERE processed_at IS NULL AND abandoned_at IS NULL
      ORDER BY segment, created_at) order by created_at
  LOOP
    BEGIN
      EXIT WHEN cardinality(ids) >= max_size;

      SELECT *
        INTO message_row
        FROM inbox
        WHERE id = loop_row.id
        FOR NO KEY UPDATE NOWAIT; -- throw/catch error when locked

      IF message_row.locked_until > NOW() THEN
        CONTINUE;
      END IF;

      ids := array_append(ids, message_row.id);
    EXCEPTION
      WHEN lock_not_available THEN
        CONTINUE;
      WHEN serialization_failure THEN
        CONTINUE;
    END;
  END LOOP;

  -- if max_size not reached: get the oldest parallelizable message independent of segment
  IF cardinality(ids) < max_size THEN
    FOR loop_row IN
      SELECT * FROM inbox
        WHERE concurrency = 'parallel' AND processed_at IS NULL AND abandoned_at IS NULL AND locked_until < NOW()
          AND id NOT IN (SELECT UNNEST(ids))
        order by created_at
    LOOP
      BEGIN
        EXIT WHEN cardinality(ids) >= max_size;

        SELECT *
          INTO message_row
          FROM inbox
          WHERE id = loop_row.id
          FOR NO KEY UPDATE NOWAIT; -- throw/catch error when locked

        ids := array_append(ids, message_row.id);
      EXCEPTION
        WHEN lock_not_available THEN
          CONTINUE;
        WHEN serialization_failure THEN
          CONTINUE;
      END;
    END LOOP;
  END IF;

  -- set a short lock value so the the workers can each process a message
  IF cardinality(ids) > 0 THEN

    RETURN QUERY
      UPDATE inbox
        SET locked_until = clock_timestamp() + (lock_ms || ' milliseconds')::INTERVAL, started_attempts = started_attempts + 1
        WHERE ID = ANY(ids)
        RETURNING *;

  END IF;
END;
$BODY$;

CREATE INDEX inbox_segment_idx ON inbox (segment);
CREATE INDEX inbox_created_at_idx ON inbox (created_at);
CREATE INDEX inbox_processed_at_idx ON inbox (processed_at);
CREATE INDEX inbox_abandoned_at_idx ON inbox (abandoned_at);
CREATE INDEX inbox_locked_until_idx ON inbox (locked_until);

