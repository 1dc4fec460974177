// Pusher-format presence webhooks as an app's backend receives them: every
// request verified and read by the `pusher` SDK's own webhook check
// (pusher.webhook({headers, rawBody}).isValid() / getEvents()), while
// pusher-js clients come and go on one node and on two nodes on Redis.

import { test } from 'node:test';
import http from 'node:http';
import {
  assert, startRedis, startGreendot, pusherClient, subscribe, waitFor, uniq, PusherSDK, APP, GRACE_MS,
} from './helpers.js';

/**
 * A webhook receiver on a free port, closed after the test: events holds
 * each verified request's events as "name channel [user_id]"; invalid
 * counts the requests the SDK refused.
 */
async function startReceiver(t) {
  const sdk = new PusherSDK({ appId: APP.id, key: APP.key, secret: APP.secret });
  const recv = { events: [], invalid: 0, requests: 0 };
  const srv = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      recv.requests++;
      const hook = sdk.webhook({ headers: req.headers, rawBody: Buffer.concat(chunks).toString('utf8') });
      if (!hook.isValid()) {
        recv.invalid++;
      } else {
        for (const e of hook.getEvents()) recv.events.push([e.name, e.channel, e.user_id].filter(Boolean).join(' '));
      }
      res.writeHead(200).end();
    });
  });
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise((resolve) => srv.close(resolve)));
  recv.url = `http://127.0.0.1:${srv.address().port}/pusher/webhooks`;
  return recv;
}

/** Waits until recv's events are exactly want, in order. */
function expectEvents(recv, want, timeout = GRACE_MS + 8000) {
  return waitFor(() => JSON.stringify(recv.events) === JSON.stringify(want), {
    timeout, message: () => `webhook events\n  ${JSON.stringify(recv.events)}\nwant\n  ${JSON.stringify(want)}`,
  });
}

async function occupancy(t, [n1, n2], recv) {
  const team = uniq('room');
  const ch = `presence-${team}`;
  const want = [];
  const alice = pusherClient(t, n1, { user: 'alice' });
  await subscribe(alice, ch);
  want.push(`channel_occupied ${ch}`, `member_added ${ch} alice`);
  await expectEvents(recv, want);
  const bob = pusherClient(t, n2, { user: 'bob' });
  await subscribe(bob, ch);
  want.push(`member_added ${ch} bob`);
  await expectEvents(recv, want);
  alice.disconnect();
  want.push(`member_removed ${ch} alice`);
  await expectEvents(recv, want);
  bob.disconnect();
  want.push(`member_removed ${ch} bob`, `channel_vacated ${ch}`);
  await expectEvents(recv, want);
  assert.equal(recv.invalid, 0, `${recv.invalid} of ${recv.requests} requests failed the SDK's signature check`);
}

test('one node: channel_occupied, member_added, member_removed, channel_vacated, each verified by the pusher SDK', { timeout: 60000 }, async (t) => {
  const recv = await startReceiver(t);
  const n = await startGreendot(t, { extra: ['--pusher-webhook-url', recv.url] });
  await occupancy(t, [n, n], recv);
});

test('two nodes on Redis: the team is occupied and vacated once, whichever node its members are on', { timeout: 60000 }, async (t) => {
  const recv = await startReceiver(t);
  const redis = await startRedis(t);
  const n1 = await startGreendot(t, { redis, nodeId: 'n1', extra: ['--pusher-webhook-url', recv.url] });
  const n2 = await startGreendot(t, { redis, nodeId: 'n2', extra: ['--pusher-webhook-url', recv.url] });
  await occupancy(t, [n1, n2], recv);
});
