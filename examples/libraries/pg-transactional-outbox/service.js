#!/usr/bin/env node
// The order service on pg-transactional-outbox: POST /orders writes the order
// and its OrderPlaced outbox message in ONE transaction, as the library's
// README ("Implementing the transactional outbox producer") writes the movie
// and its movie_created message: START TRANSACTION ISOLATION LEVEL
// SERIALIZABLE, the business insert, storeOutboxMessage(message, client)
// (from initializeMessageStorage), COMMIT; ROLLBACK and a released-with-error
// client on any failure. The answer goes out only after the COMMIT.
//
//   POST /orders  {"order_id": "<uuid>", "sku": "apple", "quantity": 3}
//     201  the order was placed now
//     200  the same order was placed before (a retry): nothing new is written
//     400  the body is not such an order
//     409  an order with this id exists with other contents
//     503  the database failed: nothing was written, or the answer is unknown
//   GET /health   200 once the service has its database connection
//
// The outbox message: id a fresh UUID (the event_id on the topic),
// aggregateType 'order', aggregateId the order id (the message key),
// messageType 'OrderPlaced', segment the order id (the polling function
// hands out the oldest unprocessed message of each segment: one segment per
// order lets the relays send many orders at once, in order per order),
// payload {order_id, sku, quantity}, createdAt now.
//
// --two-transactions (THE BUG, broken-two-transactions.toml): the order is
// committed first and its outbox message stored in a second transaction,
// what the README's "The movie and the outbox message must be inserted in
// the same transaction" forbids. A kill between the two commits leaves an
// order no one downstream ever hears of.
'use strict';
const http = require('node:http');
const { randomUUID } = require('node:crypto');
const { Pool } = require('pg');
const { initializeMessageStorage } = require('pg-transactional-outbox');
const { dbConfig, pollingConfig, logger: makeLogger, INSTANCE, untilReachable } = require('./common');

const TWO_TRANSACTIONS = process.argv.includes('--two-transactions');
const logger = makeLogger('service');
const storeOutboxMessage = initializeMessageStorage(pollingConfig('outbox'), logger);
const pool = new Pool({ ...dbConfig(), max: 16, idleTimeoutMillis: 0 });
pool.on('error', e => logger.warn(`idle database connection lost: ${e.message}`));

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function parseOrder(raw) {
  let body;
  try {
    body = JSON.parse(raw);
  } catch (e) {
    throw new Error(`body is not JSON: ${e.message}`);
  }
  const keys = body !== null && typeof body === 'object' && !Array.isArray(body) ? Object.keys(body).sort() : null;
  if (keys === null || keys.join(',') !== 'order_id,quantity,sku') {
    throw new Error('body must be an object with exactly order_id, sku and quantity');
  }
  const { order_id, sku, quantity } = body;
  if (typeof order_id !== 'string' || !UUID.test(order_id)) throw new Error('order_id must be a UUID string');
  if (typeof sku !== 'string' || sku === '') throw new Error('sku must be a non-empty string');
  if (!Number.isInteger(quantity) || !(quantity > 0 && quantity < 2 ** 31)) {
    throw new Error('quantity must be a positive integer');
  }
  return { orderId: order_id.toLowerCase(), sku, quantity };
}

function outboxMessage(orderId, sku, quantity) {
  return {
    id: randomUUID(),
    aggregateType: 'order',
    aggregateId: orderId,
    messageType: 'OrderPlaced',
    segment: orderId,
    payload: { order_id: orderId, sku, quantity },
    createdAt: new Date().toISOString(),
  };
}

// One transaction as the README writes it: begin, work, COMMIT; on any error
// ROLLBACK and release the client with the error (the pool drops it).
async function inTransaction(work) {
  const client = await pool.connect();
  const lost = e => logger.warn(`database connection lost: ${e.message}`);
  client.on('error', lost);
  try {
    await client.query('START TRANSACTION ISOLATION LEVEL SERIALIZABLE');
    const result = await work(client);
    await client.query('COMMIT');
    client.removeListener('error', lost);
    client.release();
    return result;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    client.release(true);
    throw err;
  }
}

