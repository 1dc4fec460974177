// The JS client against a real `greendot serve --jwt-secret …`: HS256 tokens,
// a token function called before every (re)connect, and 4001 on expiry.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { WebSocket } from 'ws';
import {
  startServer, addMember, clients, signToken, waitFor, waitOpen, waitPresence, uniq,
} from './helpers.js';
import { startProxy } from './proxy.js';

const SECRET = 'js-client-test-secret-0123456789';
let server;
// A 1 s grace (not 300 ms) so that the no-flicker check below does not race the machine's load.
const FLAGS = ['--ttl', '2s', '--heartbeat-interval', '500ms', '--offline-grace', '1s', '--jwt-secret', SECRET];
before(async () => { server = await startServer({ flags: FLAGS }); });
after(async () => { await server?.stop(); });

const nowSec = () => Math.floor(Date.now() / 1000);

/** Resolves with the HTTP status the server answers an upgrade to url with. */
function handshakeStatus(url) {
  return new Promise((resolve) => {
    const ws = new WebSocket(url);
    ws.on('unexpected-response', (_req, res) => { resolve(res.statusCode); ws.terminate(); });
    ws.on('open', () => { resolve(101); ws.close(); });
    ws.on('error', () => {});
  });
}

test('the token is the identity; ?user= and bad tokens are refused with 401', async (t) => {
  const mk = clients(t);
  const alice = uniq('alice');
  const a = mk({ url: server.ws, token: signToken(SECRET, { sub: alice, exp: nowSec() + 600 }), user: 'mallory' });
  await waitOpen(a);
  assert.equal(a.userId, alice, 'sub wins over user');
  assert.equal(await handshakeStatus(`${server.ws}/v1/connect?user=${alice}`), 401);
  assert.equal(await handshakeStatus(`${server.ws}/v1/connect?token=${signToken('wrong', { sub: alice })}`), 401);
  assert.equal(await handshakeStatus(`${server.ws}/v1/connect?token=${signToken(SECRET, { sub: alice, exp: nowSec() - 10 })}`), 401);
});

test('the token function runs again on every reconnect', async (t) => {
  const mk = clients(t);
  const proxy = await startProxy(server.ws);
  t.after(() => proxy.close());
  const alice = uniq('alice');
  let calls = 0;
  const token = async () => {
    calls++;
    await new Promise((r) => setTimeout(r, 5)); // a real one would fetch
    return signToken(SECRET, { sub: alice, exp: nowSec() + 600, n: calls });
  };
  const a = mk({ url: proxy.url, token, reconnectBaseMs: 50, reconnectMaxMs: 200 });
  await waitOpen(a);
  assert.equal(calls, 1);
  const first = a.connectionId;
  proxy.last.close(1001, 'going away');
  await waitFor(() => a.state === 'open' && a.connectionId !== first, { message: 'reconnected' });
  assert.equal(calls, 2);
  assert.match(proxy.last.url, /token=/);
  assert.notEqual(new URL(proxy.conns[0].url, 'ws://x').searchParams.get('token'),
    new URL(proxy.last.url, 'ws://x').searchParams.get('token'), 'a fresh token each time');
});

test('4001 on token expiry: a fresh token is fetched and the client reconnects at once', async (t) => {
  const mk = clients(t);
  const team = uniq('team');
  const [alice, bob] = [uniq('alice'), uniq('bob')];
  await addMember(server, team, alice);
  await addMember(server, team, bob);
  const b = mk({ url: server.ws, token: signToken(SECRET, { sub: bob, exp: nowSec() + 600 }) });
  await waitOpen(b);
  let calls = 0;
  const token = () => {
    calls++;
    // The first token runs out in 1–2 s; the next ones last.
    return signToken(SECRET, { sub: alice, exp: nowSec() + (calls === 1 ? 2 : 600) });
  };
  const a = mk({ url: server.ws, token, reconnectBaseMs: 5000, reconnectMaxMs: 30000 });
  await waitOpen(a);
  await waitPresence(b, alice, 'online');
  const first = a.connectionId;
  await waitFor(() => a.states.some((s) => s.state === 'reconnecting'), { timeout: 6000, message: 'the server to end the expired connection' });
  const drop = a.states.find((s) => s.state === 'reconnecting');
  assert.equal(drop.info.code, 4001, `closed with ${drop.info.code} ${drop.info.reason ?? ''}`);
  assert.ok(drop.info.delayMs <= 250, `4001 is not a failure to back off from (delay ${drop.info.delayMs})`);
  await waitFor(() => a.state === 'open' && a.connectionId !== first, { timeout: 3000, message: 'reconnected with a fresh token' });
  assert.equal(calls, 2);
  assert.equal(a.userId, alice);
  // Reconnecting at once, within the grace, must not flip alice's dot for bob.
  await waitFor(() => b.get(alice)?.state === 'online', { message: 'alice online for bob' });
  assert.ok(!b.changes.some((c) => c.userId === alice && c.state === 'offline'), 'no offline published across the refresh');
});

test('a token function that throws is retried with backoff and reported', async (t) => {
  const mk = clients(t);
  const alice = uniq('alice');
  let calls = 0;
  const token = async () => {
    calls++;
    if (calls < 3) throw new Error('auth service down');
    return signToken(SECRET, { sub: alice, exp: nowSec() + 600 });
  };
  const a = mk({ url: server.ws, token, reconnectBaseMs: 20, reconnectMaxMs: 100 });
  await waitOpen(a);
  assert.equal(calls, 3);
  assert.equal(a.errors.filter((e) => e.code === 'token').length, 2);
  assert.match(a.errors[0].message, /auth service down/);
  assert.equal(a.userId, alice);
});
