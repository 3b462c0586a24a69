#!/usr/bin/env node
// The orders consumer in Node.js (kafkajs and pg), with its inbox used as a
// durable queue: a port of examples/orders/consumer_apply_later.py. It
// stores each OrderPlaced in inbox_queue, commits that transaction, and only
// then commits the Kafka offsets of what it stored; a poller in the same
// process applies the stored work later, claiming rows with FOR UPDATE SKIP
// LOCKED, so any instance may apply any row.
//
//   receive: per chunk of CHAOS_BATCH_SIZE messages of a partition's batch,
//            INSERT INTO inbox_queue ... ON CONFLICT (message_id) DO NOTHING
//            (malformed messages into rejected_messages), commit; then that
//            chunk's offsets (kafkajs eachBatch, autoCommit off, nothing
//            resolved by itself)
//   apply:   every half second, up to 5 pending rows FOR UPDATE SKIP LOCKED:
//            take the stock off per sku in sku order, ship, mark them done;
//            one transaction, an empty claim rolled back
//
// It is correct: a kill before the store's commit gets the chunk again (its
// offsets were not committed); a kill after it loses nothing, the rows are
// durable; a kill mid-apply rolls the apply back and leaves the rows pending
// for the next poll. A store that fails (a connection reset, a deadlock that
// kept coming back) commits nothing and resolves nothing: kafkajs fetches the
// chunk again from the last resolved offset.
//
// kafkajs cannot set group.instance.id: no static membership. A restarted
// process joins as a new member, and the group rebalances once the killed
// member's session (CHAOS_SESSION_TIMEOUT_MS) has run out.
//
// consumer_ack_first.js runs this same code with ackFirst set: THE BUG,
// the chunk's offsets committed before it is stored.
//
// Environment (docs/contract.md section 2): CHAOS_BROKERS, CHAOS_TOPIC,
// CHAOS_GROUP, CHAOS_INSTANCE, CHAOS_INCARNATION, CHAOS_SESSION_TIMEOUT_MS,
// CHAOS_BATCH_SIZE, CHAOS_DATABASE_URL, CHAOS_SCHEMA, PGAPPNAME (read by pg
// itself). The packages come from NODE_PATH: NODE_PATH="$(scripts/node-env.sh)".
'use strict';

const INSTANCE = process.env.CHAOS_INSTANCE || '-';

function log(...parts) {
  process.stderr.write(`${new Date().toISOString()} ${INSTANCE} ${parts.join(' ')}\n`);
}

let Kafka, logLevel, pg;
try {
  ({ Kafka, logLevel } = require('kafkajs'));
  pg = require('pg');
} catch (e) {
  log(`cannot load kafkajs and pg (${e.message}): run with NODE_PATH="$(scripts/node-env.sh)"`);
  process.exit(2);
}

const APPLY_EVERY_MS = 500;
const APPLY_AT_MOST = 5;
// A fetch brings one batch per partition; kafkajs hands the member's
// partitions to eachBatch at the same time, each with a database
// connection of its own (the poller has one more).
const PARTITIONS_AT_ONCE = 3;
// PostgreSQL asks for these to be retried: the transaction was rolled back
// as a whole (two members holding overlapping batches during a rebalance).
const RETRY_CODES = new Set(['40P01', '40001']); // deadlock_detected, serialization_failure

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

// ---- decode: consumer.py's decode, distinct_events and record_rejected ----

