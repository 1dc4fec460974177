// Test helpers for the Pusher compatibility tests: greendot started with a
// Pusher app, its own Redis for many nodes, pusher-js clients whose channel
// auth is signed in-process by the `pusher` SDK (the test is the app's
// backend), raw Pusher-protocol sockets for exact frames, and native greendot
// clients. The server and polling helpers are clients/js's.

import { spawn, execFileSync } from 'node:child_process';
import net from 'node:net';
import assert from 'node:assert/strict';
import Pusher from 'pusher-js';
import PusherSDK from 'pusher';
import { WebSocket } from 'ws';
import { GreendotClient } from '../../../clients/js/greendot.js';
import { freePort, waitFor, startServer, addMember, getJSON, uniq } from '../../../clients/js/test/helpers.js';

export { freePort, waitFor, addMember, getJSON, uniq, Pusher, PusherSDK, WebSocket };

/** The Pusher app greendot serves in these tests. */
export const APP = Object.freeze({ id: '4242', key: 'e2e-key', secret: 'e2e-secret' });

// Fast timings: a socket gone without a word is offline within ttl + grace.
export const HEARTBEAT_S = 1;
export const TTL_MS = 3000;
export const GRACE_MS = 1000;
const TIMING_FLAGS = ['--ttl', '3s', '--heartbeat-interval', '1s', '--offline-grace', '1s'];

/**
 * Starts `greendot serve` with the Pusher app (client events when asked, on
 * Redis as nodeId when redis is given) and stops it after the test.
 */
export async function startGreendot(t, { clientEvents = false, redis, nodeId, extra = [] } = {}) {
  const flags = [...TIMING_FLAGS, '--pusher-app-id', APP.id, '--pusher-key', APP.key, '--pusher-secret', APP.secret];
  if (clientEvents) flags.push('--pusher-client-events');
  if (redis) flags.push('--store', 'redis', '--redis-url', redis.url, '--node-id', nodeId ?? 'n1');
  const server = await startServer({ flags, extra });
  t.after(() => server.stop('SIGTERM', 5000));
  return server;
}

/**
 * Starts a redis-server of its own on a free port (never 6379), without
 * persistence, and kills it after the test.
 */
export async function startRedis(t) {
  try {
    execFileSync('redis-server', ['--version'], { stdio: 'ignore' });
  } catch {
    throw new Error('redis-server not found: the tests of many nodes need it, apt-get install -y redis-server');
  }
  const port = await freePort();
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout.on('data', (b) => { log = (log + b).slice(-4000); });
  child.stderr.on('data', (b) => { log = (log + b).slice(-4000); });
  const exited = new Promise((resolve) => child.on('exit', resolve));
  process.on('exit', () => child.kill('SIGKILL'));
  t.after(async () => { child.kill('SIGKILL'); await exited; });
  await waitFor(() => redisPing(port), { timeout: 10000, interval: 50, message: () => `redis-server on ${port} to answer PING\n${log}` });
  return { port, url: `redis://127.0.0.1:${port}` };
}

function redisPing(port) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let got = '';
    sock.on('connect', () => sock.write('PING\r\n'));
    sock.on('data', (b) => { got += b; if (got.includes('\r\n')) { sock.destroy(); resolve(got.startsWith('+PONG')); } });
    sock.on('error', () => resolve(false));
  });
}

/** The `pusher` SDK aimed at server, as an app's backend holds it. */
export function backend(server, { secret = APP.secret } = {}) {
  return new PusherSDK({ appId: APP.id, key: APP.key, secret, host: '127.0.0.1', port: String(server.port), useTLS: false });
}

/** pusher-js options for a greendot on port. */
export function pusherOptions(port) {
  return { wsHost: '127.0.0.1', wsPort: port, forceTLS: false, enabledTransports: ['ws'], cluster: 'mt1', disableStats: true };
}

/**
 * A pusher-js client of server, disconnected after the test. Channel auth is
 * signed by the SDK with presence data {user_id: user, user_info: info};
 * authorize(socketId, channel) replaces that signing (bad signatures);
 * signin {id, user_info, watchlist} is what user authentication signs.
 * The client records connection states (client.states), pusher:error frames
 * (client.errors), connection errors (client.connErrors) and every channel
 * event (client.log).
 */
export function pusherClient(t, server, { user, info = {}, authorize, signin, key = APP.key, port = server.port, options = {} } = {}) {
  const sdk = backend(server);
  const sign = authorize ?? ((socketId, channel) => sdk.authorizeChannel(socketId, channel,
    channel.startsWith('presence-') ? { user_id: user, user_info: info } : undefined));
  const client = new Pusher(key, {
    ...pusherOptions(port),
    channelAuthorization: {
      customHandler: ({ socketId, channelName }, cb) => {
        try { cb(null, sign(socketId, channelName)); } catch (err) { cb(err, null); }
      },
    },
    userAuthentication: {
      customHandler: ({ socketId }, cb) => {
        try { cb(null, sdk.authenticateUser(socketId, signin)); } catch (err) { cb(err, null); }
      },
    },
    ...options,
  });
  client.user_id = user;
  client.states = [];
  client.errors = [];
  client.log = [];
  client.connErrors = [];
  client.connection.bind('state_change', (s) => client.states.push(s.current));
  client.connection.bind('error', (e) => client.connErrors.push(e));
  client.bind('pusher:error', (data) => client.errors.push(data));
  t.after(() => client.disconnect());
  return client;
}

/** Waits until client's connection is 'connected'. */
export function connected(client, timeout = 5000) {
  return waitFor(() => client.connection.state === 'connected', {
    timeout, message: () => `pusher-js ${client.user_id ?? ''} to be connected (states ${client.states.join(' → ')})`,
  });
}

