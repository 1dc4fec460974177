// Watching users of large teams (v2) through the JS client against a real
// server: watch() and its answer, the changes of watched users only,
// unwatch(), teamCounts, and the watches sent again after a reconnect.

import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, addMember, clients, waitFor, waitOpen, waitPresence } from './helpers.js';

const LARGE = ['--large-team', '2'];
let server;
after(async () => { await server?.stop(); });

test('watch, unwatch and team counts in a large team, across a server restart', async (t) => {
  server = await startServer({ extra: LARGE });
  const team = 'big';
  const join = async () => { for (const u of ['v', 'a', 'b', 'c']) await addMember(server, team, u); };
  await join();
  const mk = clients(t);
  // Reconnects come 2.97 s after a drop: the restarted server has its team back by then.
  const slow = { reconnectBaseMs: 3000, random: () => 0.99 };
  const a = mk({ url: server.ws, user: 'a', ...slow });
  const b = mk({ url: server.ws, user: 'b', ...slow });
  await waitOpen(a);
  await waitOpen(b);
  const v = mk({ url: server.ws, user: 'v', ...slow });
  const counted = [];
  v.onTeamCounts((teams) => counted.push(...teams));
  await waitOpen(v);
  assert.deepEqual(v.all(), [], 'a large team is not in the snapshot');

  const users = await v.watch(['a', 'zz']);
  assert.deepEqual(users.map((u) => `${u.userId}=${u.state}`), ['a=online', 'zz=unknown']);
  assert.equal(v.get('a')?.state, 'online');
  await waitFor(() => JSON.stringify(v.teamCounts) === JSON.stringify([{ teamId: 'big', memberCount: 4, onlineCount: 3 }]),
    { message: () => `team counts ${JSON.stringify(v.teamCounts)}` });
  assert.ok(counted.length >= 1, 'onTeamCounts was called');
  a.setStatus('away');
  await waitPresence(v, 'a', 'away');

  // Unwatched (a query answered after it: the server has it), a's change
  // does not come; b's, watched after it, does.
  v.unwatch(['a']);
  await v.query(['a']);
  a.setStatus('online');
  await a.query(['a']);
  await v.watch(['b']);
  b.setStatus('away');
  await waitPresence(v, 'b', 'away');
  assert.equal(v.get('a')?.state, 'away', 'a is not watched any more');
  assert.deepEqual(v.watched, ['b', 'zz']);

  // Refusals, before anything is sent.
  await assert.rejects(v.watch(Array.from({ length: 501 }, (_, i) => `u${i}`)), RangeError);
  await assert.rejects(v.watch('b'), TypeError);

  // A new server on the same port (memory store: the team added again):
  // v's watch of b is sent again.
  const port = server.port;
  await server.stop('SIGKILL');
  server = await startServer({ port, extra: LARGE });
  await join();
  await waitOpen(v, 10000);
  await waitOpen(b, 10000);
  b.setStatus('online');
  await waitPresence(v, 'b', 'online', 10000);
});
