// greendot-react: React bindings for greendot-client. Plain ES modules and
// createElement (no JSX), so there is nothing to build; index.d.ts has the
// types. The stores behind the hooks live in store.js.

import {
  createContext, createElement, useContext, useEffect, useMemo, useRef, useSyncExternalStore,
} from 'react';
import { GreendotClient } from 'greendot-client';
import { apiUrlFor, httpFetchTeam, storeFor } from './store.js';

const GreendotContext = createContext(null);

const CLIENT_PROPS = ['url', 'token', 'user', 'device', 'WebSocket', 'options'];

/**
 * Gives its children a greendot client: either the one passed as `client`
 * (the caller connects and closes it), or one made from url/token/user/
 * device/WebSocket/options, connected while the provider is mounted and
 * closed when it unmounts.
 */
export function GreendotProvider(props) {
  const { client: given, apiUrl, fetchTeam, children } = props;
  if (given != null) {
    const extra = CLIENT_PROPS.filter((k) => props[k] !== undefined);
    if (extra.length) {
      throw new Error(`greendot-react: GreendotProvider takes either client or ${extra.join('/')}, not both`);
    }
    if (typeof given.onChange !== 'function' || typeof given.get !== 'function') {
      throw new TypeError('greendot-react: GreendotProvider\'s client must be a GreendotClient');
    }
  }

  // The token is read at every (re)connect, so a new one needs no new client.
  const tokenRef = useRef(props.token);
  useEffect(() => { tokenRef.current = props.token; });
  const hasToken = props.token != null;
  const { url, user, device, WebSocket } = props;
  const owned = useMemo(() => {
    if (given != null) return null;
    const opts = { ...props.options };
    if (url !== undefined) opts.url = url;
    if (user !== undefined) opts.user = user;
    if (device !== undefined) opts.device = device;
    if (WebSocket !== undefined) opts.WebSocket = WebSocket;
    // Server-side rendering in Node 20, which has no WebSocket: the client is
    // made (hooks read its empty map) but never connects, effects running
    // only in the browser.
    if (typeof (opts.WebSocket ?? globalThis.WebSocket) !== 'function') opts.WebSocket = NoWebSocket;
    if (hasToken) {
      opts.token = () => {
        const t = tokenRef.current;
        return typeof t === 'function' ? t() : t;
      };
    }
    return new GreendotClient(opts);
    // options are read once, when the client is made: an inline object would
    // otherwise make a new client at every render.
  }, [given, String(url ?? ''), user, device, WebSocket, hasToken]);

  useEffect(() => {
    if (!owned) return undefined;
    // Connect a tick later: StrictMode's immediate unmount and remount then
    // opens one connection, not one closed while connecting and a second.
    const timer = setTimeout(() => owned.connect(), 0);
    return () => {
      clearTimeout(timer);
      owned.close();
    };
  }, [owned]);

  const client = given ?? owned;
  const fetchRef = useRef(fetchTeam);
  useEffect(() => { fetchRef.current = fetchTeam; });
  const base = apiUrl !== undefined ? apiUrl : given == null ? apiUrlFor(url) : null;
  const value = useMemo(() => {
    const httpFetch = base == null ? null : httpFetchTeam(base);
    return {
      client,
      store: storeFor(client),
      // Stable while the provider lives, so that team stores survive re-renders.
      fetchTeam: (teamId, opts) => {
        if (fetchRef.current) return fetchRef.current(teamId, opts);
        if (!httpFetch) {
          throw new Error('greendot-react: useTeam needs GreendotProvider\'s apiUrl or fetchTeam when it is given a client');
        }
        return httpFetch(teamId, opts);
      },
    };
  }, [client, base]);
  return createElement(GreendotContext.Provider, { value }, children);
}

class NoWebSocket {
  constructor() {
    throw new TypeError('greendot-react: no WebSocket here; pass GreendotProvider a WebSocket (in Node 20: import { WebSocket } from "ws")');
  }
}

function useGreendotContext(hook) {
  const ctx = useContext(GreendotContext);
  if (!ctx) throw new Error(`greendot-react: ${hook} must be used inside <GreendotProvider>`);
  return ctx;
}

/** The provider's GreendotClient, for setStatus, query and the like. */
export function useGreendot() {
  return useGreendotContext('useGreendot').client;
}

/** The connection state: 'connecting', 'open', 'reconnecting' or 'closed'. */
export function useConnectionState() {
  const { store } = useGreendotContext('useConnectionState');
  const subscribe = useMemo(() => (cb) => store.subscribeConnection(cb), [store]);
  const get = () => store.getConnection();
  return useSyncExternalStore(subscribe, get, get);
}

/**
 * The presence of userId: { userId, state, version, at }, and lastSeen for an
 * offline user when asked for with { lastSeen: true }.
 */
export function usePresence(userId, options) {
  if (typeof userId !== 'string' || userId === '') {
    throw new TypeError(`greendot-react: usePresence needs a user id (a non-empty string), not ${JSON.stringify(userId)}`);
  }
  const { store } = useGreendotContext('usePresence');
  const withLastSeen = options?.lastSeen === true;
  const subscribe = useMemo(() => (cb) => store.subscribeUser(userId, cb), [store, userId]);
  const get = () => store.getUser(userId, withLastSeen);
  const p = useSyncExternalStore(subscribe, get, get);
  const wantLastSeen = withLastSeen && p.state === 'offline' && p.lastSeen === undefined;
  useEffect(() => {
    if (wantLastSeen) store.requestLastSeen(userId, p.version);
  }, [store, userId, wantLastSeen, p.version]);
  return p;
}

/**
 * The members of teamId who are not offline, live: { teamId, memberCount,
 * members: [{ userId, state, version }], loading, error, refresh }.
 */
export function useTeam(teamId) {
  if (typeof teamId !== 'string' || teamId === '') {
    throw new TypeError(`greendot-react: useTeam needs a team id (a non-empty string), not ${JSON.stringify(teamId)}`);
  }
  const { store, fetchTeam } = useGreendotContext('useTeam');
  const team = store.team(teamId, fetchTeam);
  const subscribe = useMemo(() => (cb) => team.subscribe(cb), [team]);
  const get = () => team.getSnapshot();
  const snap = useSyncExternalStore(subscribe, get, get);
  const refresh = useMemo(() => () => team.refresh(), [team]);
  return useMemo(() => ({ ...snap, refresh }), [snap, refresh]);
}

/** Colours of the dot, the demo page's. */
export const DOT_COLORS = Object.freeze({ online: '#22c55e', away: '#eab308', dnd: '#ef4444', offline: '#9ca3af' });

/**
 * A round dot in the colour of userId's state, with an aria-label saying it
 * ("bob is away" by default; label may be a string or a function of the
 * presence). Other props go to the <span>.
 */
export function PresenceDot({ userId, label, size = 10, style, ...rest }) {
  const p = usePresence(userId);
  const text = typeof label === 'function' ? label(p) : label ?? `${userId} is ${p.state}`;
  return createElement('span', {
    role: 'img',
    title: text,
    ...rest,
    'aria-label': text,
    'data-state': p.state,
    style: {
      display: 'inline-block',
      width: size,
      height: size,
      borderRadius: '50%',
      backgroundColor: DOT_COLORS[p.state] ?? DOT_COLORS.offline,
      ...style,
    },
  });
}
