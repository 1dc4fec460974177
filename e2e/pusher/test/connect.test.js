// Connecting: pusher-js 8 and raw Pusher-protocol sockets against
// /app/{key}?protocol=7, the handshake, a wrong key, ping/pong and a
// connection left idle.

import { test } from 'node:test';
import {
  assert, APP, HEARTBEAT_S, startGreendot, pusherClient, connected, subscribe, expectMembers,
  rawSocket, rawConnected, idle, uniq, waitFor,
} from './helpers.js';

test('pusher:connection_established gives a socket id and the heartbeat interval as activity_timeout', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const sock = await rawSocket(t, server);
  const est = await sock.waitFrame((f) => f.event === 'pusher:connection_established', 'pusher:connection_established');
  assert.match(est.data.socket_id, /^\d+\.\d+$/);
  assert.equal(est.data.activity_timeout, HEARTBEAT_S);

  const client = pusherClient(t, server, { user: 'alice' });
  await connected(client);
  assert.match(client.connection.socket_id, /^\d+\.\d+$/);
  assert.notEqual(client.connection.socket_id, est.data.socket_id, 'every socket has its own id');
  assert.deepEqual(client.errors, []);
});

test('a wrong app key: pusher:error 4001, then the socket closes with 4001', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const sock = await rawSocket(t, server, { key: 'not-the-key' });
  const err = await sock.waitFrame((f) => f.event === 'pusher:error', 'pusher:error for a wrong key');
  assert.equal(err.data.code, 4001, `pusher:error ${JSON.stringify(err)}`);
  assert.equal(await sock.closed, 4001);
  assert.ok(!sock.frames.some((f) => f.event === 'pusher:connection_established'), 'no connection_established');

  // pusher-js takes 4000-4099 as "refused": it reports the error and
  // disconnects for good.
  const client = pusherClient(t, server, { user: 'alice', key: 'not-the-key' });
  await waitFor(() => client.connErrors.some((e) => e.error?.data?.code === 4001), {
    timeout: 10000, message: () => `pusher-js to report error 4001; it reported ${JSON.stringify(client.connErrors)}`,
  });
  await waitForState(client, 'disconnected');
  assert.ok(!client.states.includes('connected'), `never connected: ${client.states.join(' → ')}`);
});

test('pusher:ping is answered with pusher:pong', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const sock = await rawConnected(t, server);
  sock.send('pusher:ping', {});
  await sock.waitFrame((f) => f.event === 'pusher:pong', 'pusher:pong');
});

test('a pusher-js connection left idle for 3× the interval stays connected and keeps its member', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const ch = `presence-${uniq('idle')}`;
  const alice = pusherClient(t, server, { user: 'alice', info: { name: 'Alice' } });
  const bob = pusherClient(t, server, { user: 'bob', info: { name: 'Bob' } });
  const aliceCh = await subscribe(alice, ch);
  await subscribe(bob, ch);
  await expectMembers(aliceCh, ['alice', 'bob']);
  const socketId = bob.connection.socket_id;
  const states = bob.states.length;

  // Nobody sends anything but what pusher-js sends by itself (its pings).
  await idle(3 * HEARTBEAT_S * 1000 + 500);

  assert.equal(bob.connection.state, 'connected');
  assert.equal(bob.connection.socket_id, socketId, 'the same socket');
  assert.deepEqual(bob.states.slice(states), [], 'no state change while idle');
  assert.deepEqual(aliceCh.removed, [], 'alice saw no member_removed');
  await expectMembers(aliceCh, ['alice', 'bob']);
});

function waitForState(client, state) {
  return waitFor(() => client.connection.state === state, {
    timeout: 10000, message: () => `pusher-js to be ${state} (states ${client.states.join(' → ')})`,
  });
}
