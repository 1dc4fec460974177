// The JS client against a real `greendot serve` in dev mode (?user=).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer, addMember, clients, freePort, waitFor, waitOpen, waitPresence, recordingWebSocket, uniq,
} from './helpers.js';
import { WebSocket } from 'ws';
import { startProxy } from './proxy.js';
import { GreendotClient } from '../greendot.js';

let server;
before(async () => { server = await startServer(); });
after(async () => { await server?.stop(); });

test('importing in Node touches no browser global, and a missing WebSocket is explained', () => {
  assert.equal(typeof globalThis.window, 'undefined');
  assert.equal(typeof globalThis.document, 'undefined');
  const saved = globalThis.WebSocket;
  try {
    globalThis.WebSocket = undefined;
    assert.throws(() => new GreendotClient({ url: 'ws://127.0.0.1:1' }), /pass one as the WebSocket option/);
  } finally {
    globalThis.WebSocket = saved;
  }
  assert.throws(() => new GreendotClient({ WebSocket: class {} }), /url is required outside a browser/);
});

test('snapshot, live changes, away, offline after the grace, and query', async (t) => {
  const mk = clients(t);
  const team = uniq('team');
  const [alice, bob, carol] = [uniq('alice'), uniq('bob'), uniq('carol')];
  for (const u of [alice, bob, carol]) await addMember(server, team, u);

  const c = mk({ url: server.ws, user: carol });
  await waitOpen(c);
  const a = mk({ url: server.http, user: alice }); // an http URL works as well
  await waitOpen(a);
  assert.equal(a.userId, alice);
  assert.equal(a.heartbeatIntervalMs, 500, 'heartbeat interval comes from welcome');
  assert.equal(a.ttlMs, 2000);
  assert.deepEqual(a.states.map((s) => s.state), ['connecting', 'open']);
  await waitPresence(a, carol, 'online'); // from the snapshot
  assert.equal(a.get(alice), undefined, 'a viewer is never sent their own presence');

  const b = mk({ url: server.ws, user: bob, device: 'desktop' });
  await waitPresence(a, bob, 'online');
  const v1 = a.get(bob).version;
  const seen = [];
  const off = a.onChange((changes) => seen.push(...changes));

  b.setStatus('away');
  assert.equal(b.status, 'away');
  await waitPresence(a, bob, 'away');
  assert.ok(a.get(bob).version > v1, 'versions increase');
  assert.ok(seen.some((ch) => ch.userId === bob && ch.state === 'away' && ch.previous === 'online'));
  off();

  const [qb, qstranger] = await a.query([bob, uniq('stranger')]);
  assert.equal(qb.userId, bob);
  assert.equal(qb.state, 'away');
  assert.equal(qb.connectionCount, 1);
  assert.deepEqual(qb.devices, ['desktop']);
  assert.equal(qstranger.state, 'unknown', 'a user sharing no team is unknown');

  b.setStatus('online');
  await waitPresence(a, bob, 'online');

  const closedAt = Date.now();
  b.close();
  assert.equal(b.state, 'closed');
  await waitPresence(a, bob, 'offline', 4000);
  const tookMs = Date.now() - closedAt;
  assert.ok(tookMs >= 250, `offline only after the 300 ms grace (took ${tookMs} ms)`);
  assert.equal(a.all().find((p) => p.userId === bob).state, 'offline');
  const [after] = await a.query([bob]);
  assert.equal(after.state, 'offline');
  assert.equal(typeof after.lastSeen, 'number');
  assert.ok(after.lastSeen <= Date.now() && after.lastSeen > closedAt - 2000, `last_seen ${after.lastSeen} near the close`);
});

