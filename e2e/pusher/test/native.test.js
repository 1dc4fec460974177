// Native greendot clients and Pusher clients in one team: each side sees
// the other's users come and go.

import { test } from 'node:test';
import {
  assert, startGreendot, pusherClient, subscribe, memberIds, expectMembers, waitFor, count, addMember,
  nativeClient, waitNative, uniq, GRACE_MS, TTL_MS,
} from './helpers.js';

test('Pusher clients see native users as members, with info {}', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const team = uniq('eng');
  const ch = `presence-${team}`;
  await addMember(server, team, 'nat1');
  await addMember(server, team, 'nat2');
  const nat1 = nativeClient(t, server, 'nat1');
  await waitFor(() => nat1.state === 'open', { message: 'nat1 open' });

  const alice = pusherClient(t, server, { user: 'alice', info: { name: 'Alice' } });
  const a = await subscribe(alice, ch);
  assert.deepEqual(memberIds(a), ['alice', 'nat1'], 'the online native user is listed');
  assert.deepEqual(a.members.get('nat1').info, {});

  const nat2 = nativeClient(t, server, 'nat2');
  await waitFor(() => count(a.added, 'nat2') === 1, { message: () => `member_added for native nat2; got ${JSON.stringify(a.added)}` });
  assert.deepEqual(a.added.find((m) => m.id === 'nat2'), { id: 'nat2', info: {} });
  nat2.close();
  await waitFor(() => count(a.removed, 'nat2') === 1, { timeout: GRACE_MS + 5000, message: 'member_removed for nat2' });
  await expectMembers(a, ['alice', 'nat1']);
});

test('native clients see Pusher users online, then offline after the grace', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const team = uniq('eng');
  const ch = `presence-${team}`;
  await addMember(server, team, 'nat1');
  const nat1 = nativeClient(t, server, 'nat1');
  await waitFor(() => nat1.state === 'open', { message: 'nat1 open' });

  const alice = pusherClient(t, server, { user: 'alice' });
  await subscribe(alice, ch);
  await waitNative(nat1, 'alice', 'online');

  // A second Pusher tab and a native device of the same user are one user.
  const aliceTab2 = pusherClient(t, server, { user: 'alice' });
  await subscribe(aliceTab2, ch);
  alice.disconnect();
  aliceTab2.disconnect();
  await waitNative(nat1, 'alice', 'offline', GRACE_MS + 5000);

  // A native device keeps a Pusher user online when the tab closes.
  const bob = pusherClient(t, server, { user: 'bob' });
  await subscribe(bob, ch);
  await waitNative(nat1, 'bob', 'online');
  const bobNative = nativeClient(t, server, 'bob');
  await waitFor(() => bobNative.state === 'open', { message: 'bob’s native device open' });
  const viewer = pusherClient(t, server, { user: 'carol' });
  const v = await subscribe(viewer, ch);
  assert.deepEqual(memberIds(v), ['bob', 'carol', 'nat1']);
  bob.disconnect();
  // carol's own Pusher view: bob stays until his native device goes too.
  const dan = pusherClient(t, server, { user: 'dan' });
  await subscribe(dan, ch);
  dan.disconnect();
  await waitFor(() => count(v.removed, 'dan') === 1, { timeout: GRACE_MS + 5000, message: 'member_removed for dan (the barrier)' });
  assert.equal(count(v.removed, 'bob'), 0, `bob still has a native device: ${JSON.stringify(v.removed)}`);
  assert.equal(nat1.get('bob')?.state, 'online');
  bobNative.close();
  await waitFor(() => count(v.removed, 'bob') === 1, { timeout: GRACE_MS + 5000, message: 'member_removed for bob' });
  await waitNative(nat1, 'bob', 'offline', TTL_MS + GRACE_MS);
});
