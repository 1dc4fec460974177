// The external stores behind the hooks: plain JavaScript, no React. One
// PresenceStore per GreendotClient turns the client's events into the
// subscribe/getSnapshot pairs that useSyncExternalStore wants:
//
// - getSnapshot must return the same object until something changed, so
//   snapshots are cached and rebuilt only when a value in them differs;
// - the store listens to the client only while someone listens to the store,
//   so unmounting the last hook leaves no listener on the client.

const MAX_QUERY_IDS = 500; // the server's limit per query frame

const stores = new WeakMap(); // GreendotClient → PresenceStore

/** The store of client, made on first use and shared by every provider of that client. */
export function storeFor(client) {
  let s = stores.get(client);
  if (!s) {
    s = new PresenceStore(client);
    stores.set(client, s);
  }
  return s;
}

export class PresenceStore {
  constructor(client) {
    this.client = client;
    this._users = new Map(); // user id → Set of listeners
    this._all = new Set(); // listeners to every change (team stores)
    this._snaps = new Map(); // user id → last snapshot returned, per lastSeen flag
    this._offChange = null;
    this._lastSeen = new Map(); // user id → { version, lastSeen } from a query
    this._lastSeenAsked = new Map(); // user id → version asked for, until answered
    this._inFlight = new Set(); // ids in a query not answered yet
    this._lastSeenTimer = null;
    this._offOpen = null; // set while waiting for the client to open, to query
    // fetchTeam → team id → TeamStore; a team store leaves when its last
    // listener does (and comes back if that listener subscribes again).
    this._teams = new Map();
  }

  // ——— users ———

  subscribeUser(userId, cb) {
    let set = this._users.get(userId);
    if (!set) this._users.set(userId, (set = new Set()));
    set.add(cb);
    this._attach();
    return () => {
      set.delete(cb);
      if (set.size === 0 && this._users.get(userId) === set) {
        this._users.delete(userId);
        this._snaps.delete(snapKey(userId, false));
        this._snaps.delete(snapKey(userId, true));
        this._lastSeen.delete(userId);
      }
      this._detachIfIdle();
    };
  }

  /**
   * The presence of userId as a frozen object that stays the same while
   * nothing in it changes. A user the client does not hold is offline (or not
   * visible to the viewer): state 'offline', version and at null. With
   * withLastSeen, an offline user's snapshot has lastSeen: a number or null
   * once a query answered (see requestLastSeen), undefined before.
   */
  getUser(userId, withLastSeen = false) {
    const p = this.client.get(userId);
    const next = {
      userId,
      state: p?.state ?? 'offline',
      version: p?.version ?? null,
      at: p?.at ?? null,
    };
    if (withLastSeen && next.state === 'offline') {
      const known = this._lastSeen.get(userId);
      next.lastSeen = known && known.version >= (next.version ?? 0) ? known.lastSeen : undefined;
    }
    const key = snapKey(userId, withLastSeen);
    const prev = this._snaps.get(key);
    if (prev && sameUser(prev, next)) return prev;
    const snap = Object.freeze(next);
    this._snaps.set(key, snap);
    return snap;
  }

  /**
   * Asks the server for the last_seen of an offline user, for the version the
   * client holds (null: not held). The ids asked in the same tick go in one
   * query frame (500 ids at most each); subscribers are told when it answers.
   */
  requestLastSeen(userId, version) {
    const v = version ?? 0;
    const known = this._lastSeen.get(userId);
    if (known && known.version >= v) return;
    if ((this._lastSeenAsked.get(userId) ?? -1) >= v) return; // already asked
    this._lastSeenAsked.set(userId, v);
    this._lastSeenTimer ??= setTimeout(() => this._queryLastSeen(), 0);
  }

  _queryLastSeen() {
    this._lastSeenTimer = null;
    if (this.client.state !== 'open') {
      // A query now would fail (client not connected yet) or wait; ask once it is open.
      this._offOpen ??= this.client.onState((state) => {
        if (state !== 'open') return;
        this._offOpen();
        this._offOpen = null;
        this._lastSeenTimer ??= setTimeout(() => this._queryLastSeen(), 0);
      });
      return;
    }
    const ids = [...this._lastSeenAsked.keys()].filter((id) => !this._inFlight.has(id));
    for (let i = 0; i < ids.length; i += MAX_QUERY_IDS) {
      const batch = ids.slice(i, i + MAX_QUERY_IDS);
      const sent = new Map();
      for (const id of batch) {
        this._inFlight.add(id);
        sent.set(id, this._lastSeenAsked.get(id));
      }
      const done = () => {
        let again = false;
        for (const id of batch) {
          this._inFlight.delete(id);
          // Asked again for a newer version meanwhile: that one still goes out.
          if (this._lastSeenAsked.get(id) === sent.get(id)) this._lastSeenAsked.delete(id);
          else again = true;
        }
        if (again) this._lastSeenTimer ??= setTimeout(() => this._queryLastSeen(), 0);
      };
      this.client.query(batch).then((users) => {
        done();
        for (const u of users) {
          // A user the viewer may not see has no lastSeen to show: null, until
          // the client holds a newer version of them.
          const entry = u.state === 'unknown'
            ? { version: this.client.get(u.userId)?.version ?? 0, lastSeen: null }
            : { version: u.version ?? 0, lastSeen: u.lastSeen ?? null };
          const known = this._lastSeen.get(u.userId);
          if (!known || known.version <= entry.version) this._lastSeen.set(u.userId, entry);
        }
        this._notify(batch);
      }, () => {
        // Lost the connection or timed out: asked again once the client is open.
        for (const id of batch) this._inFlight.delete(id);
        this._lastSeenTimer ??= setTimeout(() => this._queryLastSeen(), 0);
      });
    }
  }

