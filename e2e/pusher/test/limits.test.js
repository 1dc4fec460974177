// Limits, answered as Pusher answers them: event data over 10 KiB is a 413;
// a channel name with bad characters or over 164 characters a
// pusher:subscription_error on that channel, which pusher-js hands to the
// channel's own error handler (client), or a 400 (REST); more than 100
// channels in one trigger a 400.

import { test } from 'node:test';
import { assert, startGreendot, pusherClient, backend, subscribe, waitEvent, rawConnected, status, uniq } from './helpers.js';

test('REST: data over 10 KiB is a 413; 10 KiB passes', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const sdk = backend(server);
  const ch = uniq('news');
  const alice = pusherClient(t, server, { user: 'alice' });
  const a = await subscribe(alice, ch);

  const big = await status(sdk.trigger(ch, 'big', 'x'.repeat(10 * 1024 + 1)));
  assert.equal(big.status, 413, `10 KiB + 1 of data: ${JSON.stringify(big)}`);
  const batch = await status(sdk.triggerBatch([{ channel: ch, name: 'big', data: 'x'.repeat(10 * 1024 + 1) }]));
  assert.equal(batch.status, 413, `a batch event of 10 KiB + 1: ${JSON.stringify(batch)}`);

  const fits = await status(sdk.trigger(ch, 'fits', 'x'.repeat(10 * 1024)));
  assert.equal(fits.status, 200, `10 KiB of data: ${JSON.stringify(fits)}`);
  await waitEvent(a, 'fits');
  assert.ok(!a.log.some((e) => e.event === 'big'), 'nothing of the refused events arrived');
});

test('REST: a bad channel name or one over 164 characters is a 400; more than 100 channels is a 400', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const sdk = backend(server);
  // sdk.post signs the body without the SDK's own checks, as another
  // library (or an older SDK) would send it.
  const post = (body) => status(sdk.post({ path: '/events', body: { name: 'e', data: '{}', ...body } }));

  assert.equal((await post({ channels: ['bad channel!'] })).status, 400, 'a space and ! in a channel name');
  assert.equal((await post({ channels: ['x'.repeat(165)] })).status, 400, '165 characters');
  assert.equal((await status(sdk.trigger('x'.repeat(165), 'e', {}))).status, 400, '165 characters through trigger');
  assert.equal((await post({ channels: ['x'.repeat(164)] })).status, 200, '164 characters are fine');

  const many = Array.from({ length: 101 }, (_, i) => `c${i}`);
  assert.equal((await post({ channels: many })).status, 400, '101 channels');
  assert.equal((await post({ channels: many.slice(0, 100) })).status, 200, '100 channels are fine');
  const batch = await status(sdk.post({ path: '/batch_events', body: { batch: [{ channel: 'bad channel!', name: 'e', data: '{}' }] } }));
  assert.equal(batch.status, 400, 'a bad channel name in a batch');
});

test('client: subscribing to a bad channel name or one over 164 characters is a subscription_error', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  for (const name of ['bad channel!', 'x'.repeat(165), 'ünïcode']) {
    const sock = await rawConnected(t, server);
    sock.send('pusher:subscribe', { channel: name });
    const f = await sock.waitFrame((x) => x.event === 'pusher:subscription_error' || x.event === 'pusher_internal:subscription_succeeded',
      `subscription_error for channel ${JSON.stringify(name.slice(0, 20))} (${name.length} chars)`);
    assert.equal(f.event, 'pusher:subscription_error', `channel ${JSON.stringify(name.slice(0, 20))}: ${JSON.stringify(f)}`);
    assert.equal(f.channel, name);
    assert.equal(f.data.type, 'InvalidChannel');
    assert.equal(f.data.status, 400);
  }
  const ok = await rawConnected(t, server);
  ok.send('pusher:subscribe', { channel: 'x'.repeat(164) });
  await ok.waitFrame((x) => x.event === 'pusher_internal:subscription_succeeded', 'subscription_succeeded for 164 characters');
});
