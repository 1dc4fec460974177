// A step of the wall clock (NTP, a suspended laptop, a user fixing the time)
// must not change how the client judges its connection: Date.now() is
// stepped here, an hour at a time, against a scripted server.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { WebSocket, WebSocketServer } from 'ws';
import { clients, waitFor, waitOpen } from './helpers.js';

const HOUR = 3600 * 1000;

/** Steps Date.now by ms from now on, until the test ends. */
function stepClock(t, ms) {
  const before = Date.now;
  Date.now = () => before() + ms;
  t.after(() => { Date.now = before; });
}

/**
 * A scripted server: welcome (interval 100 ms, ttl 600 ms) and an empty
 * snapshot, then onFrame(frame, ws) for every client frame.
 */
async function scriptedServer(t, onFrame) {
  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 });
  await new Promise((r) => wss.once('listening', r));
  t.after(() => new Promise((r) => { for (const c of wss.clients) c.terminate(); wss.close(r); }));
  let n = 0;
  let latest = null;
  wss.on('connection', (ws) => {
    n++;
    latest = ws;
    ws.send(JSON.stringify({ type: 'welcome', connection_id: `c${n}`, user_id: 'u', heartbeat_interval_ms: 100, ttl_ms: 600 }));
    ws.send(JSON.stringify({ type: 'snapshot', users: [] }));
    ws.on('message', (data) => onFrame(JSON.parse(String(data)), ws));
  });
  return { url: `ws://127.0.0.1:${wss.address().port}/v1/connect`, connections: () => n, latest: () => latest };
}

const isProbe = (f) => f.type === 'heartbeat' && f.id !== undefined;

test('a clock stepped forward while a probe is out does not drop the connection', async (t) => {
  const mk = clients(t);
  let stepped = false;
  const srv = await scriptedServer(t, (f, ws) => {
    if (!isProbe(f)) return;
    if (!stepped) {
      stepped = true;
      stepClock(t, HOUR);
    }
    // Answered, but after the next heartbeat: the probe is out when the clock has moved.
    setTimeout(() => ws.send(JSON.stringify({ type: 'heartbeat_ack', id: f.id })), 150);
  });
  const c = mk({ url: srv.url, user: 'u', WebSocket });
  await waitOpen(c);
  await waitFor(() => stepped, { message: 'a probe (ack request)' });
  // Two ttls, plus the interval, of a server answering every probe.
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(srv.connections(), 1, 'one connection throughout');
  assert.ok(!c.states.some((s) => s.state === 'reconnecting'), JSON.stringify(c.states.map((s) => [s.state, s.info.reason])));
});

test('a clock stepped back does not keep a silent server', async (t) => {
  const mk = clients(t);
  let stepped = false;
  const srv = await scriptedServer(t, (f) => {
    if (isProbe(f) && !stepped) {
      stepped = true;
      stepClock(t, -HOUR); // and never answer
    }
  });
  const c = mk({ url: srv.url, user: 'u', WebSocket, reconnectBaseMs: 50, reconnectMaxMs: 100 });
  await waitOpen(c);
  // ttl 600 + interval 100 after the first unanswered probe.
  await waitFor(() => c.states.some((s) => s.state === 'reconnecting'), { timeout: 4000, message: 'the client to leave the silent server' });
  assert.ok(stepped);
  assert.equal(c.states.find((s) => s.state === 'reconnecting').info.reason, 'server silent');
});

test('reconnect advice is kept across a clock step', async (t) => {
  const mk = clients(t);
  const srv = await scriptedServer(t, () => {});
  const c = mk({ url: srv.url, user: 'u', WebSocket });
  await waitOpen(c);
  // The drain of a node: advice, a clock step, then 1012.
  const ws = srv.latest();
  ws.send(JSON.stringify({ type: 'reconnect', after_ms: 200 }));
  await new Promise((r) => setTimeout(r, 50));
  stepClock(t, -HOUR);
  ws.close(1012, 'service restart');
  await waitFor(() => c.states.some((s) => s.state === 'reconnecting'), { message: 'the 1012' });
  const { delayMs } = c.states.find((s) => s.state === 'reconnecting').info;
  assert.ok(delayMs <= 200 + 100, `next attempt in ${delayMs} ms, want what is left of the advised 200 ms (+ up to 100 ms jitter)`);
  await waitFor(() => srv.connections() === 2 && c.state === 'open', { timeout: 3000, message: 'back after the advised delay' });
});
