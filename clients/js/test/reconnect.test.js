// Server restarts: a crash (SIGKILL) and a drain (SIGTERM), each followed by a
// new `greendot serve` on the same port. The memory store forgets teams and
// versions on restart, which the client must take in its stride.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer, addMember, clients, waitFor, waitOpen, waitPresence, recordingWebSocket, uniq,
} from './helpers.js';

async function pair(t, server) {
  const mk = clients(t);
  const team = uniq('team');
  const [alice, bob] = [uniq('alice'), uniq('bob')];
  await addMember(server, team, alice);
  await addMember(server, team, bob);
  const rec = recordingWebSocket();
  const opts = { url: server.ws, reconnectBaseMs: 100, reconnectMaxMs: 800 };
  const a = mk({ ...opts, user: alice, WebSocket: rec.WebSocket });
  const b = mk({ ...opts, user: bob });
  await waitOpen(a);
  await waitOpen(b);
  await waitPresence(a, bob, 'online');
  return { a, b, team, alice, bob, rec };
}

test('reconnects after the server crashes and comes back', async (t) => {
  let server = await startServer();
  t.after(() => server.stop('SIGKILL'));
  const { a, b, team, alice, bob } = await pair(t, server);
  const firstConn = a.connectionId;
  const statesBefore = a.states.length;

  await server.stop('SIGKILL');
  await waitFor(() => a.state === 'reconnecting' && b.state === 'reconnecting', { message: 'both clients reconnecting' });
  // Let a few attempts fail against the closed port: the client must keep trying.
  await waitFor(() => a.states.filter((s) => s.state === 'reconnecting').length >= 3, { timeout: 5000, message: '3 failed attempts' });
  assert.equal(a.get(bob).state, 'online', 'the map is kept while disconnected (no flicker)');

  server = await startServer({ port: server.port });
  await waitFor(() => a.state === 'open' && b.state === 'open', { timeout: 5000, message: 'both reopened' });
  assert.notEqual(a.connectionId, firstConn);
  assert.equal(a.userId, alice);
  const seq = a.states.slice(statesBefore).map((s) => s.state);
  assert.equal(seq[0], 'reconnecting');
  assert.equal(seq.at(-1), 'open');

  // The new server knows no team yet: its empty snapshot replaces alice's map.
  await waitFor(() => a.get(bob) === undefined, { message: 'the empty snapshot to drop bob' });
  assert.ok(a.changes.some((c) => c.userId === bob && c.state === 'offline'));
  await addMember(server, team, alice);
  await addMember(server, team, bob);
  await waitPresence(a, bob, 'online', 5000);
  b.setStatus('away');
  await waitPresence(a, bob, 'away'); // versions restarted from 1 and are accepted
});

test('drains on SIGTERM: reconnect advice, 1012, back after after_ms', async (t) => {
  let server = await startServer();
  t.after(() => server.stop('SIGKILL'));
  const { a, b, team, alice, bob, rec } = await pair(t, server);
  const firstConn = a.connectionId;
  const stopped = server.stop('SIGTERM');

  await waitFor(() => a.states.some((s) => s.state === 'reconnecting'), { timeout: 15000, message: 'alice dropped by the drain' });
  const advice = rec.received.find((r) => r.frame.type === 'reconnect');
  assert.ok(advice, `a reconnect frame came before the close; got ${JSON.stringify(rec.received.map((r) => r.frame.type))}`);
  assert.equal(typeof advice.frame.after_ms, 'number');
  const drop = a.states.find((s) => s.state === 'reconnecting');
  assert.equal(drop.info.code, 1012, `close code ${drop.info.code}`);
  const waited = drop.at + drop.info.delayMs - advice.at;
  assert.ok(waited >= advice.frame.after_ms - 20, `next attempt ${waited} ms after the advice, not before after_ms ${advice.frame.after_ms}`);
  assert.ok(drop.info.delayMs <= advice.frame.after_ms + 1000, `delay ${drop.info.delayMs} past after_ms + jitter`);

  const exit = await stopped;
  assert.notEqual(exit.signal, 'SIGKILL', 'the drain ended by itself within 15 s');
  server = await startServer({ port: server.port });
  await addMember(server, team, alice);
  await addMember(server, team, bob);
  await waitFor(() => a.state === 'open' && a.connectionId !== firstConn, { timeout: 15000, message: 'alice back' });
  await waitFor(() => b.state === 'open', { timeout: 15000, message: 'bob back' });
  await waitPresence(a, bob, 'online', 5000);
});
