// The test app, run in Chromium: renders what a test asks for with
// react-dom, and exposes window.gdt for the test to drive it.

import { createElement as h, StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import { GreendotClient, connect } from 'greendot-client';
import {
  GreendotProvider, PresenceDot, useConnectionState, useGreendot, usePresence, useTeam,
} from '/src/index.js';
import { storeFor } from '/src/store.js';

const renders = {}; // user id → renders of that user's dot
const errors = [];

function Dot({ userId }) {
  renders[userId] = (renders[userId] ?? 0) + 1;
  return h(PresenceDot, { userId, size: 12, 'data-user': userId });
}

function Presence({ userId }) {
  const p = usePresence(userId, { lastSeen: true });
  return h('pre', { 'data-presence': userId }, JSON.stringify(p));
}

function Conn() {
  const state = useConnectionState();
  const client = useGreendot();
  return h('p', { id: 'conn', 'data-state': state, 'data-user': client.userId ?? '' }, state);
}

function Team({ teamId }) {
  const t = useTeam(teamId);
  return h('section', {
    id: 'team',
    'data-loading': String(t.loading),
    'data-count': t.memberCount === null ? '' : String(t.memberCount),
    'data-error': t.error ? t.error.message : '',
  },
  h('button', { id: 'refresh', type: 'button', onClick: t.refresh }, 'refresh'),
  h('ul', null, t.members.map((m) => h('li', { key: m.userId, 'data-user': m.userId, 'data-state': m.state }, `${m.userId} ${m.state}`))));
}

let root = null;
let given = null; // a client made by makeClient, its listeners counted
const live = { onChange: 0, onState: 0, onError: 0 };
const others = {}; // user id → plain client of another user

function tree(spec) {
  const props = { apiUrl: spec.apiUrl };
  if (spec.given) {
    props.client = given;
  } else {
    Object.assign(props, { url: spec.url, user: spec.user, token: spec.token, options: { idle: false } });
  }
  const app = h(GreendotProvider, props,
    spec.conn ? h(Conn) : null,
    ...(spec.dots ?? []).map((id) => h(Dot, { key: `dot-${id}`, userId: id })),
    ...(spec.presence ?? []).map((id) => h(Presence, { key: `p-${id}`, userId: id })),
    spec.team ? h(Team, { teamId: spec.team }) : null);
  return spec.strict ? h(StrictMode, null, app) : app;
}

window.addEventListener('error', (ev) => errors.push(ev.message));

window.gdt = {
  renders,
  errors,
  mount(spec) {
    if (root) throw new Error('already mounted');
    root = createRoot(document.getElementById('root'), {
      onUncaughtError: (err) => errors.push(String(err?.message ?? err)),
    });
    root.render(tree(spec));
  },
  render(spec) { root.render(tree(spec)); },
  unmount() {
    root.unmount();
    root = null;
  },
  /** A client the test owns, whose listeners are counted, for the client= prop. */
  makeClient(url, user) {
    given = new GreendotClient({ url, user, idle: false });
    for (const name of Object.keys(live)) {
      const orig = given[name].bind(given);
      given[name] = (cb) => {
        const off = orig(cb);
        live[name]++;
        let done = false;
        return () => {
          if (!done) { done = true; live[name]--; }
          off();
        };
      };
    }
    given.connect();
  },
  counts() {
    return { ...live, store: given ? storeFor(given).listenerCount() : null, state: given?.state ?? null };
  },
  connectAs(url, user) { others[user] = connect({ url, user, idle: false }); },
  otherState(user) { return others[user]?.state; },
  setStatus(user, s) { others[user].setStatus(s); },
  closeUser(user) { others[user].close(); },
};
