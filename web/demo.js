// The greendot demo page: join team "demo" as a user of your choice (dev mode),
// connect with the JS client and show the team's dots as they change.
//
// URL parameters: ?user=<id> (default: a random name), ?idle=<ms> (how long
// without input before this tab reports away; default 5 minutes).
//
// The roster lists you first, then every member by name, whatever their
// state, so rows never jump: the team's presence route names them all (the
// offline ones with their last-seen time), and the client's snapshot and
// changes add whoever the page sees change.

import { connect } from '/greendot.js';

const TEAM = 'demo';
const NAMES = ['alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'grace', 'heidi', 'ivan', 'judy',
  'mallory', 'niaj', 'olivia', 'peggy', 'rupert', 'sybil', 'trent', 'victor', 'walter', 'yara'];
const QUERY_EVERY_MS = 10000;

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const me = (params.get('user') || '').trim() || pick(NAMES);
const idleAfterMs = Number(params.get('idle')) > 0 ? Number(params.get('idle')) : 5 * 60 * 1000;

// Keep the chosen name in the address so that a reload stays the same user.
if (params.get('user') !== me) {
  params.set('user', me);
  history.replaceState(null, '', `?${params}`);
}
document.title = `${me} · greendot demo`;
$('name').value = me;
$('idle-after').textContent = formatDuration(idleAfterMs);
$('same').href = `/?${new URLSearchParams({ user: me })}`;

/** user id → { state, version, lastSeen, devices, connectionCount, text, emoji, expiresAt } */
const roster = new Map();
let client = null;
let everOpen = false;

function pick(list, avoid = new Set()) {
  const free = list.filter((n) => !avoid.has(n));
  if (free.length) return free[Math.floor(Math.random() * free.length)];
  return `${pick(list)}${Math.floor(Math.random() * 900 + 100)}`;
}

function showProblem(text) {
  const p = $('problem');
  p.textContent = text;
  p.hidden = !text;
}

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: body ? { 'content-type': 'application/json' } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  if (!res.ok) {
    let msg = `${res.status} ${res.statusText}`;
    try { msg = (await res.json()).error?.message || msg; } catch { /* not JSON */ }
    throw new Error(`${method} ${path}: ${msg}`);
  }
  return res.status === 204 ? null : res.json();
}

function entry(id) {
  let e = roster.get(id);
  if (!e) {
    e = { state: 'offline', version: 0, lastSeen: undefined, devices: [], connectionCount: 0 };
    roster.set(id, e);
  }
  return e;
}

// ——— rendering ———

function render() {
  const ul = $('roster');
  // By name only: a change of state never moves a row.
  const others = [...roster.keys()].filter((id) => id !== me).sort((a, b) => a.localeCompare(b));
  const ids = [me, ...others];
  // Reuse rows so that the dot's colour transition shows.
  const rows = new Map([...ul.children].map((li) => [li.dataset.user, li]));
  ids.forEach((id, i) => {
    let li = rows.get(id);
    if (!li) {
      li = document.createElement('li');
      li.dataset.user = id;
      li.innerHTML = '<span class="dot" aria-hidden="true"></span><span class="name"></span><span class="status"></span><span class="detail"></span>';
    }
    rows.delete(id);
    const state = id === me ? myState() : roster.get(id).state;
    li.dataset.state = state;
    li.querySelector('.name').textContent = id;
    if (id === me) {
      const you = document.createElement('span');
      you.className = 'you';
      you.textContent = ' (you)';
      li.querySelector('.name').append(you);
    }
    // textContent only: a status text is the user's, never markup.
    li.querySelector('.status').textContent = statusLine(id);
    li.querySelector('.detail').textContent = detail(id, state);
    li.title = `${id}: ${state}`;
    if (ul.children[i] !== li) ul.insertBefore(li, ul.children[i] ?? null);
  });
  for (const li of rows.values()) li.remove();
  const online = ids.filter((id) => (id === me ? myState() : roster.get(id).state) !== 'offline').length;
  $('count').textContent = `${online} of ${ids.length} here`;
  $('empty').hidden = others.length > 0;

  const mine = myState();
  $('me').dataset.state = mine;
  $('me-state').textContent = mine === 'invisible' ? 'invisible (offline to others)' : mine;
  const my = client?.myStatus;
  const line = my ? [my.emoji, my.text].filter(Boolean).join(' ') + (my.expiresAt ? ` · until ${clock(my.expiresAt)}` : '') : '';
  $('my-status').textContent = line;
  $('my-status').hidden = !line;
  const awayBtn = $('away');
  const manualAway = client?.status === 'away' && awayBtn.dataset.manual === 'away';
  awayBtn.setAttribute('aria-pressed', String(manualAway));
  awayBtn.textContent = manualAway ? 'I’m back' : 'Set me away';
}

