// Presence channels on one node: presence-{team} is greendot team {team};
// members are users, not sockets.

import { test } from 'node:test';
import {
  assert, startGreendot, pusherClient, backend, connected, subscribe, memberIds, expectMembers, waitFor,
  count, rawConnected, getJSON, uniq, GRACE_MS,
} from './helpers.js';

test('subscription_succeeded lists the online members, the subscriber included; one member_added per user', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const team = uniq('eng');
  const ch = `presence-${team}`;
  const alice = pusherClient(t, server, { user: 'alice', info: { name: 'Alice' } });
  const a = await subscribe(alice, ch);
  assert.deepEqual(memberIds(a), ['alice']);
  assert.equal(a.members.me.id, 'alice');
  assert.deepEqual(a.members.me.info, { name: 'Alice' });
  assert.equal(a.members.count, 1);

  const bob = pusherClient(t, server, { user: 'bob', info: { name: 'Bob' } });
  const b = await subscribe(bob, ch);
  assert.deepEqual(memberIds(b), ['alice', 'bob']);
  assert.deepEqual(b.members.get('alice').info, { name: 'Alice' }, 'alice’s user_info as she subscribed with it');
  await waitFor(() => count(a.added, 'bob') === 1, { message: () => `alice to get member_added for bob; got ${JSON.stringify(a.added)}` });
  assert.deepEqual(a.added[0], { id: 'bob', info: { name: 'Bob' } });

  // Subscribing made both members of the greendot team.
  const pres = await getJSON(server, `/v1/teams/${team}/presence`);
  assert.deepEqual(pres.online.map((u) => u.user_id).sort(), ['alice', 'bob'], JSON.stringify(pres));
});

test('a second tab adds nothing, closing one of two removes nothing, the last one gone removes the member after the grace', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const ch = `presence-${uniq('eng')}`;
  const alice = pusherClient(t, server, { user: 'alice' });
  const a = await subscribe(alice, ch);
  const bob1 = pusherClient(t, server, { user: 'bob', info: { name: 'Bob' } });
  await subscribe(bob1, ch);
  await waitFor(() => count(a.added, 'bob') === 1, { message: 'member_added for bob' });

  const bob2 = pusherClient(t, server, { user: 'bob', info: { name: 'Bob' } });
  const b2 = await subscribe(bob2, ch);
  assert.deepEqual(memberIds(b2), ['alice', 'bob']);
  // carol's coming and going is the barrier: whatever bob's second tab and
  // its closing would have sent alice was sent before carol's member_removed.
  const carol = pusherClient(t, server, { user: 'carol' });
  await subscribe(carol, ch);
  await waitFor(() => count(a.added, 'carol') === 1, { message: 'member_added for carol' });
  bob2.disconnect();
  carol.disconnect();
  await waitFor(() => count(a.removed, 'carol') === 1, { timeout: GRACE_MS + 5000, message: 'member_removed for carol' });
  assert.equal(count(a.added, 'bob'), 1, `one member_added for bob, two tabs: ${JSON.stringify(a.added)}`);
  assert.equal(count(a.removed, 'bob'), 0, `no member_removed for bob while a tab is open: ${JSON.stringify(a.removed)}`);
  assert.deepEqual(memberIds(a), ['alice', 'bob']);

  bob1.disconnect();
  await waitFor(() => count(a.removed, 'bob') === 1, { timeout: GRACE_MS + 5000, message: 'member_removed for bob after his last tab' });
  assert.deepEqual(a.removed.find((m) => m.id === 'bob'), { id: 'bob', info: { name: 'Bob' } });
  await expectMembers(a, ['alice']);
});

