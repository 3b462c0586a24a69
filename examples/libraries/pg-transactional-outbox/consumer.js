#!/usr/bin/env node
// The consumer, two halves in one process, as the library's README
// ("Implementing the transactional inbox consumer") and its RabbitMQ example
// build it:
//
//   receive: a kafkajs consumer in CHAOS_GROUP. eachMessage stores the
//            message in the inbox with the library's inbox storage
//            (initializeMessageStorage, outboxOrInbox 'inbox': INSERT ...
//            ON CONFLICT (id) DO NOTHING) in a transaction of its own
//            (executeTransaction, READ COMMITTED). Only when that committed
//            does eachMessage return, and kafkajs marks the offset resolved;
//            its auto-commit commits resolved offsets only, after each batch.
//   apply:   the library's polling inbox listener
//            (initializePollingMessageListener, outboxOrInbox 'inbox') with
//            one TransactionalMessageHandler for ('order', 'OrderPlaced'): in
//            the library's transaction, which has locked the inbox row and
//            checked it is not processed, insert the shipment (message id,
//            order id) and take the quantity off the stock; the library then
//            sets processed_at and commits. No message is ever given up
//            (common.js: the README's protections give up on healthy
//            messages under faults; --readme-protections puts them back).
//
// A kill before the store's commit: the offset was not committed, the
// message comes again. After it: the row is durable; a redelivery stores
// nothing (the id is the primary key). Mid-apply: the apply rolls back, the
// inbox row stays unprocessed and is handed out again once its 5 s lock ran
// out.
//
// kafkajs has no static membership (CHAOS_INSTANCE unused): a restart
// rebalances the group. sessionTimeout from CHAOS_SESSION_TIMEOUT_MS.
//
// --apply-directly (THE BUG, broken-apply-directly.toml): skips the
// inbox and applies the effect in the Kafka handler's own transaction.
'use strict';
const { Kafka, logLevel } = require('kafkajs');
const { Pool } = require('pg');
const {
  IsolationLevel,
  executeTransaction,
  initializeMessageStorage,
  initializePollingMessageListener,
} = require('pg-transactional-outbox');
const { README_PROTECTIONS, dbConfig, pollingConfig, logger: makeLogger, INSTANCE, sleep, untilReachable } = require('./common');

const logger = makeLogger('consumer');
const inboxConfig = pollingConfig('inbox');
const storeInboxMessage = initializeMessageStorage(inboxConfig, logger);

// The handler's effect, in the transaction the library gives it.
async function applyOrderPlaced(message, client) {
  const { order_id, sku, quantity } = message.payload || {};
  await client.query('INSERT INTO shipments (order_id, message_id) VALUES ($1, $2)', [order_id, message.id]);
  const r = await client.query('UPDATE stock SET on_hand = on_hand - $1 WHERE sku = $2', [quantity, sku]);
  if (r.rowCount !== 1) logger.warn(`no stock row for sku ${JSON.stringify(sku)}`);
}

const orderPlacedHandler = {
  aggregateType: 'order',
  messageType: 'OrderPlaced',
  handle: applyOrderPlaced,
  handleError: async (error, message, _client, retry) => {
    if (!retry) logger.error(error, `Giving up processing message with ID ${message.id}.`);
  },
};

// A message the library can store: the fields its RabbitMQ example checks,
// and a payload that is an order.
function decode(kafkaMessage) {
  let m;
  try {
    m = JSON.parse(kafkaMessage.value ? kafkaMessage.value.toString('utf8') : '');
  } catch (e) {
    return null;
  }
  if (!m || typeof m !== 'object' || !m.id || !m.aggregateType || !m.messageType || !m.createdAt) return null;
  const p = m.payload;
  if (!p || typeof p !== 'object' || typeof p.order_id !== 'string' || typeof p.sku !== 'string' || !Number.isInteger(p.quantity)) {
    return null;
  }
  return m;
}

