// A bare Chrome DevTools Protocol driver for Debian's Chromium, for what
// playwright-core cannot do: hide a tab. Playwright opens each page in a
// window of its own, emulates focus and turns background throttling off, so
// its pages stay "visible"; a second tab activated in the same window, over
// plain CDP, hides the first for real, and Chromium then throttles its timers.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { WebSocket } from 'ws';

export const CHROMIUM = process.env.GREENDOT_CHROMIUM || '/usr/bin/chromium';
export const NO_CHROMIUM = `no Chromium at ${CHROMIUM}: the browser tests need Debian's package, ` +
  'install it with `apt-get install -y chromium` (the tests never download a browser)';

/**
 * Starts headless Chromium with extra args and connects to it. Returns
 * { send(method, params, sessionId), close() }.
 */
export async function launch(args = []) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'greendot-cdp-'));
  const child = spawn(CHROMIUM, ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    `--user-data-dir=${dir}`, '--remote-debugging-port=0', ...args, 'about:blank'],
  // Its own process group: close() kills the helpers (zygote, renderers,
  // crashpad) with it, which would otherwise outlive it, keep writing into
  // the profile and hold the stderr pipe, and so the test runner, open.
  { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  let log = '';
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`Chromium printed no DevTools address in 20 s:\n${log}`)), 20000);
    child.stderr.on('data', (d) => {
      log = (log + d).slice(-10000);
      const m = log.match(/DevTools listening on (ws:\/\/\S+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`Chromium exited (${code}):\n${log}`)); });
  });
  const ws = new WebSocket(url, { perMessageDeflate: false });
  await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
  let seq = 0;
  const pending = new Map();
  ws.on('message', (data) => {
    const m = JSON.parse(String(data));
    const p = m.id && pending.get(m.id);
    if (!p) return;
    pending.delete(m.id);
    if (m.error) p.reject(new Error(`${p.method}: ${m.error.message}`));
    else p.resolve(m.result);
  });
  const send = (method, params = {}, sessionId = undefined) => new Promise((resolve, reject) => {
    const id = ++seq;
    pending.set(id, { resolve, reject, method });
    ws.send(JSON.stringify({ id, method, params, sessionId }));
  });
  return {
    send,
    /** Opens a tab at url in the browser's window; returns { targetId, sessionId }. */
    async open(url) {
      const { targetId } = await send('Target.createTarget', { url });
      const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
      return { targetId, sessionId };
    },
    /** Evaluates expr in the tab (runs even while its timers are throttled or frozen). */
    async evaluate(tab, expr) {
      const r = await send('Runtime.evaluate', { expression: expr, returnByValue: true, awaitPromise: true }, tab.sessionId);
      if (r.exceptionDetails) throw new Error(`evaluate ${expr}: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
      return r.result.value;
    },
    async close() {
      ws.close();
      const exited = new Promise((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve() : child.once('exit', resolve)));
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch (err) {
        if (err.code !== 'ESRCH') throw err;
      }
      await exited;
      child.stderr.destroy();
      // A helper killed with the group may still be flushing a file.
      fs.rmSync(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
    },
  };
}
