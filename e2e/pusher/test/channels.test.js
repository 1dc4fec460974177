// Public and private channels receive REST triggers from the `pusher` SDK,
// on one node and across two nodes on one Redis; REST reads of channels
// and presence users; a wrong secret is a 401.

import { test } from 'node:test';
import {
  assert, startRedis, startGreendot, pusherClient, backend, subscribe, waitEvent, waitFor, status, uniq,
} from './helpers.js';

function events(ch, name) {
  return ch.log.filter((e) => e.event === name).map((e) => e.data);
}

test('a public channel gets trigger, to one channel or several; socket_id excludes that socket', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const sdk = backend(server);
  const news = uniq('news');
  const alerts = uniq('alerts');
  const alice = pusherClient(t, server, { user: 'alice' });
  const bob = pusherClient(t, server, { user: 'bob' });
  const a = await subscribe(alice, news);
  const b = await subscribe(bob, news);
  const bAlerts = await subscribe(bob, alerts);

  const res = await sdk.trigger(news, 'headline', { title: 'hello' });
  assert.equal(res.status, 200);
  await waitEvent(a, 'headline');
  await waitEvent(b, 'headline');
  assert.deepEqual(events(a, 'headline'), [{ title: 'hello' }]);

  await sdk.trigger([news, alerts], 'both', { n: 1 });
  await waitEvent(b, 'both');
  await waitEvent(bAlerts, 'both');
  await waitEvent(a, 'both');

  // Excluding alice: the next event (not excluded) shows that the first was
  // never on its way to her.
  await sdk.trigger(news, 'not-for-alice', { n: 2 }, { socket_id: alice.connection.socket_id });
  await sdk.trigger(news, 'for-all', { n: 3 });
  await waitEvent(a, 'for-all');
  await waitEvent(b, 'for-all');
  assert.deepEqual(events(a, 'not-for-alice'), [], 'the excluded socket got nothing');
  assert.deepEqual(events(b, 'not-for-alice'), [{ n: 2 }]);
});

test('a private channel needs auth and gets triggers; triggerBatch delivers every event', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const sdk = backend(server);
  const priv = `private-${uniq('orders')}`;
  const pub = uniq('lobby');
  const alice = pusherClient(t, server, { user: 'alice' });
  const p = await subscribe(alice, priv);
  const l = await subscribe(alice, pub);

  await sdk.trigger(priv, 'order-placed', { id: 7 });
  await waitEvent(p, 'order-placed', (d) => d.id === 7);

  const res = await sdk.triggerBatch([
    { channel: priv, name: 'b1', data: { k: 'private' } },
    { channel: pub, name: 'b2', data: { k: 'public' } },
    { channel: priv, name: 'b3', data: 'plain text' },
  ]);
  assert.equal(res.status, 200);
  await waitEvent(p, 'b1', (d) => d.k === 'private');
  await waitEvent(l, 'b2', (d) => d.k === 'public');
  await waitEvent(p, 'b3', (d) => d === 'plain text');

  const wrong = backend(server, { secret: 'not-the-secret' });
  const mallory = pusherClient(t, server, { user: 'mallory', authorize: (s, c) => wrong.authorizeChannel(s, c) });
  const err = await subscribe(mallory, priv).then(() => null, (e) => e);
  assert.equal(err?.detail?.type, 'AuthError', `a bad signature on ${priv}: ${err?.message ?? 'subscription_succeeded'}`);
});

