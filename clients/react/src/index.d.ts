// Type declarations for greendot-react (index.js).

import type { HTMLAttributes, ReactElement, ReactNode } from 'react';
import type {
  ClientOptions, ConnectionStateName, GreendotClient, PresenceState, WebSocketConstructor,
} from 'greendot-client';

/** The body of GET /v1/teams/{team}/presence. */
export interface TeamPresenceBody {
  team_id: string;
  member_count: number;
  online: Array<{ user_id: string; state: PresenceState; version: number }>;
}

/**
 * Fetches one team's presence. The default is GET {apiUrl}/v1/teams/{team}/presence;
 * give your own when that route needs the API key (call your backend instead).
 */
export type FetchTeam = (teamId: string, init: { signal: AbortSignal }) => TeamPresenceBody | Promise<TeamPresenceBody>;

interface ProviderCommon {
  /** Base URL of the HTTP API for useTeam; by default derived from url (none with client). */
  apiUrl?: string;
  /** Replaces the default GET of the team presence route. */
  fetchTeam?: FetchTeam;
  children?: ReactNode;
}

/** The provider makes, connects and (on unmount) closes its own client. */
export interface ProviderWithOptions extends ProviderCommon {
  client?: undefined;
  /** ws(s)://, http(s):// or a path; the page's origin when left out. A change makes a new client. */
  url?: string | URL;
  /** A JWT or a function giving one; read again at every (re)connect. */
  token?: string | (() => string | Promise<string>);
  /** Dev mode only (no --jwt-secret): the user id. A change makes a new client. */
  user?: string;
  device?: string;
  WebSocket?: WebSocketConstructor;
  /** Every other client option; read once, when the client is made. */
  options?: Omit<ClientOptions, 'url' | 'token' | 'user' | 'device' | 'WebSocket'>;
}

/** The provider uses this client; the caller connects and closes it. */
export interface ProviderWithClient extends ProviderCommon {
  client: GreendotClient;
  url?: undefined;
  token?: undefined;
  user?: undefined;
  device?: undefined;
  WebSocket?: undefined;
  options?: undefined;
}

export type GreendotProviderProps = ProviderWithOptions | ProviderWithClient;

export declare function GreendotProvider(props: GreendotProviderProps): ReactElement;

/** The provider's client (setStatus, query, onError…). */
export declare function useGreendot(): GreendotClient;

/** 'connecting' | 'open' | 'reconnecting' | 'closed', re-rendering on every change. */
export declare function useConnectionState(): ConnectionStateName;

/** One user's presence as the client holds it. Frozen; the same object until something changes. */
export interface UserPresenceSnapshot {
  userId: string;
  /** 'offline' as well for a user the client does not hold (offline, or not visible to the viewer). */
  state: PresenceState;
  /** The user's version; null for a user the client does not hold. */
  version: number | null;
  /** Unix ms of the change the client last applied (for snapshot entries: when the client learnt it); null when not held. */
  at: number | null;
  /**
   * With { lastSeen: true }, for an offline user only: Unix ms the user was last
   * known live, null when never seen or not visible to the viewer, undefined
   * until the server answered the query.
   */
  lastSeen?: number | null;
}

export interface UsePresenceOptions {
  /** Ask the server (one batched query frame) for the last_seen of the user while offline. */
  lastSeen?: boolean;
}

export declare function usePresence(userId: string, options?: UsePresenceOptions): UserPresenceSnapshot;

export interface TeamMember {
  userId: string;
  state: Exclude<PresenceState, 'offline'>;
  version: number;
}

export interface TeamPresence {
  teamId: string;
  /** Every member, offline ones included; null before the first answer. */
  memberCount: number | null;
  /** Members who are not offline, sorted by user id. */
  members: readonly TeamMember[];
  /** A fetch of the team route is under way. */
  loading: boolean;
  /** Why the last fetch failed; null after a good one. */
  error: Error | null;
  /** Fetches the team route again. */
  refresh(): void;
}

export declare function useTeam(teamId: string): TeamPresence;

export declare const DOT_COLORS: Readonly<Record<PresenceState, string>>;

export interface PresenceDotProps extends Omit<HTMLAttributes<HTMLSpanElement>, 'children'> {
  userId: string;
  /** The accessible name; default "<userId> is <state>". */
  label?: string | ((presence: UserPresenceSnapshot) => string);
  /** Diameter in px (default 10). */
  size?: number;
}

export declare function PresenceDot(props: PresenceDotProps): ReactElement;