async function placeOrder({ orderId, sku, quantity }) {
  const event = { order_id: orderId, sku, quantity };
  if (TWO_TRANSACTIONS) {
    const isNew = await inTransaction(async client => {
      const r = await client.query(
        'INSERT INTO orders (order_id, sku, quantity) VALUES ($1, $2, $3) ON CONFLICT (order_id) DO NOTHING RETURNING order_id',
        [orderId, sku, quantity]
      );
      return r.rowCount === 1;
    });
    if (!isNew) return [200, event];
    // THE BUG: the message in a second transaction.
    await inTransaction(client => storeOutboxMessage(outboxMessage(orderId, sku, quantity), client));
    return [201, event];
  }
  return inTransaction(async client => {
    const r = await client.query(
      'INSERT INTO orders (order_id, sku, quantity) VALUES ($1, $2, $3) ON CONFLICT (order_id) DO NOTHING RETURNING order_id',
      [orderId, sku, quantity]
    );
    if (r.rowCount === 1) {
      // Only a new order gets a message: a retry that finds its order must
      // not announce it a second time.
      await storeOutboxMessage(outboxMessage(orderId, sku, quantity), client);
      return [201, event];
    }
    const existing = await client.query('SELECT sku, quantity FROM orders WHERE order_id = $1', [orderId]);
    const row = existing.rows[0];
    if (row && row.sku === sku && row.quantity === quantity) return [200, event];
    return [409, { error: `order ${orderId} exists with other contents` }];
  });
}

function answer(res, status, body) {
  const data = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) });
  res.end(data);
}

async function handle(req, res) {
  if (req.method === 'GET' && req.url === '/health') return answer(res, 200, { status: 'ok' });
  if (req.method !== 'POST' || req.url !== '/orders') return answer(res, 404, { error: 'not found' });
  const chunks = [];
  let size = 0;
  for await (const c of req) {
    size += c.length;
    if (size > 64 * 1024) return answer(res, 400, { error: 'body too large' });
    chunks.push(c);
  }
  let order;
  try {
    order = parseOrder(Buffer.concat(chunks).toString('utf8'));
  } catch (e) {
    return answer(res, 400, { error: e.message });
  }
  try {
    const [status, body] = await placeOrder(order);
    return answer(res, status, body);
  } catch (e) {
    // Rolled back, or (a connection lost during COMMIT) perhaps committed:
    // the client may retry with the same order_id, which is safe.
    logger.warn(`order ${order.orderId} failed: ${e.message}`);
    return answer(res, 503, { error: 'database error' });
  }
}

async function main() {
  let stopping = false;
  let server = null;
  const stop = () => {
    stopping = true;
    logger.info('SIGTERM: stopping');
    setTimeout(() => process.exit(0), 5000).unref();
    if (server) server.close(() => pool.end().finally(() => process.exit(0)));
    else process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.on('unhandledRejection', e => logger.error(`unhandled: ${(e && e.stack) || e}`));
  logger.info(`start: incarnation ${process.env.CHAOS_INCARNATION || '?'}${TWO_TRANSACTIONS ? ' (THE BUG: --two-transactions)' : ''}`);

  // One connection before listening: the harness sees the session, and
  // /health never answers before the database does.
  await untilReachable(pool, logger, () => stopping);
  if (stopping) return;
  const port = parseInt(process.env.CHAOS_PORT || '8080', 10);
  server = http.createServer((req, res) =>
    handle(req, res).catch(e => {
      logger.error(`request failed: ${e.stack || e}`);
      if (!res.headersSent) answer(res, 500, { error: 'internal error' });
    })
  );
  server.keepAliveTimeout = 30000;
  server.listen(port, '127.0.0.1', () => logger.info(`${INSTANCE} listening on 127.0.0.1:${port}`));
}

main();