  // ——— connection state ———

  subscribeConnection(cb) {
    return this.client.onState(() => cb());
  }

  getConnection() {
    return this.client.state;
  }

  // ——— every change (for team stores) ———

  subscribeAll(cb) {
    this._all.add(cb);
    this._attach();
    return () => {
      this._all.delete(cb);
      this._detachIfIdle();
    };
  }

  // ——— teams ———

  /** The TeamStore of teamId, shared by every useTeam of it while one is mounted. */
  team(teamId, fetchTeam) {
    let byFetch = this._teams.get(fetchTeam);
    if (!byFetch) this._teams.set(fetchTeam, (byFetch = new Map()));
    let t = byFetch.get(teamId);
    if (!t) {
      t = new TeamStore(this, teamId, fetchTeam);
      byFetch.set(teamId, t);
    }
    return t;
  }

  /** Listeners held on this store, for tests: 0 once every hook unmounted. */
  listenerCount() {
    let n = this._all.size;
    for (const set of this._users.values()) n += set.size;
    return n;
  }

  // ——— the client's events ———

  _attach() {
    if (this._offChange) return;
    this._offChange = this.client.onChange((changes) => {
      const ids = [];
      for (const c of changes) ids.push(c.userId);
      this._notify(ids);
      for (const cb of [...this._all]) cb(changes);
    });
  }

  _detachIfIdle() {
    if (this._users.size > 0 || this._all.size > 0 || !this._offChange) return;
    this._offChange();
    this._offChange = null;
    // Nobody left to show a lastSeen to: drop the asks not sent, and the wait for open.
    clearTimeout(this._lastSeenTimer);
    this._lastSeenTimer = null;
    this._offOpen?.();
    this._offOpen = null;
    for (const id of [...this._lastSeenAsked.keys()]) if (!this._inFlight.has(id)) this._lastSeenAsked.delete(id);
  }

  _notify(ids) {
    for (const id of ids) {
      const set = this._users.get(id);
      if (set) for (const cb of [...set]) cb();
    }
  }
}

function snapKey(userId, withLastSeen) {
  return withLastSeen ? `l:${userId}` : `p:${userId}`;
}

function sameUser(a, b) {
  return a.state === b.state && a.version === b.version && a.at === b.at && a.lastSeen === b.lastSeen;
}

/**
 * One team's presence: the server's GET /v1/teams/{team}/presence (through
 * fetchTeam), kept live with the client's changes. The route lists members
 * who are not offline; the client's changes update their states, drop those
 * who go offline, and a user coming online who is not listed makes it fetch
 * again (they may have joined, or come online, in this team).
 */
export class TeamStore {
  constructor(store, teamId, fetchTeam) {
    this.store = store;
    this.teamId = teamId;
    this.fetchTeam = fetchTeam;
    this._listeners = new Set();
    this._fetched = null; // { memberCount, online: Map id → { state, version } }
    this._error = null;
    this._loading = false;
    this._pending = false; // a fetch was asked for while one ran
    this._abort = null;
    this._offAll = null;
    this._offState = null;
    this._wasOpen = false;
    this._snap = null;
  }

  subscribe(cb) {
    this._listeners.add(cb);
    if (this._listeners.size === 1) {
      this._register(true);
      this._offAll = this.store.subscribeAll((changes) => this._onChanges(changes));
      // Fetch again whenever the client opens: a fetch made before the first
      // open misses the viewer, and after a reconnect the membership may have
      // changed unseen. refresh() queues it behind a fetch under way.
      this._wasOpen = this.store.client.state === 'open';
      this._offState = this.store.subscribeConnection(() => {
        const open = this.store.client.state === 'open';
        if (open && !this._wasOpen) this.refresh();
        this._wasOpen = open;
      });
      this.refresh();
    }
    return () => {
      this._listeners.delete(cb);
      if (this._listeners.size > 0) return;
      this._offAll();
      this._offState();
      this._offAll = this._offState = null;
      this._abort?.abort();
      this._abort = null;
      this._loading = false;
      this._pending = false;
      this._register(false);
    };
  }

