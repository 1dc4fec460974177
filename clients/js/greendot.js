// greendot.js: the JavaScript client of greendot's WebSocket presence protocol (v1).
//
// One ES module for browsers and Node 20+, no build step and no dependency.
// Node 20 has no global WebSocket: pass one (the `ws` package's) as the
// `WebSocket` option. docs/clients.md describes the behaviour; greendot.d.ts
// the types.
//
// The module touches no browser global at import time, so it is safe to import
// in Node, in workers and during server-side rendering.

/** Connection states reported to onState listeners. */
export const ConnectionState = Object.freeze({
  CONNECTING: 'connecting', // the first attempt is under way
  OPEN: 'open', // the server's welcome has arrived
  RECONNECTING: 'reconnecting', // lost: waiting for the next attempt, or making it
  CLOSED: 'closed', // close() was called; nothing more happens
});

/** WebSocket close codes the server uses (docs/protocol.md). */
export const CloseCode = Object.freeze({
  NORMAL: 1000,
  UNSUPPORTED: 1003,
  POLICY: 1008,
  TOO_BIG: 1009,
  SERVICE_RESTART: 1012,
  TOKEN_EXPIRED: 4001,
});

const MAX_QUERY_IDS = 500;
// v2, large teams: ids per watch frame, users watched per connection; the
// watches sent again on a new connection go 100 ids (10 rate tokens) per
// 600 ms, under the server's 20 tokens a second.
const MAX_WATCH_IDS = 500;
const MAX_WATCHED = 2000;
const REWATCH_BATCH = 100;
const REWATCH_EVERY_MS = 600;
const DEFAULTS = Object.freeze({
  device: 'web',
  heartbeatJitter: [0.7, 1.0],
  reconnectBaseMs: 1000,
  reconnectMaxMs: 30000,
  stableAfterMs: 10000,
  restartJitterMs: 1000,
  queryTimeoutMs: 10000,
  idleAfterMs: 5 * 60 * 1000,
});

const ACTIVITY_EVENTS = ['mousemove', 'mousedown', 'keydown', 'touchstart', 'wheel', 'scroll', 'pointerdown'];

/**
 * A connection to a greendot server that keeps itself alive: it heartbeats
 * with jitter, reconnects with backoff and keeps a local map of the presence
 * of every user who shares a team with the viewer.
 */
export class GreendotClient {
  /** @param {object} [options] ClientOptions in greendot.d.ts */
  constructor(options = {}) {
    const o = { ...DEFAULTS, ...options };
    this._WebSocket = o.WebSocket ?? globalThis.WebSocket;
    if (typeof this._WebSocket !== 'function') {
      throw new TypeError('greendot: no WebSocket here; pass one as the WebSocket option (in Node 20: import { WebSocket } from "ws")');
    }
    if (o.token != null && typeof o.token !== 'string' && typeof o.token !== 'function') {
      throw new TypeError('greendot: token must be a string or a function returning one');
    }
    const [jlo, jhi] = o.heartbeatJitter;
    if (!(jlo > 0 && jlo <= jhi && jhi <= 1)) {
      throw new RangeError('greendot: heartbeatJitter must be [lo, hi] with 0 < lo <= hi <= 1');
    }
    if (!(o.reconnectBaseMs > 0 && o.reconnectMaxMs >= o.reconnectBaseMs)) {
      throw new RangeError('greendot: need 0 < reconnectBaseMs <= reconnectMaxMs');
    }
    this._url = connectURL(o.url);
    this._device = o.device;
    this._token = o.token;
    this._user = o.user;
    this._jitter = [jlo, jhi];
    this._baseMs = o.reconnectBaseMs;
    this._maxMs = o.reconnectMaxMs;
    this._stableAfterMs = o.stableAfterMs;
    this._restartJitterMs = o.restartJitterMs;
    this._queryTimeoutMs = o.queryTimeoutMs;
    this._random = o.random ?? Math.random;
    this._idleAfterMs = o.idleAfterMs;
    this._idleOption = o.idle ?? 'auto';

    this._listeners = { change: new Set(), state: new Set(), error: new Set(), myStatus: new Set(), teamCounts: new Set() };
    this._presence = new Map(); // user id → { userId, state, version, at }
    this._queries = new Map(); // query id → { frame, resolve, reject, timer }
    this._querySeq = 0;
    this._heartbeatSeq = 0;

    this._state = ConnectionState.CLOSED;
    this._ws = null;
    this._generation = 0; // bumps on every attempt: stale socket events are ignored
    this._attempt = 0; // consecutive failed attempts, for the backoff
    // Times of the connection's own (silence, stability, restart advice) are
    // monotonic(), so a step of the wall clock can neither drop a healthy
    // connection nor keep a dead one. Presence times (`at`) are Unix ms.
    this._openedAt = 0;
    this._lastFrameAt = 0;
    this._probeAt = 0; // first ack request since the latest frame; 0 when none
    this._restartAt = 0; // from a reconnect frame: when to come back
    this._heartbeatTimer = null;
    this._reconnectTimer = null;
    this._restartTimer = null; // leaves by itself should a drain not close the socket
    this._wanted = false; // between connect() and close()

    this._manualStatus = 'online';
    this._idle = false;
    this._sentStatus = 'online'; // what the server believes for this connection
    this._idleCleanup = null;

    this._myStatus = null; // the user's status from the last my_status (v2)
    this._watched = new Set(); // users watched (v2), watched again on every new connection
    this._teamCounts = new Map(); // team id → { teamId, memberCount, onlineCount }
    this._rewatchTimer = null;
    this._pendingUserStatus = null; // a set_status asked for while not open

    this.userId = null;
    this.connectionId = null;
    this.heartbeatIntervalMs = null;
    this.ttlMs = null;
  }

