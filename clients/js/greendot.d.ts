// Type declarations for greendot.js, the JavaScript client of greendot (protocol v1, with the
// v2 status: dnd, invisible, text and emoji with an expiry).

/** A presence state as the server reports it ('dnd' from a v2 server). */
export type PresenceState = 'online' | 'away' | 'dnd' | 'offline';

/** The user-level status mode (v2): every device of the user. */
export type StatusMode = 'auto' | 'dnd' | 'invisible';

/** The user's status, as setStatus takes it. */
export interface UserStatusInput {
  mode: StatusMode;
  /** At most 100 characters of printable text. */
  text?: string;
  /** At most 32 bytes. */
  emoji?: string;
  /** Unix ms or a Date, in the future; null or absent for no expiry. */
  expiresAt?: number | Date | null;
}

/** The user's status as the server tells it (my_status). */
export interface MyStatus {
  mode: StatusMode;
  /** '' when unset. */
  text: string;
  emoji: string;
  /** Unix ms, or null. */
  expiresAt: number | null;
  /** The user's version at the change; older ones are dropped. */
  version: number;
}

/** What a device can say about itself. */
export type Status = 'online' | 'away';

/** Connection states reported to onState listeners. */
export type ConnectionStateName = 'connecting' | 'open' | 'reconnecting' | 'closed';

export declare const ConnectionState: Readonly<{
  CONNECTING: 'connecting';
  OPEN: 'open';
  RECONNECTING: 'reconnecting';
  CLOSED: 'closed';
}>;

export declare const CloseCode: Readonly<{
  NORMAL: 1000;
  UNSUPPORTED: 1003;
  POLICY: 1008;
  TOO_BIG: 1009;
  SERVICE_RESTART: 1012;
  TOKEN_EXPIRED: 4001;
}>;

/**
 * Anything constructed like the browser's WebSocket (the `ws` package's WebSocket fits).
 * The client sets onmessage (reads ev.data), onclose (reads ev.code, ev.reason) and onerror.
 */
export interface WebSocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onmessage: ((ev: any) => any) | null;
  onclose: ((ev: any) => any) | null;
  onerror: ((ev: any) => any) | null;
}
export type WebSocketConstructor = new (url: string) => WebSocketLike;

/** Browser globals the idle detector listens to (for tests or embedding). */
export interface IdleEnvironment {
  window: Pick<EventTarget, 'addEventListener' | 'removeEventListener'>;
  document: Pick<EventTarget, 'addEventListener' | 'removeEventListener'> & { readonly hidden: boolean };
}

export interface ClientOptions {
  /**
   * Server address: ws(s)://, http(s):// or a path, with or without `/v1/connect`.
   * Defaults to the page's own origin in a browser; required elsewhere.
   */
  url?: string | URL;
  /** Device kind sent as `?device=` (default "web"). */
  device?: string;
  /**
   * A JWT, or a function returning a (promise of a) fresh JWT. A function runs
   * before every connection attempt, so it can renew an expired token.
   */
  token?: string | (() => string | Promise<string>);
  /** Dev mode only (server without a JWT secret): the user id, sent as `?user=`. Ignored when a token is given. */
  user?: string;
  /** WebSocket constructor; defaults to `globalThis.WebSocket`. In Node 20 pass `ws`'s. */
  WebSocket?: WebSocketConstructor;
  /** Each heartbeat gap is uniform in [lo, hi] × heartbeat_interval_ms (default [0.7, 1.0]). */
  heartbeatJitter?: [number, number];
  /** Backoff base in ms (default 1000): attempt n waits uniform in [0, min(max, base·2^n)]. */
  reconnectBaseMs?: number;
  /** Backoff ceiling in ms (default 30000). */
  reconnectMaxMs?: number;
  /** A connection open this long (default 10000 ms) resets the backoff when it drops. */
  stableAfterMs?: number;
  /** Spread of reconnects after a 1012 close that came without a reconnect frame (default 1000 ms). */
  restartJitterMs?: number;
  /** How long query() waits for its result, connection included (default 10000 ms). */
  queryTimeoutMs?: number;
  /**
   * Idle detection: 'auto' (default) watches input and page visibility in a
   * browser and does nothing elsewhere; false turns it off; true requires a
   * browser; an IdleEnvironment supplies the targets to watch.
   */
  idle?: 'auto' | boolean | IdleEnvironment;
  /** No input for this long (default 5 minutes), or the page hidden, reports `away`. */
  idleAfterMs?: number;
  /** Source of randomness in [0, 1) for jitter (default Math.random). */
  random?: () => number;
}