  _register(on) {
    const teams = this.store._teams;
    let byFetch = teams.get(this.fetchTeam);
    if (on) {
      if (!byFetch) teams.set(this.fetchTeam, (byFetch = new Map()));
      if (!byFetch.has(this.teamId)) byFetch.set(this.teamId, this);
    } else if (byFetch?.get(this.teamId) === this) {
      byFetch.delete(this.teamId);
      if (byFetch.size === 0) teams.delete(this.fetchTeam);
    }
  }

  getSnapshot() {
    if (!this._snap) this._snap = this._build();
    return this._snap;
  }

  /** Fetches the team again (once more after the running fetch, if one runs). */
  refresh() {
    if (this._listeners.size === 0) return;
    if (this._loading) {
      this._pending = true;
      return;
    }
    this._loading = true;
    this._changed();
    const abort = new AbortController();
    this._abort = abort;
    let result;
    try {
      result = Promise.resolve(this.fetchTeam(this.teamId, { signal: abort.signal }));
    } catch (err) {
      result = Promise.reject(err);
    }
    result.then((body) => {
      if (abort.signal.aborted) return;
      this._fetched = parseTeam(this.teamId, body);
      this._error = null;
    }, (err) => {
      if (abort.signal.aborted) return;
      this._error = err instanceof Error ? err : new Error(String(err));
    }).finally(() => {
      if (abort.signal.aborted) return;
      this._abort = null;
      this._loading = false;
      if (this._pending) {
        this._pending = false;
        this.refresh();
        return;
      }
      this._changed();
    });
  }

  _onChanges(changes) {
    if (!this._fetched) return;
    let relevant = false;
    let refetch = false;
    for (const c of changes) {
      if (this._fetched.online.has(c.userId)) relevant = true;
      else if (c.state !== 'offline' && (c.previous === null || c.previous === 'offline')) refetch = true;
    }
    if (refetch) this.refresh();
    if (relevant) this._changed();
  }

  _changed() {
    this._snap = null;
    for (const cb of [...this._listeners]) cb();
  }

  // The fetched list, each member's state replaced by the client's when the
  // client holds a newer version; members the client knows went offline leave.
  _build() {
    const members = [];
    if (this._fetched) {
      for (const [userId, m] of this._fetched.online) {
        const live = this.store.client.get(userId);
        const cur = live && live.version > m.version ? live : m;
        if (cur.state === 'offline') continue;
        members.push(Object.freeze({ userId, state: cur.state, version: cur.version }));
      }
      members.sort((a, b) => (a.userId < b.userId ? -1 : a.userId > b.userId ? 1 : 0));
    }
    return Object.freeze({
      teamId: this.teamId,
      memberCount: this._fetched ? this._fetched.memberCount : null,
      members: Object.freeze(members),
      loading: this._loading,
      error: this._error,
    });
  }
}

function parseTeam(teamId, body) {
  if (!body || typeof body !== 'object' || typeof body.member_count !== 'number' || !Array.isArray(body.online)) {
    throw new Error(`greendot-react: team ${JSON.stringify(teamId)}: expected {"team_id","member_count","online":[…]}, got ${JSON.stringify(body)?.slice(0, 200)}`);
  }
  const online = new Map();
  for (const u of body.online) {
    if (u && typeof u.user_id === 'string') online.set(u.user_id, { state: u.state, version: u.version ?? 0 });
  }
  return { memberCount: body.member_count, online };
}

/**
 * The default fetchTeam: GET {apiUrl}/v1/teams/{team}/presence. An answer
 * other than 200 rejects with the server's error code and message.
 */
export function httpFetchTeam(apiUrl) {
  const base = String(apiUrl).replace(/\/+$/, '');
  return async (teamId, { signal } = {}) => {
    const url = `${base}/v1/teams/${encodeURIComponent(teamId)}/presence`;
    const res = await fetch(url, { signal, headers: { accept: 'application/json' } });
    const text = await res.text();
    if (res.status !== 200) {
      let detail = text.trim().slice(0, 200);
      try {
        const e = JSON.parse(text).error;
        if (e?.code) detail = `${e.code}: ${e.message}`;
      } catch { /* not JSON: keep the text */ }
      throw new Error(`greendot-react: GET ${url}: ${res.status} ${detail}`);
    }
    return JSON.parse(text);
  };
}

/**
 * The HTTP API's base URL for a client url as GreendotProvider takes it:
 * ws → http, wss → https, without the /v1/connect path. '' (same origin)
 * when no url is given.
 */
export function apiUrlFor(url) {
  if (url == null || url === '') return '';
  const loc = globalThis.location;
  const u = new URL(String(url), loc?.href);
  if (u.protocol === 'ws:') u.protocol = 'http:';
  else if (u.protocol === 'wss:') u.protocol = 'https:';
  u.pathname = u.pathname.replace(/\/v1\/connect\/?$/, '').replace(/\/+$/, '');
  u.search = '';
  u.hash = '';
  return u.toString().replace(/\/+$/, '');
}