  /** The connection state: connecting, open, reconnecting or closed. */
  get state() { return this._state; }

  /** The status this device reports: 'away' when set away or idle, else 'online'. */
  get status() { return this._manualStatus === 'away' || this._idle ? 'away' : 'online'; }

  /** Starts connecting (once; later calls do nothing until close()). Returns this. */
  connect() {
    if (this._wanted) return this;
    this._wanted = true;
    this._attempt = 0;
    this._startIdleDetection();
    this._setState(ConnectionState.CONNECTING, {});
    this._dial();
    return this;
  }

  /** Closes the connection for good: no reconnect, pending queries rejected. */
  close() {
    if (!this._wanted) return;
    this._wanted = false;
    this._generation++;
    clearTimeout(this._reconnectTimer);
    clearTimeout(this._heartbeatTimer);
    clearTimeout(this._restartTimer);
    clearTimeout(this._rewatchTimer);
    this._reconnectTimer = this._heartbeatTimer = this._restartTimer = this._rewatchTimer = null;
    if (this._idleCleanup) { this._idleCleanup(); this._idleCleanup = null; }
    const ws = this._ws;
    this._ws = null;
    if (ws) { detach(ws); try { ws.close(CloseCode.NORMAL, 'client closed'); } catch { /* already closing */ } }
    for (const [id, q] of this._queries) {
      clearTimeout(q.timer);
      q.reject(new Error('greendot: client closed'));
      this._queries.delete(id);
    }
    this._setState(ConnectionState.CLOSED, {});
  }

  /** The presence of one user as last heard, or undefined. */
  get(userId) {
    const p = this._presence.get(userId);
    return p && { ...p };
  }

  /** Every user whose presence this client holds (offline ones included until the next snapshot). */
  all() {
    return [...this._presence.values()].map((p) => ({ ...p }));
  }

  /**
   * The user's own status as the server last told it (my_status):
   * { mode, text, emoji, expiresAt, version }, or null until it has (it does
   * right after welcome only when the status is not the default).
   */
  get myStatus() { return this._myStatus && { ...this._myStatus }; }

  /** cb(status) runs whenever the server tells the user's status. Returns an unsubscribe function. */
  onMyStatus(cb) { return this._on('myStatus', cb); }

  /** cb(changes) runs with an array of applied changes. Returns an unsubscribe function. */
  onChange(cb) { return this._on('change', cb); }