test('heartbeats: interval from welcome, every gap jittered within [0.7, 1.0]×interval, keeps the connection alive', async (t) => {
  const mk = clients(t);
  const team = uniq('team');
  const [alice, bob] = [uniq('alice'), uniq('bob')];
  await addMember(server, team, alice);
  await addMember(server, team, bob);
  const a = mk({ url: server.ws, user: alice });
  const rec = recordingWebSocket();
  const b = mk({ url: server.ws, user: bob, WebSocket: rec.WebSocket });
  await waitOpen(b);
  await waitPresence(a, bob, 'online');

  // 10 heartbeats at 350–500 ms take 3.5–5 s: well past the 2 s ttl.
  const beats = () => rec.sent.filter((s) => s.frame.type === 'heartbeat');
  await waitFor(() => beats().length >= 10, { timeout: 8000, message: '10 heartbeats' });
  const times = beats().map((s) => s.at);
  const gaps = times.slice(1).map((x, i) => x - times[i]);
  const interval = b.heartbeatIntervalMs;
  for (const g of gaps) {
    assert.ok(g >= 0.7 * interval - 5, `gap ${g} ms under 0.7×${interval}: ${gaps}`);
    // Timers never fire early; a loaded machine can fire them late, hence the slack above.
    assert.ok(g <= interval + 250, `gap ${g} ms over the interval ${interval}: ${gaps}`);
  }
  const spread = Math.max(...gaps) - Math.min(...gaps);
  assert.ok(spread >= 15, `gaps are not a fixed period: ${gaps}`);
  assert.ok(new Set(gaps).size > 1);

  // Only heartbeats after half a ttl (1 s) of quiet ask for an ack: with
  // nothing else arriving that is every second or third. The server acked
  // every id it got, and bob never went offline for alice.
  const ids = beats().filter((s) => s.frame.id !== undefined).map((s) => s.frame.id);
  const plain = beats().length - ids.length;
  assert.ok(ids.length >= 2 && plain >= beats().length / 3, `probes ${ids.length}, plain ${plain}`);
  await waitFor(() => rec.received.filter((r) => r.frame.type === 'heartbeat_ack').length >= ids.length - 1,
    { message: 'heartbeat_acks' });
  const acked = rec.received.filter((r) => r.frame.type === 'heartbeat_ack').map((r) => r.frame.id);
  assert.deepEqual(acked, ids.slice(0, acked.length));
  assert.equal(a.get(bob).state, 'online');
  assert.ok(!a.changes.some((ch) => ch.userId === bob && ch.state === 'offline'), 'no offline while heartbeating');
  assert.equal(b.states.length, 2, `one connection, no reconnect: ${JSON.stringify(b.states.map((s) => s.state))}`);
});

test('version ordering: a change not newer than the one held is dropped', async (t) => {
  const mk = clients(t);
  const proxy = await startProxy(server.ws);
  t.after(() => proxy.close());
  const team = uniq('team');
  const [alice, bob] = [uniq('alice'), uniq('bob')];
  await addMember(server, team, alice);
  await addMember(server, team, bob);
  const a = mk({ url: proxy.url, user: alice });
  await waitOpen(a);
  const b = mk({ url: server.ws, user: bob });
  await waitPresence(a, bob, 'online');
  b.setStatus('away');
  await waitPresence(a, bob, 'away');
  const held = a.get(bob);
  const changesBefore = a.changes.length;

  // Replay older and equal versions, then a marker the client must process after them.
  const marker = uniq('marker');
  const conn = proxy.last;
  conn.inject({ type: 'presence', changes: [{ user_id: bob, state: 'online', version: held.version - 1, at: Date.now() }] });
  conn.inject({ type: 'presence', changes: [
    { user_id: bob, state: 'offline', version: held.version, at: Date.now() },
    { user_id: marker, state: 'online', version: 1, at: Date.now() },
  ] });
  await waitPresence(a, marker, 'online');
  assert.deepEqual(a.get(bob), held, 'older and equal versions left the held presence alone');
  assert.deepEqual(a.changes.slice(changesBefore).map((c) => c.userId), [marker], 'no change reported for bob');

  // A real, newer change still applies.
  b.setStatus('online');
  await waitPresence(a, bob, 'online');
  assert.ok(a.get(bob).version > held.version);
});

