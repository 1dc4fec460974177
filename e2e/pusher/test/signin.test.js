// User sign-in (pusher.signin() with the SDK's authenticateUser) and the
// watchlist: online/offline events for watched users who share a team with
// the signed-in user.

import { test } from 'node:test';
import {
  assert, startGreendot, pusherClient, backend, subscribe, waitFor, addMember, nativeClient, rawConnected,
  uniq, GRACE_MS,
} from './helpers.js';

test('signin_success, then the watchlist: initial online users, then changes, only for users sharing a team', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const team = uniq('eng');
  const elsewhere = uniq('ops');
  for (const u of ['alice', 'bob', 'carol']) await addMember(server, team, u);
  await addMember(server, elsewhere, 'zed');

  const bob = pusherClient(t, server, { user: 'bob' });
  await subscribe(bob, `presence-${team}`);
  const zed = nativeClient(t, server, 'zed'); // online, but shares no team with alice
  await waitFor(() => zed.state === 'open', { message: 'zed open' });

  const alice = pusherClient(t, server, {
    user: 'alice',
    signin: { id: 'alice', user_info: { name: 'Alice' }, watchlist: ['bob', 'carol', 'zed'] },
  });
  const watch = [];
  alice.user.watchlist.bind('online', (ev) => watch.push({ name: 'online', ids: ev.user_ids }));
  alice.user.watchlist.bind('offline', (ev) => watch.push({ name: 'offline', ids: ev.user_ids }));
  alice.signin();
  await waitFor(() => alice.user.user_data?.id === 'alice', { message: 'pusher:signin_success for alice' });
  await waitFor(() => watch.some((e) => e.name === 'online' && e.ids.includes('bob')), {
    message: () => `the initial online event naming bob; got ${JSON.stringify(watch)}`,
  });

  const carol = nativeClient(t, server, 'carol');
  await waitFor(() => watch.some((e) => e.name === 'online' && e.ids.includes('carol')), {
    message: () => `an online event for carol; got ${JSON.stringify(watch)}`,
  });
  carol.close();
  await waitFor(() => watch.some((e) => e.name === 'offline' && e.ids.includes('carol')), {
    timeout: GRACE_MS + 5000, message: () => `an offline event for carol; got ${JSON.stringify(watch)}`,
  });
  bob.disconnect();
  await waitFor(() => watch.some((e) => e.name === 'offline' && e.ids.includes('bob')), {
    timeout: GRACE_MS + 5000, message: () => `an offline event for bob; got ${JSON.stringify(watch)}`,
  });
  assert.ok(!watch.some((e) => e.ids.includes('zed')), `nothing about zed, who shares no team with alice: ${JSON.stringify(watch)}`);
});

test('pusher:signin on the wire: signin_success with the user data; a bad signature is refused', { timeout: 30000 }, async (t) => {
  const server = await startGreendot(t);
  const user = { id: 'alice', user_info: { name: 'Alice' }, watchlist: [] };

  const sock = await rawConnected(t, server);
  const signed = backend(server).authenticateUser(sock.socketId, user);
  sock.send('pusher:signin', signed);
  const ok = await sock.waitFrame((f) => f.event === 'pusher:signin_success' || f.event === 'pusher:error', 'pusher:signin_success');
  assert.equal(ok.event, 'pusher:signin_success', JSON.stringify(ok));
  assert.equal(ok.data.user_data, signed.user_data, 'the user data as signed');

  const bad = await rawConnected(t, server);
  const forged = backend(server, { secret: 'not-the-secret' }).authenticateUser(bad.socketId, user);
  bad.send('pusher:signin', forged);
  // Refused: a pusher:error (or the socket closed), never signin_success.
  await waitFor(() => bad.frames.some((f) => f.event === 'pusher:error' || f.event === 'pusher:signin_success') || bad.closeCode !== null,
    { message: () => `a refusal of a forged signin; frames ${JSON.stringify(bad.frames)}` });
  assert.ok(!bad.frames.some((f) => f.event === 'pusher:signin_success'), JSON.stringify(bad.frames));
});