  /** cb(state, info) runs on every connection state change. Returns an unsubscribe function. */
  onState(cb) { return this._on('state', cb); }

  /** cb(error) runs on error frames from the server and on failed attempts. Returns an unsubscribe function. */
  onError(cb) { return this._on('error', cb); }

  /**
   * setStatus('online' | 'away') marks this device active or idle; kept across
   * reconnects.
   *
   * setStatus({ mode, text, emoji, expiresAt }) sets the user's status (v2) on
   * every device: mode 'auto' | 'dnd' | 'invisible', an optional text (at most
   * 100 characters) and emoji (at most 32 bytes), and expiresAt (ms, or a
   * Date, in the future) or null. It replaces the previous one whole. Every
   * connection of the user then learns it (myStatus, onMyStatus); a refusal
   * by the server comes as onError with code 'bad_request'. Sent at once when
   * open, else with the next connection.
   */
  setStatus(state) {
    if (state !== null && typeof state === 'object') return this._setUserStatus(state);
    if (state !== 'online' && state !== 'away') {
      throw new RangeError(`greendot: status must be "online" or "away", not ${JSON.stringify(state)}`);
    }
    this._manualStatus = state;
    this._syncStatus();
  }

  _setUserStatus({ mode = 'auto', text = '', emoji = '', expiresAt = null } = {}) {
    if (!['auto', 'dnd', 'invisible'].includes(mode)) {
      throw new RangeError(`greendot: status mode must be "auto", "dnd" or "invisible", not ${JSON.stringify(mode)}`);
    }
    if (typeof text !== 'string' || typeof emoji !== 'string') throw new TypeError('greendot: status text and emoji must be strings');
    if ([...text].length > 100) throw new RangeError('greendot: status text must be at most 100 characters');
    if (new TextEncoder().encode(emoji).length > 32) throw new RangeError('greendot: status emoji must be at most 32 bytes');
    const ms = expiresAt instanceof Date ? expiresAt.getTime() : expiresAt;
    if (ms !== null && !(Number.isInteger(ms) && ms > Date.now())) {
      throw new RangeError('greendot: status expiresAt must be a future time (ms or Date) or null');
    }
    const frame = { type: 'set_status', mode, text, emoji, expires_at: ms };
    if (this._state === ConnectionState.OPEN && this._send(frame)) {
      this._pendingUserStatus = null;
      return;
    }
    this._pendingUserStatus = frame;
  }

  /**
   * Asks the server for the full presence of up to 500 users. Resolves with
   * the query_result users (camelCased); waits for the connection if needed.
   */
  query(userIds) {
    if (!Array.isArray(userIds) || userIds.some((u) => typeof u !== 'string')) {
      return Promise.reject(new TypeError('greendot: query takes an array of user ids'));
    }
    if (userIds.length > MAX_QUERY_IDS) {
      return Promise.reject(new RangeError(`greendot: a query takes at most ${MAX_QUERY_IDS} user ids`));
    }
    if (!this._wanted) return Promise.reject(new Error('greendot: client is not connected; call connect() first'));
    const id = `q${++this._querySeq}`;
    return new Promise((resolve, reject) => {
      const frame = { type: 'query', id, user_ids: userIds };
      const timer = setTimeout(() => {
        this._queries.delete(id);
        reject(new Error(`greendot: query ${id} timed out after ${this._queryTimeoutMs} ms`));
      }, this._queryTimeoutMs);
      this._queries.set(id, { frame, resolve, reject, timer });
      if (this._state === ConnectionState.OPEN) this._send(frame);
      // Otherwise it is sent when the next welcome arrives.
    });
  }

