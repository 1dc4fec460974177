// Typed usage of greendot-react, checked by `npm run typecheck` (tsc): what an
// app writes must compile, and the mistakes marked @ts-expect-error must not.

import { connect } from 'greendot-client';
import type { ConnectionStateName, PresenceState } from 'greendot-client';
import {
  DOT_COLORS, GreendotProvider, PresenceDot, useConnectionState, useGreendot, usePresence, useTeam,
} from 'greendot-react';
import type { FetchTeam, TeamMember, TeamPresence, UserPresenceSnapshot } from 'greendot-react';

function Member({ userId }: { userId: string }) {
  const p: UserPresenceSnapshot = usePresence(userId, { lastSeen: true });
  const state: PresenceState = p.state;
  const version: number | null = p.version;
  const seen: string = p.lastSeen == null ? 'now or never' : new Date(p.lastSeen).toISOString();
  return <li>{userId} {state} {version} {seen} <PresenceDot userId={userId} size={8} className="dot" /></li>;
}

function Roster({ teamId }: { teamId: string }) {
  const team: TeamPresence = useTeam(teamId);
  const conn: ConnectionStateName = useConnectionState();
  const client = useGreendot();
  if (team.error) return <p role="alert">{team.error.message}</p>;
  return (
    <section aria-busy={team.loading}>
      <p>{conn}: {team.members.length} of {team.memberCount ?? '?'} online</p>
      <button type="button" onClick={() => client.setStatus('away')}>away</button>
      <button type="button" onClick={team.refresh}>refresh</button>
      <ul>{team.members.map((m) => <Member key={m.userId} userId={m.userId} />)}</ul>
      <PresenceDot userId="bob" label={(p) => `Bob: ${p.state}`} style={{ outline: `1px solid ${DOT_COLORS.away}` }} />
    </section>
  );
}

const fetchTeam: FetchTeam = async (teamId, { signal }) =>
  (await fetch(`/api/teams/${encodeURIComponent(teamId)}/presence`, { signal })).json();

export const withOptions = (
  <GreendotProvider url="wss://presence.example.com" token={async () => 'jwt'} fetchTeam={fetchTeam} options={{ idleAfterMs: 60000 }}>
    <Roster teamId="eng" />
  </GreendotProvider>
);

const client = connect({ url: 'wss://presence.example.com', user: 'alice' });
export const withClient = (
  <GreendotProvider client={client} apiUrl="https://presence.example.com">
    <Roster teamId="eng" />
  </GreendotProvider>
);

// @ts-expect-error: client and url are exclusive
export const both = <GreendotProvider client={client} url="wss://x" />;

export function Mistakes() {
  // @ts-expect-error: a user id is a string
  usePresence(42);
  // @ts-expect-error: no such option
  usePresence('bob', { lastseen: true });
  // @ts-expect-error: a team member is never offline
  const offline: TeamMember['state'] = 'offline';
  // @ts-expect-error: userId is required
  return <PresenceDot size={3} />;
}