test('a reload (close and reopen within the grace) shows nothing to the others', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const ch = `presence-${uniq('eng')}`;
  const alice = pusherClient(t, server, { user: 'alice' });
  const a = await subscribe(alice, ch);
  const bob = pusherClient(t, server, { user: 'bob' });
  await subscribe(bob, ch);
  await waitFor(() => count(a.added, 'bob') === 1, { message: 'member_added for bob' });

  bob.disconnect();
  const again = pusherClient(t, server, { user: 'bob' });
  await subscribe(again, ch);

  const carol = pusherClient(t, server, { user: 'carol' });
  await subscribe(carol, ch);
  await waitFor(() => count(a.added, 'carol') === 1, { message: 'member_added for carol' });
  carol.disconnect();
  await waitFor(() => count(a.removed, 'carol') === 1, { timeout: GRACE_MS + 5000, message: 'member_removed for carol' });
  assert.equal(count(a.removed, 'bob'), 0, `no member_removed for bob's reload: ${JSON.stringify(a.removed)}`);
  assert.equal(count(a.added, 'bob'), 1, `no second member_added for bob's reload: ${JSON.stringify(a.added)}`);
  assert.deepEqual(memberIds(a), ['alice', 'bob']);
});

test('a bad signature is a pusher:subscription_error (AuthError), never subscription_succeeded', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const ch = `presence-${uniq('eng')}`;
  const wrong = backend(server, { secret: 'not-the-secret' });
  const mallory = pusherClient(t, server, {
    user: 'mallory',
    authorize: (socketId, channel) => wrong.authorizeChannel(socketId, channel, { user_id: 'mallory', user_info: {} }),
  });
  await connected(mallory);
  const err = await subscribe(mallory, ch).then(() => null, (e) => e);
  assert.ok(err?.detail, `a subscription_error; got ${err?.message ?? 'subscription_succeeded'}`);
  assert.equal(err.detail.type, 'AuthError', JSON.stringify(err.detail));
  assert.equal(typeof err.detail.error, 'string', JSON.stringify(err.detail));
  assert.equal(typeof err.detail.status, 'number', JSON.stringify(err.detail));
  assert.equal(mallory.channel(ch).subscribed, false);

  // The same on the wire, from a raw socket: the error names the channel.
  const sock = await rawConnected(t, server);
  const signed = wrong.authorizeChannel(sock.socketId, ch, { user_id: 'mallory', user_info: {} });
  sock.send('pusher:subscribe', { channel: ch, auth: signed.auth, channel_data: signed.channel_data });
  const frame = await sock.waitFrame((f) => f.event === 'pusher:subscription_error' || f.event === 'pusher_internal:subscription_succeeded',
    `pusher:subscription_error on ${ch}`);
  assert.equal(frame.event, 'pusher:subscription_error', JSON.stringify(frame));
  assert.equal(frame.channel, ch);

  const alice = pusherClient(t, server, { user: 'alice' });
  const a = await subscribe(alice, ch);
  assert.deepEqual(memberIds(a), ['alice'], 'mallory never became a member');
});

test('a socket already present as one user cannot subscribe as another', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const ch1 = `presence-${uniq('eng')}`;
  const ch2 = `presence-${uniq('ops')}`;
  const sdk = backend(server);
  // The app's backend signs ch2 for another user: greendot refuses, since
  // a socket is one user's device.
  const two = pusherClient(t, server, {
    user: 'alice',
    authorize: (socketId, channel) => sdk.authorizeChannel(socketId, channel,
      { user_id: channel === ch1 ? 'alice' : 'bob', user_info: {} }),
  });
  await subscribe(two, ch1);
  const err = await subscribe(two, ch2).then(() => null, (e) => e);
  assert.ok(err?.detail, `a subscription_error on ${ch2}; got ${err?.message ?? 'subscription_succeeded'}`);
  assert.equal(err.detail.type, 'AuthError', JSON.stringify(err.detail));

  const viewer = pusherClient(t, server, { user: 'carol' });
  const v = await subscribe(viewer, ch2);
  assert.deepEqual(memberIds(v), ['carol'], 'bob never became a member through alice’s socket');
});

test('members stay users across sockets: REST sees one user with two sockets', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const ch = `presence-${uniq('eng')}`;
  const tab1 = pusherClient(t, server, { user: 'dave' });
  const tab2 = pusherClient(t, server, { user: 'dave' });
  await subscribe(tab1, ch);
  await subscribe(tab2, ch);
  const sdk = backend(server);
  const info = await (await sdk.get({ path: `/channels/${ch}`, params: { info: 'user_count,subscription_count' } })).json();
  assert.equal(info.occupied, true, JSON.stringify(info));
  assert.equal(info.user_count, 1, JSON.stringify(info));
  assert.equal(info.subscription_count, 2, JSON.stringify(info));
});