  /**
   * Watches users of large teams (v2): up to 500 ids a call, 2000 in all.
   * Resolves with their presence now, like query(); their changes then come
   * through onChange and get(). Watched again after every reconnect.
   */
  watch(userIds) {
    if (!Array.isArray(userIds) || userIds.some((u) => typeof u !== 'string')) {
      return Promise.reject(new TypeError('greendot: watch takes an array of user ids'));
    }
    if (userIds.length > MAX_WATCH_IDS) {
      return Promise.reject(new RangeError(`greendot: a watch takes at most ${MAX_WATCH_IDS} user ids`));
    }
    const fresh = new Set(userIds.filter((u) => !this._watched.has(u)));
    if (this._watched.size + fresh.size > MAX_WATCHED) {
      return Promise.reject(new RangeError(`greendot: a connection watches at most ${MAX_WATCHED} users; unwatch some first`));
    }
    if (!this._wanted) return Promise.reject(new Error('greendot: client is not connected; call connect() first'));
    for (const u of userIds) this._watched.add(u);
    return this._request('w', (id) => ({ type: 'watch', id, user_ids: userIds }));
  }

  /** Stops watching users (up to 500 ids a call). */
  unwatch(userIds) {
    if (!Array.isArray(userIds) || userIds.some((u) => typeof u !== 'string')) {
      throw new TypeError('greendot: unwatch takes an array of user ids');
    }
    if (userIds.length > MAX_WATCH_IDS) {
      throw new RangeError(`greendot: an unwatch takes at most ${MAX_WATCH_IDS} user ids`);
    }
    for (const u of userIds) this._watched.delete(u);
    if (this._state === ConnectionState.OPEN && userIds.length > 0) this._send({ type: 'unwatch', user_ids: userIds });
  }

  /** The users watched, sorted. */
  get watched() { return [...this._watched].sort(); }

  /** The counts of the viewer's large teams, as the server last told them, sorted by team. */
  get teamCounts() {
    return [...this._teamCounts.values()].sort((a, b) => (a.teamId < b.teamId ? -1 : a.teamId > b.teamId ? 1 : 0)).map((c) => ({ ...c }));
  }

  /** Calls cb with the teams of each team_counts frame. Returns an unsubscribe function. */
  onTeamCounts(cb) { return this._on('teamCounts', cb); }

  // _request sends a frame with an id and resolves with its answer's users;
  // it is sent again on the next connection if this one ends first.
  _request(prefix, make, again = false) {
    const id = `${prefix}${++this._querySeq}`;
    return new Promise((resolve, reject) => {
      const frame = make(id);
      const timer = setTimeout(() => {
        this._queries.delete(id);
        reject(new Error(`greendot: ${frame.type} ${id} timed out after ${this._queryTimeoutMs} ms`));
      }, this._queryTimeoutMs);
      this._queries.set(id, { frame, resolve, reject, timer, again });
      if (this._state === ConnectionState.OPEN) this._send(frame);
    });
  }

  _rewatch() {
    clearTimeout(this._rewatchTimer);
    this._rewatchTimer = null;
    const ids = this.watched;
    const gen = this._generation;
    const step = (start) => {
      if (gen !== this._generation || this._state !== ConnectionState.OPEN || start >= ids.length) return;
      const batch = ids.slice(start, start + REWATCH_BATCH).filter((u) => this._watched.has(u));
      if (batch.length > 0) {
        this._request('w', (id) => ({ type: 'watch', id, user_ids: batch }), true).catch(() => { /* the next connection tries again */ });
      }
      this._rewatchTimer = setTimeout(() => step(start + REWATCH_BATCH), REWATCH_EVERY_MS);
    };
    step(0);
  }

  // ——— connection ———

  async _dial() {
    const gen = ++this._generation;
    let token;
    if (typeof this._token === 'function') {
      try {
        token = await this._token();
      } catch (err) {
        if (gen !== this._generation || !this._wanted) return;
        this._emitError({ code: 'token', message: `token function failed: ${err?.message ?? err}`, cause: err });
        this._scheduleReconnect(this._backoffDelay(), { reason: 'token function failed' });
        return;
      }
      if (gen !== this._generation || !this._wanted) return;
    } else {
      token = this._token;
    }
    const url = new URL(this._url);
    url.searchParams.set('device', this._device);
    if (token) url.searchParams.set('token', token);
    if (this._user != null && !token) url.searchParams.set('user', this._user);

    let ws;
    try {
      ws = new this._WebSocket(url.toString());
    } catch (err) {
      this._emitError({ code: 'connect', message: `cannot open ${url.origin}: ${err?.message ?? err}`, cause: err });
      this._scheduleReconnect(this._backoffDelay(), { reason: 'cannot open' });
      return;
    }
    this._ws = ws;
    this._restartAt = 0;
    clearTimeout(this._restartTimer);
    this._restartTimer = null;
    ws.onmessage = (ev) => { if (gen === this._generation) this._onMessage(ev.data); };
    ws.onclose = (ev) => { if (gen === this._generation) this._onClose(ev.code, ev.reason); };
    ws.onerror = () => { /* a close event always follows */ };
  }

