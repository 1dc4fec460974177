// The user's status (v2) through the JS client against a real server:
// setStatus({mode, text, emoji, expiresAt}), myStatus on every device, the
// fields on each user, the expiry, and refusals.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, addMember, clients, waitFor, waitOpen, waitPresence, uniq } from './helpers.js';

let server;
before(async () => { server = await startServer(); });
after(async () => { await server?.stop(); });

test('dnd with a text and an expiry reaches viewers and every own device, then ends', async (t) => {
  const mk = clients(t);
  const team = uniq('team');
  const [alice, bob] = [uniq('alice'), uniq('bob')];
  for (const u of [alice, bob]) await addMember(server, team, u);
  const a = mk({ url: server.ws, user: alice });
  const web = mk({ url: server.ws, user: bob });
  const phone = mk({ url: server.ws, user: bob, device: 'ios' });
  await waitOpen(web);
  await waitOpen(phone);
  await waitPresence(a, bob, 'online');
  assert.equal(web.myStatus, null, 'no my_status for the default status');
  const heard = [];
  phone.onMyStatus((s) => heard.push(s));

  const until = Date.now() + 1500;
  web.setStatus({ mode: 'dnd', text: 'In a meeting', emoji: '📅', expiresAt: new Date(until) });
  await waitPresence(a, bob, 'dnd');
  const p = a.get(bob);
  assert.equal(p.text, 'In a meeting');
  assert.equal(p.emoji, '📅');
  assert.equal(p.expiresAt, until);
  assert.ok(p.since > 0, 'since is set');
  for (const c of [web, phone]) {
    await waitFor(() => c.myStatus?.mode === 'dnd', { message: 'my_status dnd' });
    assert.equal(c.myStatus.text, 'In a meeting');
    assert.equal(c.myStatus.version, p.version);
  }
  // A new device learns it right after welcome.
  const desk = mk({ url: server.ws, user: bob, device: 'desktop' });
  await waitOpen(desk);
  assert.equal(desk.myStatus?.mode, 'dnd');

  // The expiry: back to online, no text, told to the devices.
  await waitPresence(a, bob, 'online');
  assert.equal(a.get(bob).text, null);
  await waitFor(() => heard.length === 2, { message: 'phone hears dnd, then auto' });
  assert.deepEqual(heard.map((s) => s.mode), ['dnd', 'auto']);
  assert.equal(heard[1].text, '');
});

test('invisible: offline to others, while still seeing them', async (t) => {
  const mk = clients(t);
  const team = uniq('team');
  const [alice, bob, carol] = [uniq('alice'), uniq('bob'), uniq('carol')];
  for (const u of [alice, bob, carol]) await addMember(server, team, u);
  const a = mk({ url: server.ws, user: alice });
  const b = mk({ url: server.ws, user: bob });
  await waitPresence(a, bob, 'online');
  b.setStatus({ mode: 'invisible' });
  await waitPresence(a, bob, 'offline');
  assert.ok(a.get(bob).lastSeen > 0, 'last seen when going invisible');
  const [q] = await a.query([bob]);
  assert.equal(q.state, 'offline');
  assert.equal(q.connectionCount, 0);
  mk({ url: server.ws, user: carol });
  await waitPresence(b, carol, 'online');
  b.setStatus({ mode: 'auto' });
  await waitPresence(a, bob, 'online');
});

test('bad statuses are refused before sending, and by the server', async (t) => {
  const mk = clients(t);
  const bob = uniq('bob');
  const b = mk({ url: server.ws, user: bob });
  await waitOpen(b);
  assert.throws(() => b.setStatus({ mode: 'busy' }), /mode must be/);
  assert.throws(() => b.setStatus({ mode: 'dnd', text: 'x'.repeat(101) }), /at most 100/);
  assert.throws(() => b.setStatus({ mode: 'dnd', emoji: '😀'.repeat(9) }), /at most 32 bytes/);
  assert.throws(() => b.setStatus({ mode: 'dnd', expiresAt: Date.now() - 1000 }), /future/);
  b.setStatus({ mode: 'dnd', text: 'evil\u202etxt' }); // only the server knows every rule
  await waitFor(() => b.errors.some((e) => e.code === 'bad_request'), { message: 'a bad_request error' });
  assert.equal(b.myStatus, null, 'nothing changed');
});
