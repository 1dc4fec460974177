// Server-side rendering in Node (no browser, no greendot server): the hooks
// render from the client's empty map, nothing connects, and a provider
// without a WebSocket (Node 20 has none) still renders.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createElement as h } from 'react';
import { renderToString } from 'react-dom/server';
import { GreendotClient } from 'greendot-client';
import { GreendotProvider, PresenceDot, useConnectionState, usePresence, useTeam } from '../src/index.js';

function Page() {
  const conn = useConnectionState();
  const bob = usePresence('bob', { lastSeen: true });
  const team = useTeam('eng');
  return h('div', null,
    h('p', { id: 'conn' }, conn),
    h('p', { id: 'bob' }, `${bob.state} ${bob.version} ${bob.lastSeen}`),
    h('p', { id: 'team' }, `${team.loading} ${team.memberCount} ${team.members.length}`),
    h(PresenceDot, { userId: 'bob' }));
}

test('renders on the server without connecting', () => {
  const html = renderToString(h(GreendotProvider, { url: 'ws://127.0.0.1:1', user: 'alice', WebSocket: globalThis.WebSocket },
    h(Page)));
  assert.match(html, /<p id="conn">closed<\/p>/);
  assert.match(html, /<p id="bob">offline null undefined<\/p>/);
  assert.match(html, /<p id="team">false null 0<\/p>/);
  assert.match(html, /<span role="img" title="bob is offline" aria-label="bob is offline" data-state="offline"/);
});

test('a given client renders the same, and stays unconnected', () => {
  const client = new GreendotClient({ url: 'ws://127.0.0.1:1', WebSocket: class {} });
  const html = renderToString(h(GreendotProvider, { client }, h(PresenceDot, { userId: 'carol', label: 'Carol' })));
  assert.match(html, /aria-label="Carol" data-state="offline"/);
  assert.equal(client.state, 'closed');
});

test('misuse is a clear error', () => {
  assert.throws(() => renderToString(h(PresenceDot, { userId: 'bob' })), /usePresence must be used inside <GreendotProvider>/);
  const client = new GreendotClient({ url: 'ws://127.0.0.1:1', WebSocket: class {} });
  assert.throws(() => renderToString(h(GreendotProvider, { client, url: 'ws://x' })), /either client or url, not both/);
  assert.throws(() => renderToString(h(GreendotProvider, { user: 'a', url: 'ws://x' }, h(PresenceDot, { userId: '' }))),
    /usePresence needs a user id/);
});