  _onMessage(data) {
    this._lastFrameAt = monotonic();
    if (typeof data !== 'string') {
      if (typeof Buffer !== 'undefined' && Buffer.isBuffer?.(data)) data = data.toString('utf8');
      else return; // the protocol has text frames only
    }
    let f;
    try { f = JSON.parse(data); } catch { return; }
    if (!f || typeof f !== 'object') return;
    switch (f.type) {
      case 'welcome': return this._onWelcome(f);
      case 'snapshot': return this._onSnapshot(f.users ?? []);
      case 'presence': return this._applyChanges(f.changes ?? []);
      case 'query_result': return this._onQueryResult(f);
      case 'watch_result': return this._onWatchResult(f);
      case 'team_counts': return this._onTeamCounts(f);
      case 'reconnect': return this._onReconnectFrame(f);
      case 'error': return this._emitError({ code: f.code, message: f.message });
      case 'heartbeat_ack': return undefined;
      case 'my_status': return this._onMyStatus(f);
      default: return undefined; // newer servers may add frame types
    }
  }

  _onWelcome(f) {
    this.userId = f.user_id;
    this.connectionId = f.connection_id;
    this.heartbeatIntervalMs = f.heartbeat_interval_ms > 0 ? f.heartbeat_interval_ms : 10000;
    this.ttlMs = f.ttl_ms > 0 ? f.ttl_ms : this.heartbeatIntervalMs * 2.5;
    this._openedAt = monotonic();
    this._sentStatus = 'online'; // a new connection starts active
    this._setState(ConnectionState.OPEN, { userId: this.userId, connectionId: this.connectionId });
    this._syncStatus();
    if (this._pendingUserStatus && this._send(this._pendingUserStatus)) this._pendingUserStatus = null;
    for (const q of this._queries.values()) this._send(q.frame);
    this._scheduleHeartbeat();
    this._rewatch();
  }

  _onClose(code, reason) {
    const ws = this._ws;
    this._ws = null;
    if (ws) detach(ws);
    clearTimeout(this._heartbeatTimer);
    this._heartbeatTimer = null;
    clearTimeout(this._rewatchTimer);
    this._rewatchTimer = null;
    const wasOpen = this._state === ConnectionState.OPEN;
    if (!this._wanted) return;
    const now = monotonic();
    const stable = wasOpen && now - this._openedAt >= this._stableAfterMs;
    let delay;
    if (this._restartAt > 0 || code === CloseCode.SERVICE_RESTART) {
      // A draining node told us when to come back; otherwise spread a little.
      delay = this._restartAt > 0 ? Math.max(0, this._restartAt - now) : this._random() * this._restartJitterMs;
      this._attempt = 0;
    } else if (code === CloseCode.TOKEN_EXPIRED) {
      // Not a failure: fetch a fresh token (the function runs on every dial) and come back soon.
      this._attempt = 0;
      delay = this._random() * Math.min(this._baseMs, 250);
    } else if (code === CloseCode.POLICY) {
      // We misbehaved (or were taken for a flood): back off, never reset.
      delay = Math.max(this._baseMs * 4, this._backoffDelay());
    } else {
      if (stable) this._attempt = 0;
      delay = this._backoffDelay();
    }
    this._scheduleReconnect(Math.round(delay), { code, reason: reason || undefined });
  }

