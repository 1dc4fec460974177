// End to end: the demo page in Debian's Chromium (driven by playwright-core,
// which never downloads a browser here), served by a real `greendot serve`.
//
// Screenshots go to $GREENDOT_SCREENSHOT_DIR (default: the OS temp dir).

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, waitFor } from './helpers.js';

const CHROMIUM = process.env.GREENDOT_CHROMIUM || '/usr/bin/chromium';
const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const COLORS = {
  online: 'rgb(34, 197, 94)', away: 'rgb(234, 179, 8)', offline: 'rgb(156, 163, 175)',
  dnd: 'rgb(239, 68, 68)', invisible: 'rgba(0, 0, 0, 0)', // invisible: a hollow dot, on one's own row only
};
const shotDir = process.env.GREENDOT_SCREENSHOT_DIR || os.tmpdir();
const NO_CHROMIUM = `no Chromium at ${CHROMIUM}: the browser test needs Debian's package, ` +
  'install it with `apt-get install -y chromium` (the tests never download a browser)';

// Counted as a failed test (not only a failed hook) so that a missing browser can never pass unnoticed.
test(`Chromium is installed at ${CHROMIUM}`, () => {
  assert.ok(fs.existsSync(CHROMIUM), NO_CHROMIUM);
});

describe('demo page in Chromium', { timeout: 120000 }, () => {
  let server;
  let browser;
  let alice; // alice's page, open through every test
  const pageErrors = [];

  before(async () => {
    if (!fs.existsSync(CHROMIUM)) throw new Error(NO_CHROMIUM);
    const { chromium } = await import('playwright-core');
    server = await startServer();
    // launch() gives Chromium a fresh, temporary --user-data-dir of its own.
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ARGS });
    alice = await openAs('alice');
    await alice.waitForSelector('#conn[data-state="open"]', { timeout: 10000 });
  });

  after(async () => {
    await browser?.close();
    await server?.stop();
  });

  async function openAs(user, query = '') {
    const ctx = await browser.newContext({ viewport: { width: 760, height: 640 } });
    const page = await ctx.newPage();
    page.on('pageerror', (err) => pageErrors.push(`${user}: ${err.message}`));
    const res = await page.goto(`${server.http}/?user=${encodeURIComponent(user)}${query}`);
    assert.equal(res.status(), 200, `GET / for ${user}`);
    return page;
  }

  /** The state and dot colour of user's row on page, or null without a row. */
  function row(page, user) {
    return page.evaluate((u) => {
      const li = document.querySelector(`#roster li[data-user="${CSS.escape(u)}"]`);
      if (!li) return null;
      return {
        state: li.dataset.state,
        color: getComputedStyle(li.querySelector('.dot')).backgroundColor,
        detail: li.querySelector('.detail').textContent,
        status: li.querySelector('.status').textContent,
      };
    }, user);
  }

  async function expectDot(page, user, state, timeout = 5000) {
    // The dot fades over .2 s: wait for the final colour too.
    await waitFor(async () => {
      const r = await row(page, user);
      return r?.state === state && r.color === COLORS[state];
    }, { timeout, interval: 50, message: async () => `${user}'s dot ${state} (${COLORS[state]}) on the page; row is ${JSON.stringify(await row(page, user))}` });
  }

  /** The users of page's roster rows, top to bottom. */
  function order(page) {
    return page.$$eval('#roster li', (lis) => lis.map((li) => li.dataset.user));
  }

  async function expectText(page, selector, want, timeout = 5000) {
    await waitFor(async () => {
      const got = await page.textContent(selector);
      return want instanceof RegExp ? want.test(got) : got === want;
    }, { timeout, interval: 50, message: async () => `${selector} to read ${want}; it reads ${JSON.stringify(await page.textContent(selector))}` });
  }

  async function screenshot(t, page, name) {
    fs.mkdirSync(shotDir, { recursive: true });
    const file = path.join(shotDir, `greendot-demo-${name}.png`);
    await page.screenshot({ path: file, fullPage: true });
    t.diagnostic(`screenshot: ${file}`);
    console.log(`screenshot saved to ${file}`);
  }

  test('the page serves the client and connects alice', async () => {
    const res = await fetch(`${server.http}/greendot.js`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /javascript/);
    assert.match(await res.text(), /export class GreendotClient/);
    await expectDot(alice, 'alice', 'online');
    assert.equal(await alice.textContent('#conn'), 'open');
    const joined = await (await fetch(`${server.http}/v1/teams/demo/presence`)).json();
    assert.ok(joined.member_count >= 1);
    assert.ok(joined.online.some((u) => u.user_id === 'alice'));
  });

  test('bob joins: green on alice’s page, away: yellow, page closed: grey after the grace', async (t) => {
    const bob = await openAs('bob');
    await expectDot(alice, 'bob', 'online');
    await expectDot(bob, 'alice', 'online'); // and the other way round
    await waitFor(async () => (await row(alice, 'bob')).detail.includes('web'), { message: 'bob’s device listed' });

    await bob.click('#away');
    await expectDot(alice, 'bob', 'away');
    assert.equal(await bob.getAttribute('#away', 'aria-pressed'), 'true');
    await expectDot(bob, 'bob', 'away'); // bob's own row
    await screenshot(t, alice, 'bob-away');

    await bob.click('#away'); // back
    await expectDot(alice, 'bob', 'online');

    const closedAt = Date.now();
    await bob.context().close();
    await expectDot(alice, 'bob', 'offline', 5000);
    const took = Date.now() - closedAt;
    assert.ok(took >= 250, `grey only after the 300 ms grace (took ${took} ms)`);
    await waitFor(async () => /last seen/.test((await row(alice, 'bob')).detail), { message: '“last seen” for bob' });
    await screenshot(t, alice, 'bob-offline');
  });

  test('idle detection turns a silent tab yellow; input turns it green', async () => {
    const carol = await openAs('carol', '&idle=2500');
    await expectDot(alice, 'carol', 'online');
    await expectDot(alice, 'carol', 'away', 8000); // nobody touches carol's tab
    assert.equal(await carol.textContent('#idle-after'), '2.5 s');
    await carol.mouse.move(40, 40);
    await carol.mouse.move(120, 90);
    await expectDot(alice, 'carol', 'online');
    await carol.context().close();
    await expectDot(alice, 'carol', 'offline');
  });

  test('a late joiner names every member, offline ones with their last seen; rows stay put', async (t) => {
    // alice is online; bob and carol, members since the tests above, are
    // offline; erin joins now and is never seen.
    assert.equal((await fetch(`${server.http}/v1/teams/demo/members/erin`, { method: 'PUT' })).status, 204);
    const before = await (await fetch(`${server.http}/v1/teams/demo/presence`)).json();
    assert.equal(before.member_count, 4);
    assert.deepEqual(before.offline.map((u) => u.user_id), ['bob', 'carol', 'erin']);
    const dave = await openAs('dave');
    await expectDot(dave, 'alice', 'online');
    // bob and carol went offline before dave's page opened: the team route names them.
    await waitFor(async () => JSON.stringify(await order(dave)) === JSON.stringify(['dave', 'alice', 'bob', 'carol', 'erin']),
      { message: async () => `dave's roster to be dave, alice, bob, carol, erin; it is ${await order(dave)}` });
    await expectText(dave, '#count', '2 of 5 here');
    for (const u of ['bob', 'carol']) {
      await expectDot(dave, u, 'offline');
      assert.match((await row(dave, u)).detail, /^last seen (just now|\d+ s ago|\d+ min ago)$/, `${u}'s last seen on dave's page`);
    }
    assert.equal((await row(dave, 'erin')).detail, 'never seen');
    assert.doesNotMatch(await dave.textContent('body'), /offline since before this page opened/);

    const bob = await openAs('bob');
    await expectDot(dave, 'bob', 'online');
    assert.deepEqual(await order(dave), ['dave', 'alice', 'bob', 'carol', 'erin'], 'coming online moves no row');
    await expectText(dave, '#count', '3 of 5 here');
    await bob.context().close();
    await expectDot(dave, 'bob', 'offline');
    assert.deepEqual(await order(dave), ['dave', 'alice', 'bob', 'carol', 'erin'], 'going offline moves no row');
    await waitFor(async () => /last seen/.test((await row(dave, 'bob')).detail), { message: '“last seen” for bob on dave’s page' });
    await expectText(dave, '#count', '2 of 5 here');
    await screenshot(t, dave, 'late-joiner');

    // alice's page, open all along, re-reads the team when dave shows up,
    // and so names erin, who joined offline (which sends no change).
    await waitFor(async () => JSON.stringify(await order(alice)) === JSON.stringify(['alice', 'bob', 'carol', 'dave', 'erin']),
      { message: async () => `alice's roster to be alice, bob, carol, dave, erin; it is ${await order(alice)}` });
    await expectText(alice, '#count', '2 of 5 here');
    assert.match((await row(alice, 'carol')).detail, /last seen/);
    assert.equal((await row(alice, 'erin')).detail, 'never seen');
    await dave.context().close();
    await expectDot(alice, 'dave', 'offline');
    assert.deepEqual(await order(alice), ['alice', 'bob', 'carol', 'dave', 'erin']);
  });

  test('a status: dnd is a red dot with the text and emoji on others’ pages; invisible is grey to them, hollow to oneself', async (t) => {
    const bob = await openAs('bob');
    await expectDot(alice, 'bob', 'online');
    await bob.selectOption('#mode', 'dnd');
    await bob.fill('#emoji', '📅');
    await bob.fill('#text', 'In a meeting');
    await bob.selectOption('#until', '3600000');
    await bob.click('#set-status');
    await expectDot(alice, 'bob', 'dnd');
    await waitFor(async () => /^📅 In a meeting \(until .+\)$/.test((await row(alice, 'bob')).status),
      { message: async () => `bob’s status text on alice’s page; row is ${JSON.stringify(await row(alice, 'bob'))}` });
    await expectDot(bob, 'bob', 'dnd'); // his own row
    await expectText(bob, '#my-status', /^📅 In a meeting · until /);
    await screenshot(t, alice, 'bob-dnd');

    await bob.selectOption('#mode', 'invisible');
    await bob.click('#set-status');
    await expectDot(alice, 'bob', 'offline');
    assert.equal((await row(alice, 'bob')).status, '', 'no text while invisible');
    await expectDot(bob, 'bob', 'invisible');
    await expectDot(bob, 'alice', 'online'); // still sees the others
    await screenshot(t, bob, 'bob-invisible');

    await bob.click('#clear-status');
    await expectDot(alice, 'bob', 'online');
    await waitFor(async () => (await row(alice, 'bob')).status === '', { message: 'bob’s text gone' });
    await bob.context().close();
    await expectDot(alice, 'bob', 'offline');
  });

  test('“open another device as another user” opens a tab as someone else', async () => {
    const popupP = alice.context().waitForEvent('page');
    await alice.click('#another');
    const popup = await popupP;
    await popup.waitForLoadState();
    const other = new URL(popup.url()).searchParams.get('user');
    assert.ok(other && other !== 'alice', `popup user ${other}`);
    await expectDot(alice, other, 'online');
    await popup.close();
    await expectDot(alice, other, 'offline');
    assert.deepEqual(pageErrors, [], 'no uncaught errors on any page');
  });
});
