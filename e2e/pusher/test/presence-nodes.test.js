// Presence across two greendot nodes on one Redis (their own
// redis-server): members are users wherever their sockets are, and a node
// killed with -9 takes its users offline within ttl + grace.

import { test } from 'node:test';
import {
  assert, startRedis, startGreendot, pusherClient, backend, subscribe, memberIds, expectMembers, waitFor,
  count, idle, uniq, TTL_MS, GRACE_MS,
} from './helpers.js';

test('two nodes: one member_added per user whatever node its sockets are on, member_removed after the last', { timeout: 60000 }, async (t) => {
  const redis = await startRedis(t);
  const n1 = await startGreendot(t, { redis, nodeId: 'n1' });
  const n2 = await startGreendot(t, { redis, nodeId: 'n2' });
  const ch = `presence-${uniq('eng')}`;

  const alice = pusherClient(t, n1, { user: 'alice', info: { name: 'Alice' } });
  const a = await subscribe(alice, ch);
  const bobOn2 = pusherClient(t, n2, { user: 'bob', info: { name: 'Bob' } });
  const b = await subscribe(bobOn2, ch);
  assert.deepEqual(memberIds(b), ['alice', 'bob'], 'bob on n2 sees alice on n1');
  await waitFor(() => count(a.added, 'bob') === 1, { message: () => `alice on n1 to get member_added for bob on n2; got ${JSON.stringify(a.added)}` });
  // The user_info each subscribed with crosses nodes (checked last, below).
  const aliceSeenOn2 = b.members.get('alice').info;
  const bobAddedOn1 = a.added.find((m) => m.id === 'bob');

  const bobOn1 = pusherClient(t, n1, { user: 'bob', info: { name: 'Bob' } });
  await subscribe(bobOn1, ch);
  // carol's coming and going is the barrier (see presence.test.js).
  const carol = pusherClient(t, n2, { user: 'carol' });
  await subscribe(carol, ch);
  await waitFor(() => count(a.added, 'carol') === 1, { message: 'member_added for carol' });
  bobOn2.disconnect();
  carol.disconnect();
  await waitFor(() => count(a.removed, 'carol') === 1, { timeout: GRACE_MS + 5000, message: 'member_removed for carol' });
  assert.equal(count(a.added, 'bob'), 1, `one member_added for bob on two nodes: ${JSON.stringify(a.added)}`);
  assert.equal(count(a.removed, 'bob'), 0, `no member_removed while bob has a socket on n1: ${JSON.stringify(a.removed)}`);

  bobOn1.disconnect();
  await waitFor(() => count(a.removed, 'bob') === 1, { timeout: GRACE_MS + 5000, message: 'member_removed for bob' });
  await expectMembers(a, ['alice']);

  // REST on either node reads the same channel.
  for (const [name, node] of [['n1', n1], ['n2', n2]]) {
    const users = await (await backend(node).get({ path: `/channels/${ch}/users` })).json();
    assert.deepEqual(users, { users: [{ id: 'alice' }] }, `GET /channels/${ch}/users on ${name}`);
  }
  assert.deepEqual(aliceSeenOn2, { name: 'Alice' }, 'alice’s user_info in subscription_succeeded on n2');
  assert.deepEqual(bobAddedOn1, { id: 'bob', info: { name: 'Bob' } }, 'member_added on n1 for bob on n2');
});

test('kill -9 of the node holding a user’s only socket: member_removed within ttl + grace, and never back', { timeout: 60000 }, async (t) => {
  const redis = await startRedis(t);
  const n1 = await startGreendot(t, { redis, nodeId: 'n1' });
  const n2 = await startGreendot(t, { redis, nodeId: 'n2' });
  const ch = `presence-${uniq('eng')}`;

  const alice = pusherClient(t, n1, { user: 'alice' });
  const a = await subscribe(alice, ch);
  // dave stays on n2 when it dies: pusher-js would otherwise reconnect him
  // (to a dead port, so he stays away either way).
  const dave = pusherClient(t, n2, { user: 'dave', info: { name: 'Dave' } });
  await subscribe(dave, ch);
  await waitFor(() => count(a.added, 'dave') === 1, { message: 'member_added for dave' });

  await n2.stop('SIGKILL');
  await waitFor(() => count(a.removed, 'dave') === 1, {
    timeout: TTL_MS + GRACE_MS + 5000, interval: 50,
    message: () => `alice to get member_removed for dave after n2 was killed; got ${JSON.stringify(a.removed)}`,
  });

  // Another ttl + grace: nothing on n2 can bring dave back.
  await idle(TTL_MS + GRACE_MS);
  assert.equal(count(a.added, 'dave'), 1, `dave never added again: ${JSON.stringify(a.added)}`);
  assert.equal(count(a.removed, 'dave'), 1);
  const late = pusherClient(t, n1, { user: 'erin' });
  const e = await subscribe(late, ch);
  assert.deepEqual(memberIds(e), ['alice', 'erin'], 'a late subscriber does not see dave');
  const users = await (await backend(n1).get({ path: `/channels/${ch}/users` })).json();
  assert.deepEqual(users.users.map((u) => u.id).sort(), ['alice', 'erin']);
  // pusher-js names a removed member with the info member_added gave it.
  assert.deepEqual(a.removed.find((m) => m.id === 'dave'), { id: 'dave', info: { name: 'Dave' } }, 'dave’s user_info from n2');
});
