#!/usr/bin/env node
// The relay: the library's polling outbox listener
// (initializePollingMessageListener, outboxOrInbox 'outbox'), its
// GeneralMessageHandler publishing each message with a kafkajs producer, as
// the README's "Implementing the transactional outbox producer" wires its
// messagePublisher.
//
// What the library does around the handler (dist/polling and dist/handler):
// next_outbox_messages(5, 5000) hands out up to 5 unprocessed messages, the
// oldest of each segment, and locks them for 5 s (locked_until,
// started_attempts + 1), in a transaction of its own. Each message is then
// handled in a second transaction: SELECT ... FOR NO KEY UPDATE NOWAIT on its
// row (skipped if processed meanwhile), this handler, then processed_at set,
// COMMIT. So the row is marked only after the handler returned, that is after
// the broker acknowledged the message (acks -1): a kill before the COMMIT
// sends the message again once its lock has run out (a duplicate, which the
// inbox absorbs), never loses it. A send that fails throws: the library
// counts a finished attempt and the message comes again after its lock
// (never given up: common.js).
//
// On the topic: key = aggregateId (the order id), headers event_id = the
// message id and event_type = messageType, value = the message as JSON
// (common.js transportMessage: the library's TransactionalMessage, without
// the outbox row's per-attempt state).
'use strict';
const { Kafka, logLevel } = require('kafkajs');
const { initializePollingMessageListener } = require('pg-transactional-outbox');
const { README_PROTECTIONS, pollingConfig, logger: makeLogger, transportMessage, INSTANCE, sleep } = require('./common');

const logger = makeLogger('relay');
const topic = process.env.CHAOS_TOPIC;

async function main() {
  let shutdownListener = null;
  let producer = null;
  const stop = async () => {
    logger.info('SIGTERM: stopping');
    setTimeout(() => process.exit(0), 8000).unref();
    if (shutdownListener) await shutdownListener().catch(e => logger.warn(`listener shutdown: ${e.message}`));
    if (producer) await producer.disconnect().catch(() => {});
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  // Nothing may end this process but a signal (contract, section 5).
  process.on('unhandledRejection', e => logger.error(`unhandled: ${(e && e.stack) || e}`));
  logger.info(`start: incarnation ${process.env.CHAOS_INCARNATION || '?'}${README_PROTECTIONS ? ' (--readme-protections)' : ''}`);

  const kafka = new Kafka({
    clientId: INSTANCE,
    brokers: (process.env.CHAOS_BROKERS || '').split(','),
    logLevel: logLevel.WARN,
  });
  // Idempotent (acks -1, one request in flight): a retried send does not
  // duplicate or reorder within a partition. The default partitioner
  // (murmur2, as Java's) puts all of an order's messages on one partition.
  producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false });
  for (;;) {
    try {
      await producer.connect();
      break;
    } catch (e) {
      logger.warn(`kafka not reachable yet: ${e.message}`);
      await sleep(500);
    }
  }

  const messagePublisher = {
    handle: async message => {
      await producer.send({
        topic,
        acks: -1,
        messages: [
          {
            key: message.aggregateId,
            value: JSON.stringify(transportMessage(message)),
            headers: { event_id: message.id, event_type: message.messageType },
          },
        ],
      });
    },
  };

  const [shutdown] = initializePollingMessageListener(pollingConfig('outbox'), messagePublisher, logger);
  shutdownListener = shutdown;
  logger.info('polling the outbox');
}

main().catch(e => {
  logger.error(`fatal: ${e.stack || e}`);
  process.exit(1);
});
