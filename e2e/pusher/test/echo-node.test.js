// Laravel Echo in Node, as an app uses it: Echo.join('eng').here().joining().leaving(),
// with pusher-js (the node build) passed as its client.

import { test } from 'node:test';
import Echo from 'laravel-echo';
import { assert, startGreendot, pusherClient, backend, waitFor, uniq, GRACE_MS } from './helpers.js';

/** An Echo on a pusher-js client of user (info is what the app's auth returns). */
function echoFor(t, server, user, info) {
  const client = pusherClient(t, server, { user, info });
  const echo = new Echo({ broadcaster: 'pusher', key: 'e2e-key', client });
  t.after(() => echo.disconnect());
  return echo;
}

/** Joins room the way an app does, recording what Echo hands over. */
function join(echo, room) {
  const seen = { here: null, joining: [], leaving: [], errors: [] };
  echo.join(room)
    .here((users) => { seen.here = users; })
    .joining((user) => seen.joining.push(user))
    .leaving((user) => seen.leaving.push(user))
    .error((err) => seen.errors.push(err));
  return seen;
}

const byId = (a, b) => a.id.localeCompare(b.id);

test('Echo.join: here lists who is in, joining and leaving follow users, not tabs', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const room = uniq('eng');
  const alice = { id: 'alice', name: 'Alice' };
  const bob = { id: 'bob', name: 'Bob' };

  const a = join(echoFor(t, server, 'alice', alice), room);
  await waitFor(() => a.here, { message: () => `alice’s here() (errors ${JSON.stringify(a.errors)})` });
  assert.deepEqual(a.here, [alice]);

  const bobEcho = echoFor(t, server, 'bob', bob);
  const b = join(bobEcho, room);
  await waitFor(() => b.here, { message: () => `bob’s here() (errors ${JSON.stringify(b.errors)})` });
  assert.deepEqual([...b.here].sort(byId), [alice, bob]);
  await waitFor(() => a.joining.length === 1, { message: () => `alice’s joining(bob); got ${JSON.stringify(a.joining)}` });
  assert.deepEqual(a.joining, [bob]);

  // bob's second tab: nobody is told.
  const bobTab2 = echoFor(t, server, 'bob', bob);
  const b2 = join(bobTab2, room);
  await waitFor(() => b2.here, { message: 'bob’s second tab here()' });
  assert.deepEqual([...b2.here].sort(byId), [alice, bob]);

  // Both tabs closed: a socket stays one of bob's devices until it closes.
  bobEcho.disconnect();
  bobTab2.disconnect();
  await waitFor(() => a.leaving.length === 1, { timeout: GRACE_MS + 5000, message: () => `alice’s leaving(bob); got ${JSON.stringify(a.leaving)}` });
  assert.deepEqual(a.leaving, [bob]);
  assert.deepEqual(a.joining, [bob], 'one joining for two tabs');
  assert.deepEqual(a.errors, []);
});

test('Echo.private().listen() gets a Laravel event broadcast through the SDK; whisper() reaches the others', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t, { clientEvents: true });
  const orders = `orders.${uniq('1')}`;
  const aliceEcho = echoFor(t, server, 'alice', { id: 'alice' });
  const bobEcho = echoFor(t, server, 'bob', { id: 'bob' });
  const shipped = [];
  const typing = [];
  let subscribed = 0;
  for (const echo of [aliceEcho, bobEcho]) {
    echo.private(orders)
      .subscribed(() => { subscribed++; })
      .listen('OrderShipped', (e) => shipped.push(e))
      .listenForWhisper('typing', (e) => typing.push(e));
  }
  await waitFor(() => subscribed === 2, { message: `both subscribed to private-${orders}` });

  // What Laravel's Pusher broadcaster sends for App\Events\OrderShipped.
  await backend(server).trigger(`private-${orders}`, 'App\\Events\\OrderShipped', { order: { id: 1 } });
  await waitFor(() => shipped.length === 2, { message: () => `OrderShipped for both; got ${JSON.stringify(shipped)}` });
  assert.deepEqual(shipped[0], { order: { id: 1 } });

  aliceEcho.private(orders).whisper('typing', { name: 'Alice' });
  await waitFor(() => typing.length === 1, { message: 'bob to get alice’s whisper' });
  // A broadcast after it reaches alice after any echo of the whisper would.
  await backend(server).trigger(`private-${orders}`, 'App\\Events\\OrderShipped', { order: { id: 2 } });
  await waitFor(() => shipped.length === 4, { message: 'the second OrderShipped for both' });
  assert.deepEqual(typing, [{ name: 'Alice' }], 'bob got it, and alice was not echoed');
});
