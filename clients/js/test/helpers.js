// Test helpers: a real `greendot serve` process on a free port, polling with
// deadlines, where Chromium is, HS256 tokens, and clients that clean up after
// themselves. clients/react's tests import the server, polling and Chromium
// helpers from here too.

import { spawn, execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { GreendotClient } from '../greendot.js';

// ws is a devDependency of this package only: clients/react's tests load this
// file with their own packages installed, so it is loaded when present and
// the helpers that need it say what is missing when it is not.
let WebSocket = null;
try {
  ({ WebSocket } = await import('ws'));
} catch (err) {
  if (err.code !== 'ERR_MODULE_NOT_FOUND') throw err;
}
function wsClass() {
  if (!WebSocket) throw new Error('the ws package is missing: run `npm ci` in clients/js');
  return WebSocket;
}

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

let builtBinary = null;

/**
 * The greendot binary: $GREENDOT_BIN when set (test/run.js builds it once for
 * the whole run), else built here once per test process.
 */
export function greendotBinary() {
  if (process.env.GREENDOT_BIN) return process.env.GREENDOT_BIN;
  if (builtBinary) return builtBinary;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'greendot-jstest-'));
  const bin = path.join(dir, 'greendot');
  execFileSync('go', ['build', '-o', bin, './cmd/greendot'], { cwd: repoRoot, stdio: ['ignore', 'inherit', 'inherit'] });
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  builtBinary = bin;
  return bin;
}

/** Debian's Chromium, or $GREENDOT_CHROMIUM; the tests never download a browser. */
export const CHROMIUM = process.env.GREENDOT_CHROMIUM || '/usr/bin/chromium';

/** Why tests fail without Chromium; the caller names them, e.g. 'the React tests'. */
export function noChromium(tests = 'the browser tests') {
  return `no Chromium at ${CHROMIUM}: ${tests} need Debian's package, ` +
    'install it with `apt-get install -y chromium` (the tests never download a browser)';
}

/** A TCP port free right now on 127.0.0.1. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/**
 * Polls fn until it returns a truthy value (returned) or the deadline passes
 * (throws, with the last error and the message, which may be a function
 * giving it at that moment). fn may be async.
 */
export async function waitFor(fn, { timeout = 5000, interval = 25, message = 'condition' } = {}) {
  // Monotonic, so that a test may step Date.now (see clock.test.js).
  const deadline = performance.now() + timeout;
  let lastErr;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      lastErr = err;
    }
    if (performance.now() >= deadline) {
      const why = lastErr ? `: ${lastErr.message}` : '';
      let what = message;
      if (typeof message === 'function') {
        try { what = await message(); } catch (err) { what = `(${err.message})`; }
      }
      throw new Error(`timed out after ${timeout} ms waiting for ${what}${why}`);
    }
    await new Promise((r) => setTimeout(r, interval));
  }
}

const liveServers = new Set();
process.on('exit', () => { for (const s of liveServers) s.kill('SIGKILL'); });

/** Flags giving fast tests: a dead client is offline within ~2.3 s. */
export const FAST_FLAGS = ['--ttl', '2s', '--heartbeat-interval', '500ms', '--offline-grace', '300ms'];

/**
 * Starts `greendot serve` on 127.0.0.1 (a free port unless one is given) and
 * waits until GET /healthz answers 200.
 */
export async function startServer({ port, flags = FAST_FLAGS, extra = [] } = {}) {
  port ??= await freePort();
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('GREENDOT_')) env[k] = v;
  const args = ['serve', '--addr', `127.0.0.1:${port}`, ...flags, ...extra];
  const child = spawn(greendotBinary(), args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  liveServers.add(child);
  let log = '';
  const keep = (b) => { log = (log + b.toString()).slice(-20000); };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => {
    liveServers.delete(child);
    resolve({ code, signal });
  }));
  let exitInfo = null;
  exited.then((e) => { exitInfo = e; });

  const server = {
    port,
    http: `http://127.0.0.1:${port}`,
    ws: `ws://127.0.0.1:${port}`,
    get log() { return log; },
    get exited() { return exitInfo !== null; },
    /** Stops the server with signal and waits for its exit (SIGKILL after timeout). */
    async stop(signal = 'SIGTERM', timeout = 15000) {
      if (exitInfo) return exitInfo;
      child.kill(signal);
      const timer = setTimeout(() => child.kill('SIGKILL'), timeout);
      const e = await exited;
      clearTimeout(timer);
      return e;
    },
  };
  try {
    await waitFor(async () => {
      if (exitInfo) throw new Error(`greendot exited early (${JSON.stringify(exitInfo)}):\n${log}`);
      const res = await fetch(`${server.http}/healthz`);
      await res.arrayBuffer();
      return res.status === 200;
    }, { timeout: 15000, interval: 50, message: `greendot on port ${port} to answer /healthz` });
  } catch (err) {
    await server.stop('SIGKILL');
    throw new Error(`${err.message}\n--- greendot ${args.join(' ')} log ---\n${log}`);
  }
  return server;
}

