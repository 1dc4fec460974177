// The example app (example/server.js + index.html) in Debian's Chromium,
// driven by playwright-core (which never downloads a browser): two pages as
// two users, each rendering the member list from Laravel Echo's
// here/joining/leaving.

import { test } from 'node:test';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { CHROMIUM, noChromium } from '../../../clients/js/test/helpers.js';
import { createApp } from '../example/server.js';
import { assert, APP, startGreendot, freePort, waitFor, backend, GRACE_MS } from './helpers.js';

const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const shotDir = process.env.GREENDOT_SCREENSHOT_DIR || os.tmpdir();

// A failed test, not a skip: a missing browser never passes unnoticed.
test(`Chromium is installed at ${CHROMIUM}`, () => {
  assert.ok(fs.existsSync(CHROMIUM), noChromium('the Laravel Echo browser test'));
});

test('two users on the example page see each other join and leave', { timeout: 90000 }, async (t) => {
  if (!fs.existsSync(CHROMIUM)) throw new Error(noChromium('the Laravel Echo browser test'));
  const server = await startGreendot(t);
  const app = createApp({ appId: APP.id, key: APP.key, secret: APP.secret, wsHost: '127.0.0.1', wsPort: server.port });
  const appPort = await freePort();
  await new Promise((resolve) => app.listen(appPort, '127.0.0.1', resolve));
  t.after(() => new Promise((resolve) => { app.closeAllConnections(); app.close(resolve); }));
  const appURL = `http://127.0.0.1:${appPort}`;

  const { chromium } = await import('playwright-core');
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ARGS });
  t.after(() => browser.close());
  const pageErrors = [];

  async function openAs(user, name) {
    // A context each: its own cookie jar, so its own login.
    const ctx = await browser.newContext({ viewport: { width: 600, height: 500 } });
    const page = await ctx.newPage();
    page.on('pageerror', (err) => pageErrors.push(`${user}: ${err.message}`));
    const res = await page.goto(`${appURL}/?user=${encodeURIComponent(user)}&name=${encodeURIComponent(name)}`);
    assert.equal(res.status(), 200, `GET / for ${user}`);
    await page.waitForSelector('#conn[data-state="connected"]', { timeout: 10000 });
    return page;
  }

  const list = (page) => page.$$eval('#members li', (lis) => lis.map((li) => `${li.dataset.user}:${li.firstChild.textContent}`));
  async function expectList(page, who, want, timeout = 5000) {
    await waitFor(async () => JSON.stringify(await list(page)) === JSON.stringify(want), {
      timeout, interval: 50,
      message: async () => `${who}’s member list to be ${JSON.stringify(want)}; it is ${JSON.stringify(await list(page))}` +
        ` (error: ${JSON.stringify(await page.textContent('#error'))})`,
    });
  }

  const alice = await openAs('alice', 'Alice');
  await expectList(alice, 'alice', ['alice:Alice']); // here(): herself
  assert.equal(await alice.textContent('#members li .you'), ' (you)');

  const bob = await openAs('bob', 'Bob');
  await expectList(bob, 'bob', ['alice:Alice', 'bob:Bob']); // here()
  await expectList(alice, 'alice', ['alice:Alice', 'bob:Bob']); // joining()
  assert.equal(await alice.textContent('#count'), '2 here');

  // Greendot counts both pages as members of the team "eng".
  const users = await (await backend(server).get({ path: '/channels/presence-eng/users' })).json();
  assert.deepEqual(users.users.map((u) => u.id).sort(), ['alice', 'bob']);

  fs.mkdirSync(shotDir, { recursive: true });
  const shot = path.join(shotDir, 'greendot-pusher-echo.png');
  await alice.screenshot({ path: shot, fullPage: true });
  t.diagnostic(`screenshot: ${shot}`);

  await bob.context().close();
  await expectList(alice, 'alice', ['alice:Alice'], GRACE_MS + 5000); // leaving()
  assert.equal(await alice.textContent('#count'), '1 here');
  assert.deepEqual(pageErrors, [], 'no uncaught errors on any page');
});
