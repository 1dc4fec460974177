// client-* events: relayed on private- and presence- channels only when
// greendot runs with --pusher-client-events, never echoed to the sender,
// carrying user_id on presence channels, at most 10 a second per socket.

import { test } from 'node:test';
import {
  assert, startGreendot, pusherClient, backend, subscribe, waitEvent, waitFor, rawConnected, uniq,
} from './helpers.js';

function got(ch, name) {
  return ch.log.filter((e) => e.event === name);
}

test('without --pusher-client-events a client event is a pusher:error and is relayed to nobody', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const sdk = backend(server);
  const priv = `private-${uniq('chat')}`;
  const bob = pusherClient(t, server, { user: 'bob' });
  const b = await subscribe(bob, priv);

  const sock = await rawConnected(t, server);
  sock.send('pusher:subscribe', { channel: priv, auth: sdk.authorizeChannel(sock.socketId, priv).auth });
  await sock.waitFrame((f) => f.event === 'pusher_internal:subscription_succeeded' && f.channel === priv, `subscription_succeeded on ${priv}`);
  const from = sock.frames.length;
  sock.send('client-typing', { who: 'raw' }, priv);
  const err = await sock.waitFrame((f) => f.event === 'pusher:error', 'pusher:error for a client event while they are off', { from });
  assert.equal(typeof err.data.message, 'string', JSON.stringify(err));

  await sdk.trigger(priv, 'barrier', {});
  await waitEvent(b, 'barrier');
  assert.deepEqual(got(b, 'client-typing'), [], 'nothing relayed to bob');
});

test('with --pusher-client-events: relayed on private channels to the others, never echoed', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t, { clientEvents: true });
  const sdk = backend(server);
  const priv = `private-${uniq('chat')}`;
  const alice = pusherClient(t, server, { user: 'alice' });
  const bob = pusherClient(t, server, { user: 'bob' });
  const a = await subscribe(alice, priv);
  const b = await subscribe(bob, priv);

  assert.equal(a.trigger('client-typing', { who: 'alice' }), true, 'pusher-js sent it');
  await waitEvent(b, 'client-typing', (d) => d.who === 'alice');
  await sdk.trigger(priv, 'barrier', {});
  await waitEvent(a, 'barrier');
  assert.deepEqual(got(a, 'client-typing'), [], 'not echoed to alice');
});

test('with --pusher-client-events: on presence channels the event carries the sender’s user_id', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t, { clientEvents: true });
  const ch = `presence-${uniq('eng')}`;
  const alice = pusherClient(t, server, { user: 'alice' });
  const bob = pusherClient(t, server, { user: 'bob' });
  const a = await subscribe(alice, ch);
  const b = await subscribe(bob, ch);
  const seen = [];
  b.bind('client-wave', (data, metadata) => seen.push({ data, metadata }));

  a.trigger('client-wave', { hi: 1 });
  await waitFor(() => seen.length === 1, { message: () => `bob to get client-wave; his events: ${JSON.stringify(b.log)}` });
  assert.deepEqual(seen[0].data, { hi: 1 });
  assert.equal(seen[0].metadata?.user_id, 'alice', `metadata ${JSON.stringify(seen[0].metadata)}`);
});

test('with --pusher-client-events: a client event on a public channel is refused', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t, { clientEvents: true });
  const sdk = backend(server);
  const pub = uniq('lobby');
  const bob = pusherClient(t, server, { user: 'bob' });
  const b = await subscribe(bob, pub);
  const sock = await rawConnected(t, server);
  sock.send('pusher:subscribe', { channel: pub });
  await sock.waitFrame((f) => f.event === 'pusher_internal:subscription_succeeded' && f.channel === pub, `subscription_succeeded on ${pub}`);
  const from = sock.frames.length;
  sock.send('client-typing', {}, pub);
  await sock.waitFrame((f) => f.event === 'pusher:error', 'pusher:error for a client event on a public channel', { from });
  await sdk.trigger(pub, 'barrier', {});
  await waitEvent(b, 'barrier');
  assert.deepEqual(got(b, 'client-typing'), []);
});

test('more than 10 client events a second from one socket: pusher:error 4301, the connection stays open', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t, { clientEvents: true });
  const sdk = backend(server);
  const priv = `private-${uniq('chat')}`;
  const sock = await rawConnected(t, server);
  sock.send('pusher:subscribe', { channel: priv, auth: sdk.authorizeChannel(sock.socketId, priv).auth });
  await sock.waitFrame((f) => f.event === 'pusher_internal:subscription_succeeded' && f.channel === priv, `subscription_succeeded on ${priv}`);
  const bob = pusherClient(t, server, { user: 'bob' });
  const b = await subscribe(bob, priv);

  const from = sock.frames.length;
  for (let i = 0; i < 15; i++) sock.send('client-burst', { i }, priv);
  const err = await sock.waitFrame((f) => f.event === 'pusher:error' && f.data?.code === 4301, 'pusher:error 4301', { from });
  assert.equal(err.data.code, 4301);
  await waitFor(() => got(b, 'client-burst').length >= 10, { message: () => `bob to get the first 10; he got ${got(b, 'client-burst').length}` });
  assert.ok(got(b, 'client-burst').length <= 11, `at most ~10 relayed in the burst; got ${got(b, 'client-burst').length}`);

  assert.ok(sock.open, 'the socket is still open');
  const before = sock.frames.length;
  sock.send('pusher:ping', {});
  await sock.waitFrame((f) => f.event === 'pusher:pong', 'pusher:pong after the 4301', { from: before });
  assert.equal(sock.closeCode, null);
});