  _backoffDelay() {
    // Full jitter: uniform in [0, min(max, base·2^attempt)].
    const cap = Math.min(this._maxMs, this._baseMs * 2 ** Math.min(this._attempt, 30));
    this._attempt++;
    return Math.round(this._random() * cap);
  }

  _scheduleReconnect(delayMs, info) {
    clearTimeout(this._reconnectTimer);
    this._setState(ConnectionState.RECONNECTING, { ...info, delayMs, attempt: this._attempt });
    this._reconnectTimer = setTimeout(() => {
      this._reconnectTimer = null;
      if (this._wanted) this._dial();
    }, delayMs);
  }

  _onReconnectFrame(f) {
    const after = Math.max(0, Number(f.after_ms) || 0);
    const jitter = this._random() * Math.min(1000, Math.max(100, after / 10));
    this._restartAt = monotonic() + after + jitter;
    // The server closes with 1012 next. Should it not, leave by ourselves in time.
    const ws = this._ws;
    const gen = this._generation;
    clearTimeout(this._restartTimer);
    this._restartTimer = setTimeout(() => {
      this._restartTimer = null;
      if (gen === this._generation && this._ws === ws && ws) {
        try { ws.close(CloseCode.NORMAL, 'reconnect advised'); } catch { /* closing */ }
        this._onClose(CloseCode.SERVICE_RESTART, 'reconnect advised');
      }
    }, after + jitter + 2000);
  }

  // ——— heartbeats ———

  _scheduleHeartbeat() {
    clearTimeout(this._heartbeatTimer);
    const [lo, hi] = this._jitter;
    const gap = this.heartbeatIntervalMs * (lo + (hi - lo) * this._random());
    const gen = this._generation;
    this._heartbeatTimer = setTimeout(() => {
      if (gen !== this._generation || this._state !== ConnectionState.OPEN) return;
      // A server that answered no ack request for a ttl and an interval is
      // gone. Only an unanswered request counts: a timer the browser held
      // back (a background tab) must not drop a healthy connection.
      const now = monotonic();
      if (this._probeAt && this._lastFrameAt >= this._probeAt) this._probeAt = 0;
      if (this._probeAt && now - this._probeAt > this.ttlMs + this.heartbeatIntervalMs) {
        const ws = this._ws;
        try { ws?.close(4000, 'server silent'); } catch { /* closing */ }
        this._onClose(1006, 'server silent');
        return;
      }
      // Ask for an ack (an id) only after half a ttl of quiet: the ack is a
      // liveness probe, and answering every heartbeat costs the server a write.
      if (now - this._lastFrameAt >= this.ttlMs / 2) {
        if (!this._probeAt) this._probeAt = now;
        this._send({ type: 'heartbeat', id: ++this._heartbeatSeq });
      } else {
        this._send({ type: 'heartbeat' });
      }
      this._scheduleHeartbeat();
    }, gap);
  }

  _send(frame) {
    const ws = this._ws;
    if (!ws || ws.readyState !== 1) return false;
    try { ws.send(JSON.stringify(frame)); return true; } catch { return false; }
  }

  // ——— presence map ———

  _onSnapshot(users) {
    const seen = new Set();
    const changes = [];
    const now = Date.now();
    for (const u of users) {
      if (!u || typeof u.user_id !== 'string') continue;
      seen.add(u.user_id);
      const prev = this._presence.get(u.user_id);
      const next = { userId: u.user_id, state: u.state, version: u.version, at: prev?.state === u.state ? prev.at : now, ...shown(u) };
      this._presence.set(u.user_id, next);
      if (!prev || !sameLook(prev, next)) changes.push({ ...next, previous: prev?.state ?? null });
    }
    // A snapshot replaces: whoever it leaves out is offline. Their entries go, so
    // that versions restarting (a fresh single-node server) are accepted again.
    for (const [id, prev] of this._presence) {
      if (seen.has(id) || this._watched.has(id)) continue; // watched users are not in snapshots
      this._presence.delete(id);
      if (prev.state !== 'offline') changes.push({ userId: id, state: 'offline', version: prev.version, at: now, previous: prev.state });
    }
    this._emitChanges(changes);
  }