/** One user's presence as this client holds it. */
export interface Presence {
  userId: string;
  state: PresenceState;
  /** Strictly increases with every change of this user; older ones are dropped. */
  version: number;
  /** Unix ms of the change (or when this client learnt it, for snapshot entries). */
  at: number;
  /** The status text and emoji shown, and when they end (v2); null when unset or invisible. */
  text: string | null;
  emoji: string | null;
  expiresAt: number | null;
  /** Unix ms the user entered this state (v2); null from a v1 server. */
  since: number | null;
  /** Offline entries of a v2 server: when the user was last seen. */
  lastSeen?: number | null;
}

/** An applied change, as given to onChange listeners. */
export interface PresenceChange extends Presence {
  /** The state held before, or null for a user not held. */
  previous: PresenceState | null;
}

/** A query result entry. A user who shares no team with the viewer has state 'unknown' only. */
export interface UserPresence {
  userId: string;
  state: PresenceState | 'unknown';
  connectionCount?: number;
  devices?: string[];
  /** Unix ms the user was last known live; null for a user never seen. */
  lastSeen?: number | null;
  version?: number;
  /** v2, absent for 'unknown'. */
  text?: string | null;
  emoji?: string | null;
  expiresAt?: number | null;
  since?: number | null;
}

/** v2: a large team's counts, from team_counts. */
export interface TeamCount {
  teamId: string;
  memberCount: number;
  /** Members not offline: online, away or dnd. */
  onlineCount: number;
}

export interface StateInfo {
  previous: ConnectionStateName;
  /** With 'reconnecting': how long until the next attempt. */
  delayMs?: number;
  /** With 'reconnecting': consecutive failed attempts so far. */
  attempt?: number;
  /** With 'reconnecting': the close code that ended the connection, if any. */
  code?: number;
  reason?: string;
  /** With 'open'. */
  userId?: string;
  connectionId?: string;
}

/** An error frame from the server, or a failed attempt ('token', 'connect'). */
export interface GreendotError {
  code: string;
  message: string;
  cause?: unknown;
}

export declare class GreendotClient {
  constructor(options?: ClientOptions);
  /** From the last welcome. */
  readonly userId: string | null;
  readonly connectionId: string | null;
  readonly heartbeatIntervalMs: number | null;
  readonly ttlMs: number | null;
  readonly state: ConnectionStateName;
  /** 'away' when set away or idle, else 'online'. */
  readonly status: Status;
  /** Starts connecting; returns this. */
  connect(): this;
  /** Closes for good: no reconnect, pending queries rejected. */
  close(): void;
  get(userId: string): Presence | undefined;
  all(): Presence[];
  onChange(cb: (changes: PresenceChange[]) => void): () => void;
  onState(cb: (state: ConnectionStateName, info: StateInfo) => void): () => void;
  onError(cb: (error: GreendotError) => void): () => void;
  /** The user's status from the last my_status, or null until the server has told one. */
  readonly myStatus: MyStatus | null;
  onMyStatus(cb: (status: MyStatus) => void): () => void;
  /** This device active or idle. */
  setStatus(state: Status): void;
  /** The user's status on every device (v2): replaces the previous one whole. */
  setStatus(status: UserStatusInput): void;
  query(userIds: string[]): Promise<UserPresence[]>;
  /**
   * v2, large teams: watches up to 500 users a call (2000 in all) and
   * resolves with their presence now, as query(); their changes then come
   * through onChange and get(). Watched again after every reconnect.
   */
  watch(userIds: string[]): Promise<UserPresence[]>;
  /** Stops watching users (up to 500 a call). */
  unwatch(userIds: string[]): void;
  /** The users watched, sorted. */
  readonly watched: string[];
  /** The counts of the viewer's large teams, as last told, sorted by team. */
  readonly teamCounts: TeamCount[];
  /** Called with the teams of each team_counts frame. */
  onTeamCounts(cb: (teams: TeamCount[]) => void): () => void;
}

/** Creates a client and connects it. */
export declare function connect(options?: ClientOptions): GreendotClient;
