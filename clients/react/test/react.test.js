// greendot-react rendered by react-dom in Debian's Chromium (driven by
// playwright-core, which never downloads a browser here), against a real
// `greendot serve` with an API key; the page's server passes /v1 requests on
// with the key, as an app's backend would.

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import { CHROMIUM, addMember, getJSON, noChromium, startServer, waitFor } from '../../js/test/helpers.js';
import { startPage } from './page.js';

const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const COLORS = { online: 'rgb(34, 197, 94)', away: 'rgb(234, 179, 8)', offline: 'rgb(156, 163, 175)' };
const NO_CHROMIUM = noChromium('the React tests');
const API_KEY = 'test-api-key';

// A failed test, not only a failed hook, so that a missing browser never passes unnoticed.
test(`Chromium is installed at ${CHROMIUM}`, () => {
  assert.ok(fs.existsSync(CHROMIUM), NO_CHROMIUM);
});

describe('greendot-react in Chromium', { timeout: 120000 }, () => {
  let server;
  let page; // the page server
  let browser;
  const pageErrors = [];

  before(async () => {
    if (!fs.existsSync(CHROMIUM)) throw new Error(NO_CHROMIUM);
    const { chromium } = await import('playwright-core');
    server = await startServer({ extra: ['--api-key', API_KEY] });
    // eng: alice, bob and dave (never connects); ops: alice and carol.
    for (const [team, user] of [['eng', 'alice'], ['eng', 'bob'], ['eng', 'dave'], ['ops', 'alice'], ['ops', 'carol'],
      ['eng', 'frank'], ['eng', 'gina']]) {
      await addMember(server, team, user, { apiKey: API_KEY });
    }
    page = await startPage(server, API_KEY);
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ARGS });
  });

  after(async () => {
    await browser?.close();
    await page?.close();
    await server?.stop();
    assert.deepEqual(pageErrors, [], 'no uncaught errors on any page');
  });

  async function open(name) {
    const ctx = await browser.newContext();
    const p = await ctx.newPage();
    p.on('pageerror', (err) => pageErrors.push(`${name}: ${err.message}`));
    // React's warnings are console errors; so are failed loads: the favicon, and the 401 a test asks for.
    p.on('console', (msg) => {
      if (msg.type() !== 'error') return;
      const from = msg.location()?.url ?? '';
      if (from.endsWith('/favicon.ico') || from.includes('/noauth/')) return;
      pageErrors.push(`${name} console: ${msg.text()} (${from})`);
    });
    const res = await p.goto(page.url);
    assert.equal(res.status(), 200);
    await p.waitForFunction(() => window.gdt !== undefined);
    return p;
  }

  /** Another user, connected with the plain client in a page of their own. */
  async function otherUser(user) {
    const p = await open(user);
    await p.evaluate(([url, u]) => window.gdt.connectAs(url, u), [server.ws, user]);
    await waitFor(() => p.evaluate((u) => window.gdt.otherState(u) === 'open', user), { message: `${user} connected` });
    return {
      setStatus: (s) => p.evaluate(([u, st]) => window.gdt.setStatus(u, st), [user, s]),
      close: async () => {
        await p.evaluate((u) => window.gdt.closeUser(u), user);
        await p.context().close();
      },
    };
  }

  function dot(p, user) {
    return p.evaluate((u) => {
      const el = document.querySelector(`span[data-user="${CSS.escape(u)}"]`);
      if (!el) return null;
      return { label: el.getAttribute('aria-label'), role: el.getAttribute('role'), state: el.dataset.state, color: getComputedStyle(el).backgroundColor };
    }, user);
  }

  async function expectDot(p, user, state, timeout = 5000) {
    await waitFor(async () => {
      const d = await dot(p, user);
      return d?.state === state && d.label === `${user} is ${state}` && d.role === 'img' && d.color === COLORS[state];
    }, { timeout, message: async () => `${user}'s dot ${state}; it is ${JSON.stringify(await dot(p, user))}` });
  }

  function presence(p, user) {
    return p.evaluate((u) => {
      const el = document.querySelector(`pre[data-presence="${CSS.escape(u)}"]`);
      return el ? JSON.parse(el.textContent) : null;
    }, user);
  }

  function team(p) {
    return p.evaluate(() => {
      const el = document.getElementById('team');
      if (!el) return null;
      return {
        loading: el.dataset.loading === 'true',
        count: el.dataset.count,
        error: el.dataset.error,
        members: [...el.querySelectorAll('li')].map((li) => `${li.dataset.user}:${li.dataset.state}`),
      };
    });
  }

  async function expectTeam(p, want, message) {
    await waitFor(async () => {
      const t = await team(p);
      return t && !t.loading && t.error === '' && JSON.stringify(t.members) === JSON.stringify(want);
    }, { message: async () => `${message}: team ${JSON.stringify(want)}, is ${JSON.stringify(await team(p))}` });
  }

  const openConn = (p) => p.waitForSelector('#conn[data-state="open"]', { timeout: 10000 });

  test('a dot follows bob online → away → offline; lastSeen comes once he is offline', async () => {
    const alice = await open('alice');
    await alice.evaluate((url) => window.gdt.mount({ url, user: 'alice', conn: true, dots: ['bob', 'carol'], presence: ['bob'] }), server.ws);
    await openConn(alice);
    await expectDot(alice, 'bob', 'offline');
    // Never seen: the server answers last_seen null.
    await waitFor(async () => (await presence(alice, 'bob'))?.lastSeen === null, { message: 'bob’s lastSeen null' });
    const carolRenders = await alice.evaluate(() => window.gdt.renders.carol);

    const connectedAt = Date.now();
    const bob = await otherUser('bob');
    await expectDot(alice, 'bob', 'online');
    const online = await presence(alice, 'bob');
    assert.equal(online.state, 'online');
    assert.ok(online.version >= 1, `version ${online.version}`);
    assert.ok(!('lastSeen' in online), 'no lastSeen while online');

    await bob.setStatus('away');
    await expectDot(alice, 'bob', 'away');
    const away = await presence(alice, 'bob');
    assert.ok(away.version > online.version, `away's version ${away.version} after ${online.version}`);

    await bob.close();
    await expectDot(alice, 'bob', 'offline');
    await waitFor(async () => typeof (await presence(alice, 'bob')).lastSeen === 'number', { message: 'bob’s lastSeen' });
    const off = await presence(alice, 'bob');
    assert.ok(off.version > away.version);
    assert.ok(off.lastSeen >= connectedAt && off.lastSeen <= Date.now(), `lastSeen ${off.lastSeen} within bob’s session`);
    // carol's dot holds its own subscription: bob's changes did not render it.
    assert.equal(await alice.evaluate(() => window.gdt.renders.carol), carolRenders);
    await alice.evaluate(() => window.gdt.unmount());
    await alice.context().close();
  });

  test('useTeam lists the team from the HTTP route and keeps it live', async () => {
    const alice = await open('alice');
    await alice.evaluate((url) => window.gdt.mount({ url, user: 'alice', conn: true, team: 'eng', apiUrl: location.origin }), server.ws);
    await openConn(alice);
    await expectTeam(alice, ['alice:online'], 'alice alone');
    assert.equal((await team(alice)).count, '5');

    const bob = await otherUser('bob');
    await expectTeam(alice, ['alice:online', 'bob:online'], 'bob came online: fetched again');
    await bob.setStatus('away');
    await expectTeam(alice, ['alice:online', 'bob:away'], 'bob away');

    // carol shares ops, not eng, with alice: her coming online makes it fetch, and she stays out.
    const before = page.teamRequests;
    const carol = await otherUser('carol');
    await waitFor(() => page.teamRequests > before, { message: 'a fetch after carol came online' });
    await expectTeam(alice, ['alice:online', 'bob:away'], 'carol is not in eng');

    await bob.close();
    await expectTeam(alice, ['alice:online'], 'bob offline: out of the list');

    // carol joins eng while alice already sees her (ops): no frame says so; refresh() does.
    await addMember(server, 'eng', 'carol', { apiKey: API_KEY });
    await alice.click('#refresh');
    await expectTeam(alice, ['alice:online', 'carol:online'], 'after refresh');
    assert.equal((await team(alice)).count, '6');
    await carol.close();
    await expectTeam(alice, ['alice:online'], 'carol offline');
    await alice.evaluate(() => window.gdt.unmount());
    await alice.context().close();
  });

  test('useTeam reports the route’s error', async () => {
    const alice = await open('alice');
    // /noauth passes the request on without the API key: greendot answers 401.
    await alice.evaluate((url) => window.gdt.mount({ url, user: 'alice', team: 'eng', apiUrl: `${location.origin}/noauth` }), server.ws);
    await waitFor(async () => /401 unauthorized: missing or wrong API key/.test((await team(alice))?.error ?? ''), {
      message: async () => `the 401 shown; team is ${JSON.stringify(await team(alice))}`,
    });
    await alice.evaluate(() => window.gdt.unmount());
    await alice.context().close();
  });

  test('hooks unsubscribe on unmount; a given client is left open', async () => {
    const alice = await open('alice');
    await alice.evaluate((url) => window.gdt.makeClient(url, 'alice'), server.ws);
    const counts = () => alice.evaluate(() => window.gdt.counts());
    await waitFor(async () => (await counts()).state === 'open', { message: 'the given client open' });
    const base = await counts();
    assert.deepEqual([base.onChange, base.onState, base.store], [0, 0, 0]);

    const many = Array.from({ length: 20 }, (_, i) => `user${i}`);
    await alice.evaluate(([dots]) => window.gdt.mount({ given: true, conn: true, dots, presence: ['bob', 'dave'], team: 'eng', apiUrl: location.origin }), [many]);
    await openConn(alice);
    await expectTeam(alice, ['alice:online'], 'team loaded');
    await waitFor(async () => (await presence(alice, 'dave'))?.lastSeen === null, { message: 'dave’s lastSeen null' });
    const mounted = await counts();
    assert.equal(mounted.onChange, 1, 'one onChange listener on the client for every hook');
    assert.equal(mounted.store, 20 + 2 + 1, '20 dots, 2 presences and one team');
    assert.ok(mounted.onState >= 2, `connection state and team listen to onState (${mounted.onState})`);

    await alice.evaluate(() => window.gdt.render({ given: true, dots: ['bob'] }));
    await waitFor(async () => {
      const c = await counts();
      return c.store === 1 && c.onChange === 1 && c.onState === 0;
    }, { message: async () => `one dot left: ${JSON.stringify(await counts())}` });

    await alice.evaluate(() => window.gdt.unmount());
    await waitFor(async () => {
      const c = await counts();
      return c.store === 0 && c.onChange === 0 && c.onState === 0;
    }, { message: async () => `no listener left after the unmount: ${JSON.stringify(await counts())}` });
    assert.equal((await counts()).state, 'open', 'the provider does not close a client it was given');
    await alice.context().close();
  });

  test('in StrictMode the provider keeps one connection, and closes it on unmount', async () => {
    const frank = await open('frank');
    await frank.evaluate((url) => window.gdt.mount({ url, user: 'frank', conn: true, strict: true }), server.ws);
    await openConn(frank);
    const conns = async () => (await getJSON(server, '/v1/users/frank/presence', { apiKey: API_KEY })).connection_count;
    await waitFor(async () => (await conns()) === 1, { message: async () => `frank with one connection (${await conns()})` });
    await frank.evaluate(() => window.gdt.unmount());
    await waitFor(async () => (await getJSON(server, '/v1/users/frank/presence', { apiKey: API_KEY })).state === 'offline', {
      message: 'frank offline after the unmount',
    });
    await frank.context().close();
  });

  test('the token is read at every connect: after a 4001 the latest token prop is used', async () => {
    const secret = 'react-test-secret';
    const jwtServer = await startServer({ extra: ['--jwt-secret', secret, '--api-key', API_KEY] });
    try {
      const p = await open('gina');
      const sign = (sub, ttlSeconds) => {
        const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
        const unsigned = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub, exp: Math.floor(Date.now() / 1000) + ttlSeconds })}`;
        return `${unsigned}.${crypto.createHmac('sha256', secret).update(unsigned).digest('base64url')}`;
      };
      // gina's token expires within 2 s; the next render brings one for gina2,
      // which the same client uses when the server closes with 4001.
      await p.evaluate(([url, token]) => window.gdt.mount({ url, token, conn: true }), [jwtServer.ws, sign('gina', 2)]);
      await p.waitForSelector('#conn[data-state="open"][data-user="gina"]', { timeout: 10000 });
      await p.evaluate(([url, token]) => window.gdt.render({ url, token, conn: true }), [jwtServer.ws, sign('gina2', 600)]);
      await p.waitForSelector('#conn[data-state="open"][data-user="gina2"]', { timeout: 10000 });
      await p.evaluate(() => window.gdt.unmount());
      await p.context().close();
    } finally {
      await jwtServer.stop();
    }
  });
});