function myState() {
  if (!client || client.state !== 'open') return 'offline';
  const mode = client.myStatus?.mode;
  if (mode === 'invisible') return 'invisible';
  if (mode === 'dnd') return 'dnd';
  return client.status;
}

/** The status text and emoji shown for id, with when it ends. */
function statusLine(id) {
  let s = roster.get(id);
  if (id === me) {
    const my = client?.myStatus;
    s = my && my.mode !== 'invisible' ? my : null;
  }
  if (!s) return '';
  const line = [s.emoji, s.text].filter(Boolean).join(' ');
  if (!line) return '';
  return s.expiresAt ? `${line} (until ${clock(s.expiresAt)})` : line;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
}

function detail(id, state) {
  const e = roster.get(id) ?? entry(id);
  if (state === 'offline') {
    if (e.lastSeen === null) return 'never seen';
    if (typeof e.lastSeen === 'number') return `last seen ${ago(e.lastSeen)}`;
    return 'offline';
  }
  const devices = e.devices?.length ? e.devices.join(', ') : '';
  return devices ? `${state} · ${devices}` : state;
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 5) return 'just now';
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `on ${new Date(ms).toLocaleDateString()}`;
}

function formatDuration(ms) {
  if (ms >= 60000 && ms % 60000 === 0) return `${ms / 60000} min`;
  if (ms >= 1000) return `${Number((ms / 1000).toFixed(1))} s`;
  return `${ms} ms`;
}

// ——— data ———

/**
 * Applies a state with its version; a version not newer than the one held is
 * dropped. Returns whether the page now holds that version.
 */
function applyState(id, state, version, u) {
  const e = entry(id);
  if (version !== undefined && e.version && version <= e.version) return version === e.version;
  e.state = state;
  if (version !== undefined) e.version = version;
  if (u) setShown(e, u.text, u.emoji, u.expires_at ?? u.expiresAt);
  return true;
}

function setShown(e, text, emoji, expiresAt) {
  e.text = text ?? null;
  e.emoji = emoji ?? null;
  e.expiresAt = expiresAt ?? null;
}

let queryTimer = null;
/**
 * Refreshes last-seen times and devices, soon (debounced), with a query over
 * the socket: it needs no API key, and answers only about teammates.
 */
function refreshDetails(delay = 300) {
  clearTimeout(queryTimer);
  queryTimer = setTimeout(async () => {
    queryTimer = null;
    const ids = [...roster.keys()];
    if (!ids.includes(me)) ids.push(me);
    try {
      const users = await client.query(ids.slice(0, 500));
      for (const u of users) {
        if (u.state === 'unknown') continue; // no longer a teammate
        const e = entry(u.userId);
        e.lastSeen = u.lastSeen;
        e.devices = u.devices ?? [];
        if (u.userId !== me && u.version !== undefined && u.version >= e.version) setShown(e, u.text, u.emoji, u.expiresAt);
        e.connectionCount = u.connectionCount ?? 0;
      }
      render();
    } catch (err) {
      console.warn('greendot demo: presence query failed', err);
    }
  }, delay);
}

/** Reads every member of the team: who is present, and when the others were last seen. */
async function loadTeam() {
  try {
    const team = await api('GET', `/v1/teams/${encodeURIComponent(TEAM)}/presence`);
    for (const u of team.online ?? []) if (u.user_id !== me) applyState(u.user_id, u.state, u.version, u);
    for (const u of team.offline ?? []) {
      // An answer older than a change the page already holds is dropped.
      if (u.user_id !== me && applyState(u.user_id, 'offline', u.version, u)) entry(u.user_id).lastSeen = u.last_seen;
    }
  } catch (err) {
    // With --api-key the route is closed to the page: the client's snapshot
    // and changes still fill the roster, offline members unnamed.
    console.warn('greendot demo: team presence failed', err);
  }
  render();
  refreshDetails(0);
}

