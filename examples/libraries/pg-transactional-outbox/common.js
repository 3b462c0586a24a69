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

// The library's settings for its outbox or inbox table, polling every
// 250 ms, 5 messages at a time (the README's values), the schema the run's.
//
// README_PROTECTIONS (--readme-protections): the protections as the
// README's examples set them: off for the outbox, on for the inbox
// (enableMaxAttemptsProtection, enablePoisonousMessageProtection: "it is
// suggested to always enable" them for the inbox), maxAttempts and
// maxPoisonousAttempts at their defaults (5 and 3). Under recommended.toml
// they give up on healthy messages (README.md, "What was seen"):
//   * poisonous-message protection counts an attempt as started in the
//     poll's own transaction (next_inbox_messages: started_attempts + 1,
//     COMMIT) and as finished in the handler's. A poll whose COMMIT answer
//     is lost, or a kill right after it, starts up to 5 messages that no
//     one handles; the fourth such start of a message abandons it.
//   * enableMaxAttemptsProtection is read nowhere in 0.5.7 (dist/: only
//     its default is set): maxAttempts (5) applies to the outbox too, even
//     with the protection "off". Each failed handling counts a finished
//     attempt, among them the spurious "could not obtain lock on row"
//     errors that two pollers cause each other (the polling function locks
//     every candidate row NOWAIT until its transaction ends, and the
//     handler's SELECT ... FOR NO KEY UPDATE NOWAIT then fails).
// An abandoned message is never handled again: a missing effect for the
// inbox, an unpublished row for the outbox.
//
// By default (the passing setup) no message is ever given up: the
// poisonous-message protection off, and maxAttempts high enough never to
// be reached (finished_attempts is a smallint). This workload has no
// poisonous message; a system that has some wants a dead-letter path that
// still records the message, not an abandon.
const README_PROTECTIONS = process.argv.includes('--readme-protections');

function listenerSettings(outboxOrInbox) {
  const outbox = outboxOrInbox === 'outbox';
  const protections = README_PROTECTIONS
    ? { enableMaxAttemptsProtection: !outbox, enablePoisonousMessageProtection: !outbox }
    : { enableMaxAttemptsProtection: false, enablePoisonousMessageProtection: false, maxAttempts: 30000 };
  return {
    dbSchema: SCHEMA,
    dbTable: outboxOrInbox,
    ...protections,
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

// One connection before anything else: the harness strikes a process only
// once its session shows, and nothing is served before the database answers.
async function untilReachable(pool, log, stopping) {
  while (!stopping()) {
    try {
      (await pool.connect()).release();
      return;
    } catch (e) {
      log.warn(`database not reachable yet: ${e.message}`);
      await sleep(500);
    }
  }
}

module.exports = { README_PROTECTIONS, SCHEMA, INSTANCE, dbConfig, listenerSettings, pollingConfig, logger, transportMessage, sleep, untilReachable };