/**
 * Subscribes client to name: the channel once pusher:subscription_succeeded
 * came, or an error carrying pusher-js's subscription_error (err.detail).
 * The channel records its events in channel.log (name, data, metadata), its
 * members' comings and goings in channel.added / channel.removed.
 */
export function subscribe(client, name, timeout = 5000) {
  const ch = client.subscribe(name);
  ch.log ??= [];
  ch.added ??= [];
  ch.removed ??= [];
  ch.errors ??= [];
  if (!ch.recording) {
    ch.recording = true;
    ch.bind_global((event, data) => { ch.log.push({ event, data }); client.log.push({ channel: name, event, data }); });
    ch.bind('pusher:member_added', (m) => ch.added.push(m));
    ch.bind('pusher:member_removed', (m) => ch.removed.push(m));
    ch.bind('pusher:subscription_error', (e) => ch.errors.push(e));
  }
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`${client.user_id ?? 'client'}: neither subscription_succeeded nor subscription_error on ${name} within ${timeout} ms`));
    }, timeout);
    const ok = () => { done(); resolve(ch); };
    const bad = (e) => {
      done();
      reject(Object.assign(new Error(`${client.user_id ?? 'client'}: subscription_error on ${name}: ${JSON.stringify(e)}`), { detail: e }));
    };
    const done = () => {
      clearTimeout(timer);
      ch.unbind('pusher:subscription_succeeded', ok);
      ch.unbind('pusher:subscription_error', bad);
    };
    ch.bind('pusher:subscription_succeeded', ok);
    ch.bind('pusher:subscription_error', bad);
  });
}

/** The user ids pusher-js holds as channel's members, sorted. */
export function memberIds(ch) {
  return Object.keys(ch.members.members).sort();
}

/** Waits until channel's members are exactly ids. */
export function expectMembers(ch, ids, timeout = 5000) {
  const want = [...ids].sort();
  return waitFor(() => JSON.stringify(memberIds(ch)) === JSON.stringify(want), {
    timeout, message: () => `members of ${ch.name} to be ${JSON.stringify(want)}; they are ${JSON.stringify(memberIds(ch))}`,
  });
}

/** Waits until channel's log holds an event named event (and matching pred). */
export function waitEvent(ch, event, pred = () => true, timeout = 5000) {
  return waitFor(() => ch.log.find((e) => e.event === event && pred(e.data)), {
    timeout, message: () => `${event} on ${ch.name}; its events: ${JSON.stringify(ch.log.map((e) => e.event))}`,
  });
}

/** Counts user_id's member_added (or member_removed) on channel. */
export function count(list, userId) {
  return list.filter((m) => m.id === userId).length;
}

/**
 * A raw Pusher-protocol WebSocket (`ws`) to /app/{key}?protocol=7, closed
 * after the test: frames holds every frame received (data parsed when it is
 * JSON text), closed resolves to the close code.
 */
export async function rawSocket(t, server, { key = APP.key, query = 'protocol=7&client=js&version=8.6.0' } = {}) {
  const ws = new WebSocket(`${server.ws}/app/${encodeURIComponent(key)}?${query}`);
  const frames = [];
  let closeCode = null;
  const closed = new Promise((resolve) => ws.on('close', (code) => { closeCode = code; resolve(code); }));
  ws.on('message', (b) => {
    let f;
    try { f = JSON.parse(String(b)); } catch { f = { unparsed: String(b) }; }
    if (typeof f.data === 'string') { try { f.data = JSON.parse(f.data); } catch { /* plain text data */ } }
    frames.push(f);
  });
  ws.on('error', () => {});
  t.after(() => ws.terminate());
  const sock = {
    ws, frames, closed,
    get closeCode() { return closeCode; },
    get open() { return ws.readyState === WebSocket.OPEN; },
    /** Sends {event, data, channel}; data objects are sent as they are. */
    send(event, data = {}, channel) {
      ws.send(JSON.stringify(channel === undefined ? { event, data } : { event, data, channel }));
    },
    /** Waits for a frame matching pred (from index from on); returns it. */
    waitFrame(pred, what, { timeout = 5000, from = 0 } = {}) {
      return waitFor(() => frames.slice(from).find(pred), {
        timeout, message: () => `${what}; frames got: ${JSON.stringify(frames)}`,
      });
    },
  };
  return sock;
}

/** A raw socket past pusher:connection_established; sock.socketId is set. */
export async function rawConnected(t, server, opts) {
  const sock = await rawSocket(t, server, opts);
  const est = await sock.waitFrame((f) => f.event === 'pusher:connection_established', 'pusher:connection_established');
  sock.socketId = est.data.socket_id;
  return sock;
}

/**
 * A native greendot client (dev mode: ?user=) of server, closed after the test.
 * It records presence changes like clients/js's helpers do.
 */
export function nativeClient(t, server, user) {
  const c = new GreendotClient({ url: server.ws, user, WebSocket, idle: false });
  t.after(() => c.close());
  return c.connect();
}

/** Waits until native client viewer holds user in state. */
export function waitNative(viewer, user, state, timeout = 5000) {
  return waitFor(() => viewer.get(user)?.state === state, {
    timeout, message: () => `${viewer.userId} to see ${user} ${state} (holds ${JSON.stringify(viewer.get(user))})`,
  });
}

/** Resolves after ms: only where time passing is the thing under test. */
export function idle(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

/** The body of a RequestError from the SDK (or the value it resolved to). */
export async function status(promise) {
  try {
    const res = await promise;
    return { status: res.status, body: await res.text() };
  } catch (err) {
    if (err.status === undefined) throw err;
    return { status: err.status, body: err.body };
  }
}

export { assert };