  _applyChanges(list) {
    const changes = [];
    for (const c of list) {
      if (!c || typeof c.user_id !== 'string' || typeof c.version !== 'number') continue;
      const prev = this._presence.get(c.user_id);
      if (prev && !(c.version > prev.version)) continue; // not newer: drop
      const next = { userId: c.user_id, state: c.state, version: c.version, at: c.at ?? Date.now(), ...shown(c) };
      this._presence.set(c.user_id, next);
      changes.push({ ...next, previous: prev?.state ?? null });
    }
    this._emitChanges(changes);
  }

  _onMyStatus(f) {
    if (this._myStatus && !(f.version >= this._myStatus.version)) return; // older: drop
    this._myStatus = { mode: f.mode, text: f.text ?? '', emoji: f.emoji ?? '', expiresAt: f.expires_at ?? null, version: f.version };
    this._emit('myStatus', { ...this._myStatus });
  }

  _onWatchResult(f) {
    const q = this._queries.get(f.id);
    if (!q) return;
    this._queries.delete(f.id);
    clearTimeout(q.timer);
    const users = f.users ?? [];
    const list = [];
    for (const u of users) {
      if (!u || u.state === 'unknown' || u.user_id === this.userId || typeof u.version !== 'number') continue;
      if (q.again) {
        // Watched again on a new connection: a fresh read, whatever the
        // versions held (a restarted server may count from 1 again).
        const prev = this._presence.get(u.user_id);
        if (prev && sameLook(prev, { state: u.state, ...shown(u) })) { prev.version = u.version; continue; }
        if (prev) prev.version = -1;
      }
      list.push({ ...u, at: u.since ?? undefined });
    }
    this._applyChanges(list);
    q.resolve(users.map(userPresence));
  }

  _onTeamCounts(f) {
    const teams = [];
    for (const t of f.teams ?? []) {
      if (!t || typeof t.team_id !== 'string') continue;
      const c = { teamId: t.team_id, memberCount: t.member_count, onlineCount: t.online_count };
      this._teamCounts.set(c.teamId, c);
      teams.push({ ...c });
    }
    if (teams.length > 0) this._emit('teamCounts', teams);
  }

  _onQueryResult(f) {
    const q = this._queries.get(f.id);
    if (!q) return;
    this._queries.delete(f.id);
    clearTimeout(q.timer);
    q.resolve((f.users ?? []).map(userPresence));
  }

  // ——— status and idle detection ———

  _syncStatus() {
    const want = this.status;
    if (this._state !== ConnectionState.OPEN || want === this._sentStatus) return;
    if (this._send({ type: 'status', state: want })) this._sentStatus = want;
  }

  _startIdleDetection() {
    const opt = this._idleOption;
    if (opt === false || this._idleCleanup) return;
    const env = typeof opt === 'object' && opt !== null ? opt : {
      window: globalThis.window,
      document: globalThis.document,
    };
    const win = env.window;
    const doc = env.document;
    if (!win || !doc || typeof win.addEventListener !== 'function') {
      if (opt === true) throw new Error('greendot: idle detection needs window and document');
      return; // 'auto' outside a browser: nothing to watch
    }
    let lastActivity = monotonic();
    let timer = null;
    const setIdle = (idle) => {
      if (this._idle === idle) return;
      this._idle = idle;
      this._syncStatus();
    };
    const check = () => {
      timer = null;
      if (doc.hidden) return setIdle(true);
      const left = this._idleAfterMs - (monotonic() - lastActivity);
      if (left <= 0) return setIdle(true);
      timer = setTimeout(check, left);
    };
    const arm = () => { if (!timer) timer = setTimeout(check, this._idleAfterMs - (monotonic() - lastActivity)); };
    const onActivity = () => {
      lastActivity = monotonic();
      if (!doc.hidden) setIdle(false);
      arm();
    };
    const onVisibility = () => {
      if (doc.hidden) {
        setIdle(true);
      } else {
        onActivity();
      }
    };
    const opts = { capture: true, passive: true };
    for (const ev of ACTIVITY_EVENTS) win.addEventListener(ev, onActivity, opts);
    doc.addEventListener('visibilitychange', onVisibility);
    if (doc.hidden) setIdle(true);
    arm();
    this._idleCleanup = () => {
      clearTimeout(timer);
      for (const ev of ACTIVITY_EVENTS) win.removeEventListener(ev, onActivity, opts);
      doc.removeEventListener('visibilitychange', onVisibility);
      this._idle = false;
    };
  }