test('a snapshot replaces the map: users it leaves out become offline, restarted versions are accepted', async (t) => {
  const mk = clients(t);
  const proxy = await startProxy(server.ws);
  t.after(() => proxy.close());
  const team = uniq('team');
  const [alice, bob] = [uniq('alice'), uniq('bob')];
  await addMember(server, team, alice);
  await addMember(server, team, bob);
  const a = mk({ url: proxy.url, user: alice });
  await waitOpen(a);
  const ghost = uniq('ghost');
  proxy.last.inject({ type: 'presence', changes: [{ user_id: ghost, state: 'online', version: 50, at: Date.now() }] });
  await waitPresence(a, ghost, 'online');
  proxy.last.inject({ type: 'snapshot', users: [{ user_id: bob, state: 'away', version: 3 }] });
  await waitPresence(a, bob, 'away');
  assert.equal(a.get(ghost), undefined, 'left out of the snapshot');
  assert.ok(a.changes.some((c) => c.userId === ghost && c.state === 'offline' && c.previous === 'online'));
  proxy.last.inject({ type: 'presence', changes: [{ user_id: ghost, state: 'online', version: 1, at: Date.now() }] });
  await waitPresence(a, ghost, 'online');
});

test('reconnect frame then 1012: comes back after after_ms plus a small jitter', async (t) => {
  const mk = clients(t);
  const proxy = await startProxy(server.ws);
  t.after(() => proxy.close());
  const alice = uniq('alice');
  const a = mk({ url: proxy.url, user: alice });
  await waitOpen(a);
  const first = a.connectionId;
  const sentAt = Date.now();
  proxy.last.inject({ type: 'reconnect', after_ms: 700 });
  proxy.last.close(1012, 'draining');
  await waitFor(() => a.states.some((s) => s.state === 'reconnecting'), { message: 'reconnecting' });
  const rec = a.states.find((s) => s.state === 'reconnecting');
  assert.equal(rec.info.code, 1012);
  assert.ok(rec.info.delayMs >= 600 && rec.info.delayMs <= 700 + 1000, `delay ${rec.info.delayMs}`);
  await waitFor(() => a.state === 'open' && a.connectionId !== first, { timeout: 5000, message: 'reopened' });
  const took = a.states.at(-1).at - sentAt;
  assert.ok(took >= 690, `reconnected after ${took} ms, before after_ms`);
  assert.equal(proxy.conns.length, 2);
});

test('1008 backs off (at least 4×base), other drops back off with full jitter', async (t) => {
  const mk = clients(t);
  const proxy = await startProxy(server.ws);
  t.after(() => proxy.close());
  const a = mk({ url: proxy.url, user: uniq('alice'), reconnectBaseMs: 100, reconnectMaxMs: 2000 });
  await waitOpen(a);
  proxy.last.close(1008, 'flood');
  await waitFor(() => a.states.some((s) => s.state === 'reconnecting'), { message: 'reconnecting' });
  const r = a.states.find((s) => s.state === 'reconnecting');
  assert.equal(r.info.code, 1008);
  assert.ok(r.info.delayMs >= 400 && r.info.delayMs <= 2000, `1008 delay ${r.info.delayMs}`);
  await waitFor(() => a.state === 'open', { timeout: 4000, message: 'reopened after 1008' });
  assert.equal(proxy.conns.length, 2);
});

test('backoff grows while the server is unreachable, capped and jittered', async (t) => {
  const mk = clients(t);
  const port = await freePort(); // nobody listens here
  const a = mk({ url: `ws://127.0.0.1:${port}`, user: 'nobody', reconnectBaseMs: 20, reconnectMaxMs: 160 });
  await waitFor(() => a.states.filter((s) => s.state === 'reconnecting').length >= 8, { timeout: 8000, message: '8 attempts' });
  const tries = a.states.filter((s) => s.state === 'reconnecting').map((s) => s.info);
  tries.forEach((info, i) => {
    const cap = Math.min(160, 20 * 2 ** i);
    assert.equal(info.attempt, i + 1);
    assert.ok(info.delayMs >= 0 && info.delayMs <= cap, `attempt ${i}: ${info.delayMs} > cap ${cap}`);
  });
  const delays = tries.map((i) => i.delayMs);
  assert.ok(new Set(delays).size > 1, `delays are jittered: ${delays}`);
});

