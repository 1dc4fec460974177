// The backend of a Laravel-Echo-style app, in plain Node: it serves the
// page, the pusher-js and laravel-echo browser builds, and answers
// POST /broadcasting/auth (Echo's default endpoint) by signing with the
// `pusher` SDK, as Laravel's broadcasting routes do. The browser then talks
// to greendot directly, as it would to Pusher.
//
//   PUSHER_APP_ID=4242 PUSHER_APP_KEY=app-key PUSHER_APP_SECRET=app-secret \
//   PUSHER_HOST=127.0.0.1 PUSHER_PORT=8080 node example/server.js
//
// then open http://127.0.0.1:8000/?user=alice&name=Alice. The query stands
// in for the app's login: it sets the session cookie that the auth
// endpoint reads. README.md says more.

import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Pusher from 'pusher';

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = path.join(here, '..', 'node_modules');
const FILES = {
  '/': { file: path.join(here, 'index.html'), type: 'text/html; charset=utf-8' },
  '/vendor/pusher.js': { file: path.join(modules, 'pusher-js/dist/web/pusher.min.js'), type: 'text/javascript; charset=utf-8' },
  '/vendor/echo.js': { file: path.join(modules, 'laravel-echo/dist/echo.js'), type: 'text/javascript; charset=utf-8' },
};
const ROOM = 'eng'; // the page joins presence-eng

/**
 * The app's HTTP server (not yet listening). config: appId, key, secret,
 * and where greendot's Pusher endpoint is (wsHost, wsPort).
 */
export function createApp({ appId, key, secret, wsHost = '127.0.0.1', wsPort = 8080 }) {
  const pusher = new Pusher({ appId, key, secret, host: wsHost, port: String(wsPort), useTLS: false });

  return http.createServer(async (req, res) => {
    const url = new URL(req.url, 'http://app');
    try {
      if (req.method === 'GET' && url.pathname === '/' && url.searchParams.has('user')) {
        // "Logging in": a real app signs its session cookie.
        const user = { id: url.searchParams.get('user'), name: url.searchParams.get('name') || url.searchParams.get('user') };
        const session = Buffer.from(JSON.stringify(user)).toString('base64url');
        res.writeHead(302, { location: '/', 'set-cookie': `session=${session}; Path=/; HttpOnly; SameSite=Lax` });
        return res.end();
      }
      if (req.method === 'GET' && url.pathname === '/config.json') {
        return json(res, 200, { key, wsHost, wsPort: Number(wsPort), room: ROOM, user: sessionUser(req) });
      }
      if (req.method === 'GET' && FILES[url.pathname]) {
        const { file, type } = FILES[url.pathname];
        const body = await fs.promises.readFile(file);
        res.writeHead(200, { 'content-type': type, 'cache-control': 'no-store' });
        return res.end(body);
      }
      if (req.method === 'POST' && url.pathname === '/broadcasting/auth') {
        return authorize(req, res, pusher);
      }
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('not found\n');
    } catch (err) {
      console.error(err);
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
      res.end('server error\n');
    }
  });
}

/**
 * POST /broadcasting/auth: pusher-js sends socket_id and channel_name,
 * form-encoded. A logged-in user may join any presence- channel and is
 * listed there as {id, name}, what a Laravel channel callback returns.
 */
async function authorize(req, res, pusher) {
  const user = sessionUser(req);
  if (!user) return json(res, 403, { message: 'log in first: open /?user=<id>&name=<name>' });
  const form = new URLSearchParams(await readBody(req));
  const socketId = form.get('socket_id');
  const channel = form.get('channel_name');
  if (!socketId || !channel) return json(res, 400, { message: 'socket_id and channel_name are required' });
  if (channel.startsWith('presence-')) {
    return json(res, 200, pusher.authorizeChannel(socketId, channel, { user_id: user.id, user_info: { id: user.id, name: user.name } }));
  }
  if (channel.startsWith('private-')) return json(res, 200, pusher.authorizeChannel(socketId, channel));
  return json(res, 403, { message: `no such channel: ${channel}` });
}

function sessionUser(req) {
  const m = /(?:^|;\s*)session=([^;]+)/.exec(req.headers.cookie ?? '');
  if (!m) return null;
  try {
    const u = JSON.parse(Buffer.from(m[1], 'base64url').toString());
    return typeof u.id === 'string' && u.id !== '' ? { id: u.id, name: String(u.name ?? u.id) } : null;
  } catch {
    return null;
  }
}

function readBody(req, limit = 64 * 1024) {
  return new Promise((resolve, reject) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (chunk) => {
      body += chunk;
      if (body.length > limit) { reject(new Error('body too large')); req.destroy(); }
    });
    req.on('end', () => resolve(body));
    req.on('error', reject);
  });
}

function json(res, code, value) {
  res.writeHead(code, { 'content-type': 'application/json' });
  res.end(JSON.stringify(value));
}

// Run only as `node example/server.js`, not when imported by the tests.
if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const env = process.env;
  const missing = ['PUSHER_APP_ID', 'PUSHER_APP_KEY', 'PUSHER_APP_SECRET'].filter((k) => !env[k]);
  if (missing.length) {
    console.error(`example/server.js: set ${missing.join(', ')} (the --pusher-app-id, --pusher-key and --pusher-secret greendot runs with)`);
    process.exit(2);
  }
  const port = Number(env.PORT || 8000);
  const app = createApp({
    appId: env.PUSHER_APP_ID, key: env.PUSHER_APP_KEY, secret: env.PUSHER_APP_SECRET,
    wsHost: env.PUSHER_HOST || '127.0.0.1', wsPort: Number(env.PUSHER_PORT || 8080),
  });
  app.listen(port, '127.0.0.1', () => {
    console.log(`app on http://127.0.0.1:${port}/?user=alice&name=Alice (greendot at ${env.PUSHER_HOST || '127.0.0.1'}:${env.PUSHER_PORT || 8080})`);
  });
}