  // ——— events ———

  _on(name, cb) {
    if (typeof cb !== 'function') throw new TypeError('greendot: listener must be a function');
    this._listeners[name].add(cb);
    return () => { this._listeners[name].delete(cb); };
  }

  _emit(name, ...args) {
    for (const cb of [...this._listeners[name]]) {
      try { cb(...args); } catch (err) { reportListenerError(err); }
    }
  }

  _emitChanges(changes) { if (changes.length) this._emit('change', changes); }

  _emitError(err) { this._emit('error', err); }

  _setState(state, info) {
    const prev = this._state;
    // The first attempt is 'connecting'; every attempt after a loss stays 'reconnecting'.
    if (prev === state && state !== ConnectionState.RECONNECTING) return;
    this._state = state;
    this._emit('state', state, { ...info, previous: prev });
  }
}

/** Creates a client and connects it: `const gd = connect({ user: 'alice' })`. */
export function connect(options) {
  return new GreendotClient(options).connect();
}

// monotonic is a clock that no wall-clock step moves: performance.now() where
// there is one (browsers, workers, Node), else Date.now().
function monotonic() {
  const p = globalThis.performance;
  return p && typeof p.now === 'function' ? p.now() : Date.now();
}

function userPresence(u) {
  const out = { userId: u.user_id, state: u.state };
  if (u.connection_count !== undefined) out.connectionCount = u.connection_count;
  if (u.devices !== undefined) out.devices = u.devices;
  if (u.last_seen !== undefined) out.lastSeen = u.last_seen;
  if (u.version !== undefined) out.version = u.version;
  if (u.state !== 'unknown') Object.assign(out, shown(u));
  return out;
}

// shown is the v2 status fields of an entry, camelCased: text, emoji and
// expiresAt (null when unset), since and, for offline, lastSeen.
function shown(u) {
  const out = { text: u.text ?? null, emoji: u.emoji ?? null, expiresAt: u.expires_at ?? null, since: u.since ?? null };
  if (u.state === 'offline' && u.last_seen !== undefined) out.lastSeen = u.last_seen;
  return out;
}

function sameLook(a, b) {
  return a.state === b.state && a.text === b.text && a.emoji === b.emoji && a.expiresAt === b.expiresAt;
}

// connectURL turns what the caller gave (nothing, a page origin, http(s) or
// ws(s) URL, with or without the path) into the ws(s)://…/v1/connect URL.
function connectURL(given) {
  const loc = globalThis.location;
  let u;
  if (given == null || given === '') {
    if (!loc?.host) throw new TypeError('greendot: url is required outside a browser page');
    u = new URL(loc.href);
    u.search = '';
    u.hash = '';
    u.pathname = '/';
  } else {
    u = new URL(String(given), loc?.href);
  }
  if (u.protocol === 'http:') u.protocol = 'ws:';
  else if (u.protocol === 'https:') u.protocol = 'wss:';
  else if (u.protocol !== 'ws:' && u.protocol !== 'wss:') throw new TypeError(`greendot: unsupported url scheme ${u.protocol}`);
  if (!u.pathname.endsWith('/v1/connect')) u.pathname = u.pathname.replace(/\/+$/, '') + '/v1/connect';
  return u.toString();
}

function detach(ws) {
  ws.onmessage = ws.onclose = null;
  ws.onerror = () => {}; // a late error must not become an unhandled 'error' event
}

function reportListenerError(err) {
  // A listener's bug must not break the client nor the other listeners.
  if (typeof globalThis.reportError === 'function') globalThis.reportError(err);
  else console.error('greendot: a listener threw', err);
}
