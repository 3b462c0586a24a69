// What service.js, relay.js and consumer.js share: the connection settings
// chaos hands every program (docs/contract.md, sections 2 and 8) turned into
// the library's configuration objects, and a logger.
'use strict';
const { getDefaultLogger } = require('pg-transactional-outbox');

const SCHEMA = process.env.CHAOS_SCHEMA;
const INSTANCE = process.env.CHAOS_INSTANCE || 'local';

// node-postgres does not read PGAPPNAME by itself: application_name is set
// here, so the harness sees every session of this process in
// pg_stat_activity. search_path to the run's schema on every connection.
function dbConfig() {
  return {
    connectionString: process.env.CHAOS_DATABASE_URL,
    application_name: process.env.PGAPPNAME,
    options: `-c search_path=${SCHEMA}`, // chaos_ and [a-z0-9_]: no quoting needed
    connectionTimeoutMillis: 5000,
  };
}

// The library's settings for its outbox or inbox table, as the README's
// producer and consumer examples write them, the schema the run's. The
// outbox's protections off and the inbox's on, as the README's examples
// have them; polling every 250 ms, 5 messages at a time (the README's values).
function listenerSettings(outboxOrInbox) {
  const outbox = outboxOrInbox === 'outbox';
  return {
    dbSchema: SCHEMA,
    dbTable: outboxOrInbox,
    enableMaxAttemptsProtection: !outbox,
    enablePoisonousMessageProtection: !outbox,
    nextMessagesBatchSize: 5,
    nextMessagesFunctionName: `next_${outboxOrInbox}_messages`,
    // Its default is 'public': the function lives in the run's schema.
    nextMessagesFunctionSchema: SCHEMA,
    nextMessagesPollingIntervalInMs: 250,
  };
}

function pollingConfig(outboxOrInbox) {
  return { outboxOrInbox, dbListenerConfig: dbConfig(), settings: listenerSettings(outboxOrInbox) };
}

// The library's pino logger, to stdout (kept by chaos in the process's log).
function logger(name) {
  const l = getDefaultLogger(`${name} ${INSTANCE}`);
  l.level = process.env.PTO_LOG_LEVEL || 'info';
  return l;
}

// The message as it travels on the topic: the library's TransactionalMessage
// (README "Message format"), its identity and content only. Its per-attempt
// state (lockedUntil, startedAttempts, finishedAttempts, processedAt,
// abandonedAt) is the outbox row's bookkeeping, differs from one send of the
// same message to the next, and an outbox lockedUntil stored in the inbox
// would hold the inbox message back until it passed. orders-pto.toml's
// [system.outbox] payload builds the same object from the row.
function transportMessage(m) {
  return {
    id: m.id,
    aggregateType: m.aggregateType,
    aggregateId: m.aggregateId,
    messageType: m.messageType,
    segment: m.segment ?? null,
    concurrency: m.concurrency ?? 'sequential',
    payload: m.payload,
    metadata: m.metadata ?? null,
    createdAt: m.createdAt,
  };
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

module.exports = { SCHEMA, INSTANCE, dbConfig, listenerSettings, pollingConfig, logger, transportMessage, sleep };
