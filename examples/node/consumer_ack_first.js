#!/usr/bin/env node
// THE BUG, one mistake: consumer_apply_later.js with its two steps swapped.
// Each chunk's Kafka offsets are committed BEFORE the chunk is stored in
// inbox_queue ("acknowledge on receipt"). A kill between the offset commit
// and the store's database commit loses the chunk: the group resumes after
// it, and its orders are never stored, never applied. chaos must say
// `missing effect` (broken-ack-first.toml).
//
// Everything else is consumer_apply_later.js's own code: the store, the
// poller, the decoding, the environment, the signals.
'use strict';

require('./consumer_apply_later.js')
  .main({ ackFirst: true })
  .catch(e => {
    process.stderr.write(`fatal: ${e.stack || e}\n`);
    process.exit(1);
  });