// Python's uuid.UUID(text): "urn:uuid:" and braces allowed, hyphens
// anywhere, 32 hex digits. Returns the canonical form, or null.
function parseUuid(text) {
  if (typeof text !== 'string') return null;
  const hex = text.replace('urn:', '').replace('uuid:', '').replace(/^[{}]+|[{}]+$/g, '').replace(/-/g, '');
  if (!/^[0-9a-fA-F]{32}$/.test(hex)) return null;
  const h = hex.toLowerCase();
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

function header(message, name) {
  let v = (message.headers || {})[name];
  if (Array.isArray(v)) v = v[v.length - 1]; // a repeated header: the last, as dict() keeps it
  return v == null ? '' : v.toString('utf8');
}

// An OrderPlaced ({kind: 'order', eventId, orderId, sku, quantity}) or a
// rejected message ({kind: 'rejected', partition, offset, eventId, payload,
// error}) saying why it is not one.
function decode(partition, message) {
  // NUL cannot be stored in a text column: dropped, as consumer.py does for the payload.
  const rawId = header(message, 'event_id').replace(/\0/g, '');
  const payload = (message.value ? message.value.toString('utf8') : '').replace(/\0/g, '');
  const reject = error => ({ kind: 'rejected', partition, offset: message.offset, eventId: rawId, payload, error });

  const eventId = parseUuid(rawId);
  if (eventId === null) return reject(`event_id header is not a UUID: ${JSON.stringify(rawId)}`);
  const eventType = header(message, 'event_type');
  if (eventType !== 'OrderPlaced') return reject(`unknown event_type ${JSON.stringify(eventType)}`);
  let body;
  try {
    body = JSON.parse(payload);
  } catch (e) {
    return reject(`value is not JSON: ${e.message}`);
  }
  const keys = body !== null && typeof body === 'object' && !Array.isArray(body) ? Object.keys(body).sort() : null;
  if (keys === null || keys.join(',') !== 'order_id,quantity,sku') {
    return reject('value must have exactly order_id, sku and quantity');
  }
  const { quantity, sku } = body;
  // JSON has one number type here: 3.0 reads as 3 (Python would refuse it as a float).
  if (!Number.isInteger(quantity) || !(quantity > 0 && quantity < 2 ** 31)) {
    return reject(`quantity is not a positive integer: ${JSON.stringify(quantity)}`);
  }
  if (typeof sku !== 'string' || sku === '') return reject(`sku is not a non-empty string: ${JSON.stringify(sku)}`);
  const orderId = parseUuid(body.order_id);
  if (orderId === null) return reject(`order_id is not a UUID: ${JSON.stringify(body.order_id)}`);
  return { kind: 'order', eventId, orderId, sku, quantity };
}

// The chunk's events, each once: a relay that crashed after its acks
// publishes an event twice, and both copies can land in one chunk.
function distinctEvents(decoded) {
  const seen = new Set();
  return decoded.filter(d => d.kind === 'order' && !seen.has(d.eventId) && seen.add(d.eventId));
}

async function recordRejected(client, decoded) {
  for (const r of decoded.filter(d => d.kind === 'rejected')) {
    log(`rejected p${r.partition}@${r.offset}: ${r.error}`);
    // ON CONFLICT: a redelivered bad message is recorded once.
    await client.query(
      `INSERT INTO rejected_messages (topic_partition, topic_offset, event_id, payload, error)
       VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
      [r.partition, r.offset, r.eventId, r.payload, r.error]
    );
  }
}

// ---- the database ----

function makePool() {
  const pool = new pg.Pool({
    connectionString: process.env.CHAOS_DATABASE_URL,
    // CHAOS_SCHEMA is chaos_ and [a-z0-9_]: no quoting needed (contract, section 2).
    options: `-c search_path=${process.env.CHAOS_SCHEMA}`,
    application_name: process.env.PGAPPNAME,
    max: PARTITIONS_AT_ONCE + 1,
    idleTimeoutMillis: 0, // sessions stay open: the harness sees them in pg_stat_activity
    connectionTimeoutMillis: 5000,
  });
  // An idle connection cut (a fault proxy's reset, a restarted server): the
  // pool drops it and opens another on the next checkout.
  pool.on('error', e => log(`idle database connection lost: ${e.message}`));
  return pool;
}

// Runs fn(client) in one transaction on a connection of the pool. fn
// returns false to roll back instead of committing. Retries what PostgreSQL
// asks to retry; any other error propagates. A connection that saw an error
// is closed, not put back: after a reset it may be half dead.
async function transaction(pool, fn) {
  for (let attempt = 0; ; attempt++) {
    const client = await pool.connect();
    let failed = false;
    // A checked-out connection the server ends between two queries (a
    // restart, pg_terminate_backend) emits 'error' on the client; with no
    // listener that would end the process. The next query fails instead.
    const lost = e => log(`database connection lost: ${e.message}`);
    client.on('error', lost);
    try {
      await client.query('BEGIN');
      const keep = await fn(client);
      await client.query(keep === false ? 'ROLLBACK' : 'COMMIT');
      return keep;
    } catch (e) {
      failed = true;
      if (RETRY_CODES.has(e.code) && attempt < 7) {
        log(`${e.message}; retrying (attempt ${attempt + 1})`);
        await sleep(Math.min(20 * 2 ** attempt, 500));
        continue;
      }
      throw e;
    } finally {
      // A failed connection keeps the listener: it is closed, and may still speak.
      if (!failed) client.removeListener('error', lost);
      // Closing the connection rolls back whatever it had open.
      client.release(failed || undefined);
    }
  }
}

// The receive half: the chunk's orders into the queue, once each, and its
// malformed messages into rejected_messages, in one transaction.
async function store(pool, partition, messages) {
  const decoded = messages.map(m => decode(partition, m));
  const events = distinctEvents(decoded);
  await transaction(pool, async client => {
    if (events.length) {
      await client.query(
        `INSERT INTO inbox_queue (message_id, order_id, sku, quantity)
         SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int[])
         ON CONFLICT (message_id) DO NOTHING`,
        [events.map(e => e.eventId), events.map(e => e.orderId), events.map(e => e.sku), events.map(e => e.quantity)]
      );
    }
    await recordRejected(client, decoded);
  });
  return events.length;
}

// The apply half: up to APPLY_AT_MOST pending rows, oldest first, in one
// transaction. An empty claim ends with ROLLBACK: it changed nothing.
async function applySome(pool) {
  let done = 0;
  await transaction(pool, async client => {
    const { rows } = await client.query(
      `SELECT message_id, order_id, sku, quantity FROM inbox_queue
       WHERE status = 'pending' ORDER BY received_at LIMIT $1 FOR UPDATE SKIP LOCKED`,
      [APPLY_AT_MOST]
    );
    if (rows.length === 0) return false;
    // Stock: one UPDATE per sku, in sku order, so that two appliers lock
    // the same skus in the same order and do not deadlock each other.
    const perSku = new Map();
    for (const r of rows) perSku.set(r.sku, (perSku.get(r.sku) || 0) + r.quantity);
    for (const sku of [...perSku.keys()].sort()) {
      const res = await client.query('UPDATE stock SET on_hand = on_hand - $1 WHERE sku = $2', [perSku.get(sku), sku]);
      // An sku the warehouse does not carry: logged, not fatal.
      if (res.rowCount !== 1) log(`no stock row for sku ${JSON.stringify(sku)}`);
    }
    // Shipping: one shipment per order.
    await client.query(
      `INSERT INTO shipments (order_id, message_id)
       SELECT * FROM unnest($1::uuid[], $2::uuid[])`,
      [rows.map(r => r.order_id), rows.map(r => r.message_id)]
    );
    await client.query("UPDATE inbox_queue SET status = 'done' WHERE message_id = ANY($1::uuid[])", [
      rows.map(r => r.message_id),
    ]);
    done = rows.length;
    return true;
  });
  return done;
}

// ---- Kafka ----

function kafkaLogger() {
  const names = { [logLevel.ERROR]: 'ERROR', [logLevel.WARN]: 'WARN', [logLevel.INFO]: 'INFO', [logLevel.DEBUG]: 'DEBUG' };
  return () => ({ namespace, level, log: entry }) => {
    const { message, timestamp, logger, ...extra } = entry;
    const more = Object.keys(extra).length ? ` ${JSON.stringify(extra)}` : '';
    log(`kafkajs ${names[level] || level} ${namespace}: ${message}${more}`);
  };
}

async function main({ ackFirst = false } = {}) {
  // SIGTERM raises a flag: the chunk in hand is finished first. Installed
  // first, so that a SIGTERM during start-up is a clean exit too.
  let stopping = false;
  let onStop;
  const stopped = new Promise(resolve => (onStop = resolve));
  const stop = () => {
    stopping = true;
    onStop();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  // Nothing may end this process but a signal: an exit of its own ends the
  // run (contract, section 5). Every path catches its errors; this is the net.
  process.on('unhandledRejection', e => log(`unhandled: ${(e && e.stack) || e}`));

  log(`start: incarnation ${process.env.CHAOS_INCARNATION || '?'}${ackFirst ? ' (THE BUG: offsets committed before the store)' : ''}`);
  const batchSize = Math.max(1, parseInt(process.env.CHAOS_BATCH_SIZE || '20', 10));
  const sessionTimeout = parseInt(process.env.CHAOS_SESSION_TIMEOUT_MS || '6000', 10);
  const topic = process.env.CHAOS_TOPIC;

  // The database first: the harness strikes a process only once its
  // session shows, and a consumer without its database has nothing to do.
  const pool = makePool();
  while (!stopping) {
    try {
      (await pool.connect()).release();
      break;
    } catch (e) {
      log(`database not reachable yet: ${e.message}`);
      await sleep(500);
    }
  }

  // The poller: applies stored work every APPLY_EVERY_MS, on a connection
  // of its own.
  const poller = (async () => {
    while (!stopping) {
      const started = Date.now();
      try {
        const done = await applySome(pool);
        if (done) log(`applied ${done}`);
      } catch (e) {
        // Rolled back: its rows stay pending for the next poll.
        log(`apply rolled back: ${e.message}`);
      }
      await Promise.race([sleep(Math.max(0, APPLY_EVERY_MS - (Date.now() - started))), stopped]);
    }
  })();

  const kafka = new Kafka({
    clientId: INSTANCE,
    brokers: (process.env.CHAOS_BROKERS || '').split(','),
    logLevel: logLevel.INFO,
    logCreator: kafkaLogger(),
  });

  // One chunk of a partition's batch: stored, then acknowledged (or, with
  // ackFirst, the other way round). Returns false when the store failed:
  // nothing was resolved, and the next fetch brings the chunk again.
  async function handleChunk(payload, chunk) {
    const { batch, resolveOffset, heartbeat, commitOffsetsIfNecessary } = payload;
    const last = chunk[chunk.length - 1].offset;
    // The chunk's own offset, for its own partition: never "whatever was resolved".
    const commit = () =>
      commitOffsetsIfNecessary({
        topics: [{ topic: batch.topic, partitions: [{ partition: batch.partition, offset: (BigInt(last) + 1n).toString() }] }],
      });
    if (ackFirst) {
      await commit(); // THE BUG: acknowledged before it is stored
    }
    // Heartbeats go on while the store waits (on a lock a paused member
    // holds, say), so that a slow chunk does not cost this member its session.
    const beat = setInterval(() => heartbeat().catch(() => {}), 1000);
    let stored;
    try {
      stored = await store(pool, batch.partition, chunk);
    } catch (e) {
      log(`store of p${batch.partition}@${chunk[0].offset}..${last} rolled back, it will come again: ${e.message}`);
      return false;
    } finally {
      clearInterval(beat);
    }
    if (!ackFirst) {
      // Only now the chunk's offsets. A zombie (paused past its session) is
      // refused here; kafkajs rejoins, and the new owner's redelivery stores
      // nothing twice.
      await commit();
    }
    resolveOffset(last);
    log(`stored ${stored} of a batch of ${chunk.length} (p${batch.partition}@${chunk[0].offset}..${last})`);
    return true;
  }

  let consumer = null;
  async function startConsumer() {
    const c = kafka.consumer({
      groupId: process.env.CHAOS_GROUP,
      sessionTimeout,
      heartbeatInterval: Math.max(500, Math.floor(sessionTimeout / 6)),
      rebalanceTimeout: Math.max(10000, 2 * sessionTimeout),
      // Short fetches: kafkajs heartbeats between them, so a rebalance is
      // noticed within a second, not after a 5 s long poll.
      maxWaitTimeInMs: 500,
      allowAutoTopicCreation: false,
    });
    consumer = c;
    // kafkajs restarts itself after most crashes; after one it does not
    // restart from (a non-retriable error), a fresh client takes its place,
    // or this process would live on and consume nothing.
    c.on(c.events.CRASH, ({ payload }) => {
      if (!payload.restart && !stopping && consumer === c) {
        log(`consumer crashed for good (${payload.error && payload.error.message}): starting a new one`);
        sleep(500).then(() => c.disconnect().catch(() => {})).then(keepConsuming);
      }
    });
    await c.connect();
    await c.subscribe({ topics: [topic], fromBeginning: true });
    await c.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      partitionsConsumedConcurrently: PARTITIONS_AT_ONCE,
      eachBatch: async payload => {
        const { batch, isRunning, isStale, heartbeat } = payload;
        for (let i = 0; i < batch.messages.length; i += batchSize) {
          if (!isRunning() || isStale() || stopping) return;
          if (!(await handleChunk(payload, batch.messages.slice(i, i + batchSize)))) {
            await sleep(200);
            return;
          }
          await heartbeat();
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
        log(`cannot start the consumer, trying again: ${e.message}`);
        await consumer.disconnect().catch(() => {});
        await sleep(500);
      }
    }
  }

  await keepConsuming();
  await stopped;
  log('SIGTERM: stopping');
  // The contract gives 10 s before a SIGKILL: gone before that, whatever hangs.
  setTimeout(() => process.exit(0), 8000).unref();
  if (consumer) await consumer.disconnect().catch(e => log(`disconnect: ${e.message}`));
  await poller;
  await pool.end().catch(() => {});
  process.exit(0);
}

module.exports = { main };

if (require.main === module) {
  main().catch(e => {
    log(`fatal: ${e.stack || e}`);
    process.exit(1);
  });
}