async function main() {
  let stopping = false;
  let onStop;
  const stopped = new Promise(resolve => (onStop = resolve));
  const stop = () => {
    stopping = true;
    onStop();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.on('unhandledRejection', e => logger.error(`unhandled: ${(e && e.stack) || e}`));
  const applyDirectly = process.argv.includes('--apply-directly');
  logger.info(`start: incarnation ${process.env.CHAOS_INCARNATION || '?'}${applyDirectly ? ' (THE BUG: --apply-directly)' : ''}${README_PROTECTIONS ? ' (--readme-protections)' : ''}`);
  const sessionTimeout = parseInt(process.env.CHAOS_SESSION_TIMEOUT_MS || '6000', 10);

  // The database first: the harness strikes a process only once its
  // session shows.
  const pool = new Pool({ ...dbConfig(), max: 4, idleTimeoutMillis: 0 });
  pool.on('error', e => logger.warn(`idle database connection lost: ${e.message}`));
  await untilReachable(pool, logger, () => stopping);

  // The apply half: the library's inbox listener.
  let shutdownListener = null;
  if (!applyDirectly) {
    [shutdownListener] = initializePollingMessageListener(inboxConfig, [orderPlacedHandler], logger);
  }

  // A client of the pool for executeTransaction, as the README's
  // `executeTransaction(await pool.connect(), ...)`, with one difference: an
  // 'error' listener. The pool removes its own while a client is checked
  // out, and a connection reset mid-transaction (the fault proxy's lost
  // COMMIT answer) then emits an 'error' no one listens to, which ends the
  // process: the README's code as written did, in the first run of
  // recommended.toml. The query in flight fails as well; executeTransaction
  // rolls back and releases the client with the error (the pool drops it).
  const checkout = async () => {
    const client = await pool.connect();
    if (!client.ptoErrorListener) {
      client.ptoErrorListener = true;
      client.on('error', e => logger.warn(`database connection lost: ${e.message}`));
    }
    return client;
  };

  // The receive half.
  const store = async message => {
    if (applyDirectly) {
      // THE BUG: no inbox, the effect straight from the topic.
      await executeTransaction(await checkout(), client => applyOrderPlaced(message, client), IsolationLevel.ReadCommitted);
      return;
    }
    await executeTransaction(await checkout(), client => storeInboxMessage(message, client), IsolationLevel.ReadCommitted);
  };

  const kafka = new Kafka({ clientId: INSTANCE, brokers: (process.env.CHAOS_BROKERS || '').split(','), logLevel: logLevel.WARN });
  let consumer = null;
  async function startConsumer() {
    const c = kafka.consumer({
      groupId: process.env.CHAOS_GROUP,
      sessionTimeout,
      heartbeatInterval: Math.max(500, Math.floor(sessionTimeout / 6)),
      rebalanceTimeout: Math.max(10000, 2 * sessionTimeout),
      maxWaitTimeInMs: 500,
      allowAutoTopicCreation: false,
    });
    consumer = c;
    c.on(c.events.CRASH, ({ payload }) => {
      if (!payload.restart && !stopping && consumer === c) {
        logger.warn(`consumer crashed for good (${payload.error && payload.error.message}): starting a new one`);
        sleep(500).then(() => c.disconnect().catch(() => {})).then(keepConsuming);
      }
    });
    await c.connect();
    await c.subscribe({ topics: [process.env.CHAOS_TOPIC], fromBeginning: true });
    await c.run({
      // The kafkajs default: resolved offsets committed after each batch.
      // eachMessage resolves a message's offset only once it returned.
      autoCommit: true,
      partitionsConsumedConcurrently: 3,
      eachMessage: async ({ partition, message, heartbeat }) => {
        const m = decode(message);
        if (m === null) {
          logger.warn(`p${partition}@${message.offset}: not a TransactionalMessage with an order, skipped`);
          return;
        }
        // Stored before eachMessage returns; a failure (a reset connection,
        // the database away) is tried again here, heartbeating, so the
        // offset never moves past an unstored message.
        for (let attempt = 0; ; attempt++) {
          try {
            await store(m);
            return;
          } catch (e) {
            logger.warn(`store of p${partition}@${message.offset} failed (attempt ${attempt + 1}): ${e.message}`);
            if (stopping) throw e;
            await heartbeat().catch(() => {});
            await sleep(Math.min(100 * 2 ** attempt, 1000));
          }
        }
      },
    });
  }
  async function keepConsuming() {
    while (!stopping) {
      try {
        await startConsumer();
        return;
      } catch (e) {
        logger.warn(`cannot start the consumer, trying again: ${e.message}`);
        await consumer.disconnect().catch(() => {});
        await sleep(500);
      }
    }
  }
  await keepConsuming();
  await stopped;
  logger.info('SIGTERM: stopping');
  setTimeout(() => process.exit(0), 8000).unref();
  if (consumer) await consumer.disconnect().catch(e => logger.warn(`disconnect: ${e.message}`));
  if (shutdownListener) await shutdownListener().catch(() => {});
  await pool.end().catch(() => {});
  process.exit(0);
}

main().catch(e => {
  logger.error(`fatal: ${e.stack || e}`);
  process.exit(1);
});