/** PUT /v1/teams/{team}/members/{user}, expecting 204. */
export async function addMember(server, team, user, { apiKey } = {}) {
  const headers = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  const res = await fetch(`${server.http}/v1/teams/${encodeURIComponent(team)}/members/${encodeURIComponent(user)}`, { method: 'PUT', headers });
  const body = await res.text();
  if (res.status !== 204) throw new Error(`PUT member ${team}/${user}: ${res.status} ${body}`);
}

/** GET pathname (with the API key, if given); the parsed JSON body, expecting 200. */
export async function getJSON(server, pathname, { apiKey } = {}) {
  const headers = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  const res = await fetch(server.http + pathname, { headers });
  const body = await res.text();
  if (res.status !== 200) throw new Error(`GET ${pathname}: ${res.status} ${body}`);
  return JSON.parse(body);
}

/** An HS256 JWT signed with secret, as the server expects it. */
export function signToken(secret, claims) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const head = b64({ alg: 'HS256', typ: 'JWT' });
  const body = b64(claims);
  const sig = crypto.createHmac('sha256', secret).update(`${head}.${body}`).digest('base64url');
  return `${head}.${body}.${sig}`;
}

/**
 * A WebSocket class (the `ws` package's) that records every frame sent and
 * received, with times, for assertions on what went over the wire.
 */
export function recordingWebSocket() {
  const sent = [];
  const received = [];
  const sockets = [];
  class RecordingWebSocket extends wsClass() {
    constructor(url, ...rest) {
      super(url, ...rest);
      sockets.push(this);
      this.addEventListener('message', (ev) => {
        try { received.push({ at: Date.now(), frame: JSON.parse(String(ev.data)) }); } catch { /* not JSON */ }
      });
    }

    send(data, ...rest) {
      try { sent.push({ at: Date.now(), frame: JSON.parse(String(data)) }); } catch { /* not JSON */ }
      return super.send(data, ...rest);
    }
  }
  return { WebSocket: RecordingWebSocket, sent, received, sockets };
}

/**
 * Makes clients that are closed after the test: `const mk = clients(t)`, then
 * `mk({ url, user })`. Clients use the `ws` WebSocket unless told otherwise
 * and record the states they went through in `client.states`.
 */
export function clients(t) {
  const made = [];
  t.after(() => { for (const c of made) c.close(); });
  return (opts) => {
    const c = new GreendotClient({ WebSocket: opts?.WebSocket ?? wsClass(), idle: false, ...opts });
    c.states = [];
    c.changes = [];
    c.errors = [];
    c.onState((s, info) => c.states.push({ state: s, info, at: Date.now() }));
    c.onChange((changes) => c.changes.push(...changes));
    c.onError((e) => c.errors.push(e));
    made.push(c);
    return c.connect();
  };
}

/** Waits until client is open (welcome received). */
export function waitOpen(client, timeout = 5000) {
  return waitFor(() => client.state === 'open', { timeout, message: `client ${client.userId ?? ''} to be open` });
}

/** Waits until viewer holds user in state. */
export function waitPresence(viewer, user, state, timeout = 5000) {
  return waitFor(() => viewer.get(user)?.state === state, {
    timeout,
    message: () => `${viewer.userId} to see ${user} ${state} (holds ${JSON.stringify(viewer.get(user))})`,
  });
}

/** A unique id prefix per test, so tests sharing a server never see each other. */
let seq = 0;
export function uniq(name) {
  seq++;
  return `${name}-${process.pid}-${seq}`;
}