test('idle detection: no input for idleAfterMs or a hidden page is away, activity is online', async (t) => {
  const mk = clients(t);
  const team = uniq('team');
  const [alice, bob] = [uniq('alice'), uniq('bob')];
  await addMember(server, team, alice);
  await addMember(server, team, bob);
  const a = mk({ url: server.ws, user: alice });
  const win = new EventTarget();
  const doc = new EventTarget();
  doc.hidden = false;
  const b = mk({ url: server.ws, user: bob, idle: { window: win, document: doc }, idleAfterMs: 400 });
  await waitPresence(a, bob, 'online');
  await waitPresence(a, bob, 'away'); // nobody touched bob's window for 400 ms
  assert.equal(b.status, 'away');
  win.dispatchEvent(new Event('keydown'));
  await waitPresence(a, bob, 'online');
  doc.hidden = true;
  doc.dispatchEvent(new Event('visibilitychange'));
  await waitPresence(a, bob, 'away');
  doc.hidden = false;
  doc.dispatchEvent(new Event('visibilitychange'));
  await waitPresence(a, bob, 'online');
  // A device set away by hand stays away through activity.
  b.setStatus('away');
  win.dispatchEvent(new Event('mousedown'));
  await waitPresence(a, bob, 'away');
  win.dispatchEvent(new Event('mousemove'));
  assert.equal(b.status, 'away');
});

test('query waits for the connection and rejects after close()', async (t) => {
  const mk = clients(t);
  const team = uniq('team');
  const [alice, bob] = [uniq('alice'), uniq('bob')];
  await addMember(server, team, alice);
  await addMember(server, team, bob);
  const a = mk({ url: server.ws, user: alice });
  const early = a.query([bob]); // sent once the welcome arrives
  const [r] = await early;
  assert.deepEqual(r.userId, bob);
  assert.equal(r.state, 'offline');
  await assert.rejects(a.query(new Array(501).fill('x')), /at most 500/);
  const late = new GreendotClient({ url: server.ws, user: uniq('x'), WebSocket }).connect();
  const pending = late.query([bob]);
  late.close();
  await assert.rejects(pending, /closed/);
});

test('a server that answers no ack request is left; one that answers is kept', async (t) => {
  const { WebSocketServer } = await import('ws');
  const mk = clients(t);
  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 });
  await new Promise((r) => wss.once('listening', r));
  t.after(() => new Promise((r) => wss.close(r)));
  let connections = 0;
  let answeredConnections = 0; // the silent client's last reconnect may land after its close()
  const asked = [];
  wss.on('connection', (ws, req) => {
    connections++;
    const answers = new URL(req.url, 'http://x').searchParams.get('user') === 'answered';
    if (answers) answeredConnections++;
    ws.send(JSON.stringify({ type: 'welcome', connection_id: `c${connections}`, user_id: 'u', heartbeat_interval_ms: 100, ttl_ms: 600 }));
    ws.send(JSON.stringify({ type: 'snapshot', users: [] }));
    ws.on('message', (data) => {
      const f = JSON.parse(String(data));
      if (f.type === 'heartbeat' && f.id !== undefined) {
        asked.push(f.id);
        if (answers) ws.send(JSON.stringify({ type: 'heartbeat_ack', id: f.id }));
      }
    });
  });
  const url = `ws://127.0.0.1:${wss.address().port}/v1/connect`;

  // Silent: probes after 300 ms of quiet, dropped 700 ms after the first unanswered one.
  const silent = mk({ url, user: 'silent', WebSocket, reconnectBaseMs: 50, reconnectMaxMs: 100 });
  await waitFor(() => silent.states.some((s) => s.state === 'reconnecting'), { timeout: 4000, message: 'left the silent server' });
  assert.ok(asked.length >= 1, 'it asked for an ack before leaving');
  silent.close();

  const answered = mk({ url, user: 'answered', WebSocket });
  await waitOpen(answered);
  await new Promise((r) => setTimeout(r, 2000)); // over two ttls
  assert.equal(answeredConnections, 1, 'an answering server was kept');
  assert.ok(!answered.states.some((s) => s.state === 'reconnecting'), JSON.stringify(answered.states));
});