test('REST reads: channels by prefix with user_count, one channel, a presence channel’s users', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const sdk = backend(server);
  const team = uniq('eng');
  const ch = `presence-${team}`;
  const alice = pusherClient(t, server, { user: 'alice' });
  const aliceTab2 = pusherClient(t, server, { user: 'alice' });
  const bob = pusherClient(t, server, { user: 'bob' });
  await subscribe(alice, ch);
  await subscribe(aliceTab2, ch);
  await subscribe(bob, ch);
  const pub = uniq('lobby');
  await subscribe(bob, pub);

  const list = await (await sdk.get({ path: '/channels', params: { filter_by_prefix: 'presence-', info: 'user_count' } })).json();
  assert.deepEqual(list.channels[ch], { user_count: 2 }, JSON.stringify(list));
  assert.ok(!(pub in list.channels), 'only presence- channels');

  const one = await (await sdk.get({ path: `/channels/${ch}`, params: { info: 'user_count,subscription_count' } })).json();
  assert.equal(one.occupied, true, JSON.stringify(one));
  assert.equal(one.user_count, 2, JSON.stringify(one));
  assert.equal(one.subscription_count, 3, JSON.stringify(one));

  const users = await (await sdk.get({ path: `/channels/${ch}/users` })).json();
  assert.deepEqual(users.users.map((u) => u.id).sort(), ['alice', 'bob'], JSON.stringify(users));
  assert.deepEqual(Object.keys(users), ['users']);

  const bad = backend(server, { secret: 'not-the-secret' });
  assert.equal((await status(bad.get({ path: '/channels' }))).status, 401, 'GET /channels signed with a wrong secret');
  assert.equal((await status(bad.trigger(pub, 'x', {}))).status, 401, 'POST /events signed with a wrong secret');
});

test('two nodes on one Redis: triggers and batches reach sockets on both, REST reads see both', { timeout: 60000 }, async (t) => {
  const redis = await startRedis(t);
  const n1 = await startGreendot(t, { redis, nodeId: 'n1' });
  const n2 = await startGreendot(t, { redis, nodeId: 'n2' });
  const pub = uniq('news');
  const priv = `private-${uniq('orders')}`;
  const ch = `presence-${uniq('eng')}`;
  const alice = pusherClient(t, n1, { user: 'alice' });
  const bob = pusherClient(t, n2, { user: 'bob' });
  const [aPub, aPriv] = [await subscribe(alice, pub), await subscribe(alice, priv)];
  const [bPub, bPriv] = [await subscribe(bob, pub), await subscribe(bob, priv)];
  await subscribe(alice, ch);
  await subscribe(bob, ch);

  const all = [['alice on n1', aPub], ['alice on n1', aPriv], ['bob on n2', bPub], ['bob on n2', bPriv]];
  const everyone = (event) => waitFor(() => all.every(([, c]) => c.log.some((e) => e.event === event)), {
    message: () => `${event} on every socket; missing for ${all.filter(([, c]) => !c.log.some((e) => e.event === event)).map(([who, c]) => `${who} on ${c.name}`).join(', ')}`,
  });
  await backend(n1).trigger([pub, priv], 'from-n1', { n: 1 });
  await everyone('from-n1');

  await backend(n2).triggerBatch([
    { channel: pub, name: 'batch-n2', data: { n: 2 } },
    { channel: priv, name: 'batch-n2', data: { n: 3 } },
  ]);
  await everyone('batch-n2');

  // Excluding bob's socket from n1: the exclusion crosses nodes too.
  await backend(n1).trigger(pub, 'not-for-bob', {}, { socket_id: bob.connection.socket_id });
  await backend(n1).trigger(pub, 'after', {});
  await waitEvent(bPub, 'after');
  await waitEvent(aPub, 'not-for-bob');
  assert.deepEqual(events(bPub, 'not-for-bob'), []);

  // Channel counts over many nodes may be a few seconds old (each node
  // writes its own about every second): poll for them.
  for (const [name, node] of [['n1', n1], ['n2', n2]]) {
    const sdk = backend(node);
    const read = async (p, params) => (await sdk.get({ path: p, params })).json();
    let last;
    await waitFor(async () => {
      last = await read('/channels', { filter_by_prefix: 'presence-', info: 'user_count' });
      return last.channels[ch]?.user_count === 2;
    }, { timeout: 8000, interval: 200, message: () => `GET /channels on ${name} to give ${ch} user_count 2: ${JSON.stringify(last)}` });
    await waitFor(async () => {
      last = await read(`/channels/${ch}`, { info: 'user_count,subscription_count' });
      return last.user_count === 2 && last.subscription_count === 2;
    }, { timeout: 8000, interval: 200, message: () => `GET /channels/${ch} on ${name} to count 2 users, 2 subscriptions: ${JSON.stringify(last)}` });
    const users = await read(`/channels/${ch}/users`);
    assert.deepEqual(users.users.map((u) => u.id).sort(), ['alice', 'bob'], `users on ${name}`);
  }
});
