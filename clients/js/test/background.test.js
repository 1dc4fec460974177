// A hidden tab whose page code does not run stays online: the server's
// WebSocket pings are answered by the browser's network stack, whatever the
// page's timers do.
//
// Chromium throttles the chained timers of a hidden page to one wake-up a
// minute ("intensive wake-up throttling") after a grace period, and freezes
// background tabs outright in some modes (Energy Saver): either way a
// heartbeat sent from a page timer leaves the connection silent past any
// ttl. The test freezes the hidden tab through CDP
// (Page.setWebLifecycleState), the worst case of both. Waiting for the
// throttling itself proved unreliable: one run in a loaded suite saw
// Chromium 156 keep the hidden tab at one-second wake-ups for a whole
// minute, with feature flags that shorten the grace to 10 s.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { WebSocket } from 'ws';
import { CHROMIUM, NO_CHROMIUM, launch } from './cdp.js';
import { addMember, clients, getJSON, startServer, uniq, waitFor, waitOpen, waitPresence } from './helpers.js';

const TTL_MS = 2000; // FAST_FLAGS

test('a hidden, frozen tab stays online', { timeout: 120000 }, async (t) => {
  assert.ok(fs.existsSync(CHROMIUM), NO_CHROMIUM);
  const server = await startServer();
  t.after(() => server.stop());
  const browser = await launch();
  t.after(() => browser.close());
  const mk = clients(t);

  const alice = uniq('alice');
  const bob = uniq('bob');
  await addMember(server, 'demo', alice);
  const viewer = mk({ url: server.ws, user: alice, WebSocket });
  await waitOpen(viewer);

  const tab = await browser.open(`${server.http}/?user=${encodeURIComponent(bob)}`);
  await waitPresence(viewer, bob, 'online', 15000);
  // A probe: a chained timer like the client's heartbeat, whose lateness
  // shows that the page's code has stopped.
  await browser.evaluate(tab, `window.probe = performance.now();
    (function tick() { window.probe = performance.now(); setTimeout(tick, 200); })(); true`);

  const other = await browser.open('about:blank');
  await browser.send('Target.activateTarget', { targetId: other.targetId });
  await waitFor(async () => (await browser.evaluate(tab, 'document.visibilityState')) === 'hidden', { message: 'bob’s tab to be hidden' });
  await waitPresence(viewer, bob, 'away'); // a hidden tab reports away
  const seen = viewer.changes.length;

  await browser.send('Page.setWebLifecycleState', { state: 'frozen' }, tab.sessionId);
  // Frozen: the probe, due every 200 ms, is three ttls late.
  let late = 0;
  await waitFor(async () => {
    late = await browser.evaluate(tab, 'performance.now() - window.probe');
    return late > 3 * TTL_MS;
  }, {
    timeout: 30000,
    interval: 250,
    message: () => `Chromium to stop the frozen tab's timers (probe ${Math.round(late)} ms late)`,
  });
  t.diagnostic(`the hidden tab's timers ran ${Math.round(late)} ms late`);

  const flips = viewer.changes.slice(seen).filter((c) => c.userId === bob).map((c) => c.state);
  assert.deepEqual(flips, [], `alice saw bob change while his tab was hidden and frozen (ttl ${TTL_MS} ms)`);
  const p = await getJSON(server, `/v1/users/${encodeURIComponent(bob)}/presence`);
  assert.equal(p.state, 'away');
  assert.equal(p.connection_count, 1, 'bob kept his one connection');
  assert.equal(await browser.evaluate(tab, 'document.querySelector("#conn").dataset.state'), 'open');

  // Resumed and shown again: back to online on the same connection.
  await browser.send('Page.setWebLifecycleState', { state: 'active' }, tab.sessionId);
  await browser.send('Target.activateTarget', { targetId: tab.targetId });
  await waitPresence(viewer, bob, 'online', 10000);
});