async function start() {
  entry(me);
  render();
  try {
    await api('PUT', `/v1/teams/${encodeURIComponent(TEAM)}/members/${encodeURIComponent(me)}`);
  } catch (err) {
    showProblem(`Could not join team “${TEAM}”: ${err.message}. The demo needs a server in dev mode (no --api-key, no --jwt-secret).`);
  }

  client = connect({ user: me, device: 'web', idleAfterMs });
  client.onState((state, info) => {
    const conn = $('conn');
    conn.dataset.state = state;
    conn.textContent = state === 'reconnecting' && info.delayMs !== undefined
      ? `reconnecting (next try in ${(info.delayMs / 1000).toFixed(1)} s)`
      : state;
    if (state === 'reconnecting' && !everOpen && info.attempt >= 3) {
      showProblem('Cannot connect. The demo needs a server in dev mode (no --jwt-secret): is it running?');
    }
    if (state === 'open') {
      everOpen = true;
      showProblem('');
      loadTeam();
    }
    render();
  });
  client.onChange((changes) => {
    // Someone new: the team changed, and members who joined offline send no change.
    if (changes.some((c) => c.userId !== me && !roster.has(c.userId))) loadTeamSoon();
    for (const c of changes) {
      const e = entry(c.userId);
      // The client already dropped stale versions. A user a snapshot left out is
      // no longer held (version 0 here): a restarted server's versions start again.
      e.state = c.state;
      e.version = client.get(c.userId)?.version ?? 0;
      setShown(e, c.text, c.emoji, c.expiresAt);
      if (c.state === 'offline') e.lastSeen = c.at; // until the query brings the server's last_seen
    }
    render();
    refreshDetails();
  });
  client.onError((err) => {
    console.warn('greendot demo:', err.code, err.message);
    if (err.code === 'bad_request') showProblem(`The server refused that: ${err.message}`);
  });
  client.onMyStatus((s) => {
    // Another device (or the expiry) may have changed it: the form follows.
    $('mode').value = s.mode;
    $('text').value = s.text;
    $('emoji').value = s.emoji;
    render();
  });

  $('status').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const until = Number($('until').value);
    try {
      showProblem('');
      client.setStatus({
        mode: $('mode').value,
        text: $('text').value.trim(),
        emoji: $('emoji').value.trim(),
        expiresAt: until > 0 ? Date.now() + until : null,
      });
    } catch (err) {
      showProblem(err.message);
    }
  });
  $('clear-status').addEventListener('click', () => {
    $('mode').value = 'auto';
    $('text').value = '';
    $('emoji').value = '';
    $('until').value = '';
    client.setStatus({ mode: 'auto' });
  });

  $('away').addEventListener('click', () => {
    const btn = $('away');
    const goAway = btn.dataset.manual !== 'away';
    btn.dataset.manual = goAway ? 'away' : 'online';
    client.setStatus(goAway ? 'away' : 'online');
    render();
    refreshDetails();
  });
  // Relative times age, and idle detection changes this tab's status without a click.
  setInterval(render, 500);
  setInterval(loadTeam, QUERY_EVERY_MS); // members, last-seen times and devices
}

let teamTimer = null;
function loadTeamSoon() {
  if (teamTimer) return;
  teamTimer = setTimeout(() => { teamTimer = null; loadTeam(); }, 300);
}

$('who').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const name = $('name').value.trim();
  if (name && name !== me) location.search = `?${new URLSearchParams({ user: name })}`;
});

$('another').addEventListener('click', () => {
  const other = pick(NAMES, new Set([me, ...roster.keys()]));
  const q = new URLSearchParams({ user: other });
  if (params.get('idle')) q.set('idle', params.get('idle'));
  window.open(`/?${q}`, '_blank', 'noopener');
});

start();
