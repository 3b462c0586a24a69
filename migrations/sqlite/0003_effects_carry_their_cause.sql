-- Every effect names the event that caused it (see migrations/postgres/0004):
-- the projection's current status and each loyalty credit.
ALTER TABLE payment_projection ADD COLUMN event_id BLOB;

-- One row per loyalty credit; deliberately NO unique constraint on event_id.
CREATE TABLE loyalty_credits (
    event_id   BLOB    NOT NULL,
    account_id INTEGER NOT NULL,
    points     INTEGER NOT NULL
);
