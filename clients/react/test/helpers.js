// Test helpers: a real `greendot serve` process on a free port, and polling
// with deadlines. A trimmed copy of clients/js/test/helpers.js: this package
// installs on its own, without clients/js's devDependencies.

import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

let builtBinary = null;

/** $GREENDOT_BIN when set (test/run.js builds it once), else built here once per process. */
export function greendotBinary() {
  if (process.env.GREENDOT_BIN) return process.env.GREENDOT_BIN;
  if (builtBinary) return builtBinary;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'greendot-reacttest-'));
  const bin = path.join(dir, 'greendot');
  execFileSync('go', ['build', '-o', bin, './cmd/greendot'], { cwd: repoRoot, stdio: ['ignore', 'inherit', 'inherit'] });
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  builtBinary = bin;
  return bin;
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
 * (throws with message, which may be an async function giving it then).
 */
export async function waitFor(fn, { timeout = 5000, interval = 25, message = 'condition' } = {}) {
  const deadline = Date.now() + timeout;
  let lastErr;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      lastErr = err;
    }
    if (Date.now() >= deadline) {
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

/** Flags giving fast tests: a closed client is offline after a 300 ms grace. */
export const FAST_FLAGS = ['--ttl', '2s', '--heartbeat-interval', '500ms', '--offline-grace', '300ms'];

/** Starts `greendot serve` on a free port of 127.0.0.1 and waits for GET /healthz. */
export async function startServer({ extra = [] } = {}) {
  const port = await freePort();
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('GREENDOT_')) env[k] = v;
  const args = ['serve', '--addr', `127.0.0.1:${port}`, ...FAST_FLAGS, ...extra];
  const child = spawn(greendotBinary(), args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  liveServers.add(child);
  let log = '';
  const keep = (b) => { log = (log + b.toString()).slice(-20000); };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  let exitInfo = null;
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => {
    liveServers.delete(child);
    exitInfo = { code, signal };
    resolve(exitInfo);
  }));
  const server = {
    port,
    http: `http://127.0.0.1:${port}`,
    ws: `ws://127.0.0.1:${port}`,
    get log() { return log; },
    async stop() {
      if (exitInfo) return exitInfo;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 15000);
      const e = await exited;
      clearTimeout(timer);
      return e;
    },
  };
  try {
    await waitFor(async () => {
      if (exitInfo) throw new Error(`greendot exited early (${JSON.stringify(exitInfo)})`);
      const res = await fetch(`${server.http}/healthz`);
      await res.arrayBuffer();
      return res.status === 200;
    }, { timeout: 15000, interval: 50, message: `greendot on port ${port} to answer /healthz` });
  } catch (err) {
    child.kill('SIGKILL');
    throw new Error(`${err.message}\n--- greendot ${args.join(' ')} log ---\n${log}`);
  }
  return server;
}

/** PUT /v1/teams/{team}/members/{user} with the API key, expecting 204. */
export async function addMember(server, apiKey, team, user) {
  const res = await fetch(`${server.http}/v1/teams/${encodeURIComponent(team)}/members/${encodeURIComponent(user)}`, {
    method: 'PUT', headers: { authorization: `Bearer ${apiKey}` },
  });
  const body = await res.text();
  if (res.status !== 204) throw new Error(`PUT member ${team}/${user}: ${res.status} ${body}`);
}

/** GET a /v1 route with the API key; the parsed JSON body. */
export async function getJSON(server, apiKey, pathname) {
  const res = await fetch(server.http + pathname, { headers: { authorization: `Bearer ${apiKey}` } });
  const body = await res.text();
  if (res.status !== 200) throw new Error(`GET ${pathname}: ${res.status} ${body}`);
  return JSON.parse(body);
}
