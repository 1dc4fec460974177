// The test page's server: serves React, greendot-client, this package's
// src/ and test/app.js to Chromium, and passes /v1 requests on to greendot
// with the API key, as an app's backend would (a browser must never hold the
// key). /noauth/v1/… passes them on without it.

import fs from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const pkgRoot = path.resolve(here, '..');
const require = createRequire(import.meta.url);

// What the page imports by bare name, and where the import map sends it.
const VENDOR = ['react', 'react-dom/client'];

/**
 * React ships CommonJS only, and the browser loads modules. vendorScript
 * wraps the CommonJS files the entries need into one classic script with a
 * small require (React's builds only require string literals), which puts
 * each entry's exports on globalThis.__vendor; vendorModule re-exports one
 * entry's names as an ES module.
 */
function vendorScript(entries) {
  const modules = new Map(); // absolute path → { id, source, deps: spec → id }
  const visit = (file) => {
    const seen = modules.get(file);
    if (seen) return seen.id;
    const m = { id: modules.size, source: fs.readFileSync(file, 'utf8'), deps: {} };
    modules.set(file, m);
    const req = createRequire(file);
    for (const [, , spec] of m.source.matchAll(/\brequire\((['"])([^'"]+)\1\)/g)) {
      let resolved;
      try { resolved = req.resolve(spec); } catch { continue; } // in a comment or a message
      m.deps[spec] = visit(resolved);
    }
    return m.id;
  };
  const entryIds = Object.fromEntries(entries.map((e) => [e, visit(require.resolve(e))]));
  const defs = [...modules.values()].map((m) => `function (module, exports, require) {\n${m.source}\n}`);
  const deps = [...modules.values()].map((m) => m.deps);
  return `(function () {
var process = { env: { NODE_ENV: 'development' } };
var defs = [${defs.join(',\n')}];
var deps = ${JSON.stringify(deps)};
var cache = [];
function load(id) {
  if (cache[id]) return cache[id].exports;
  var module = { exports: {} };
  cache[id] = module;
  defs[id].call(module.exports, module, module.exports, function (spec) {
    if (!(spec in deps[id])) throw new Error('test vendor bundle: ' + spec + ' is not bundled');
    return load(deps[id][spec]);
  });
  return module.exports;
}
var entries = ${JSON.stringify(entryIds)};
globalThis.__vendor = {};
for (var name in entries) globalThis.__vendor[name] = load(entries[name]);
})();
`;
}

function vendorModule(entry) {
  const names = Object.keys(require(entry)).filter((n) => /^[A-Za-z_$][\w$]*$/.test(n) && n !== 'default');
  return `const m = globalThis.__vendor[${JSON.stringify(entry)}];
export default m;
export const { ${names.join(', ')} } = m;
`;
}

const vendorURL = (entry) => `/vendor/${entry.replace(/\//g, '-')}.js`;

function indexHTML() {
  const imports = { 'greendot-client': '/greendot-client.js' };
  for (const e of VENDOR) imports[e] = vendorURL(e);
  return `<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>greendot-react test</title>
<script type="importmap">${JSON.stringify({ imports })}</script>
<script src="/vendor.js"></script>
<script type="module" src="/test/app.js"></script>
</head>
<body><div id="root"></div></body>
</html>
`;
}

/**
 * Starts the page server on a free port of 127.0.0.1 for the greendot
 * server given. teamRequests counts the team presence requests passed on.
 */
export async function startPage(greendot, apiKey) {
  const files = new Map([
    ['/', { type: 'text/html', body: indexHTML() }],
    ['/vendor.js', { type: 'text/javascript', body: vendorScript(VENDOR) }],
    ['/greendot-client.js', { type: 'text/javascript', file: require.resolve('greendot-client') }],
    ['/test/app.js', { type: 'text/javascript', file: path.join(here, 'app.js') }],
  ]);
  for (const e of VENDOR) files.set(vendorURL(e), { type: 'text/javascript', body: vendorModule(e) });
  for (const f of ['index.js', 'store.js']) files.set(`/src/${f}`, { type: 'text/javascript', file: path.join(pkgRoot, 'src', f) });
  // Read once: every page of a run gets the same files, even if one is edited meanwhile.
  for (const f of files.values()) f.body ??= fs.readFileSync(f.file);

  const page = { teamRequests: 0 };
  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, 'http://page');
    const proxied = url.pathname.startsWith('/v1/') ? { path: url.pathname, key: true }
      : url.pathname.startsWith('/noauth/v1/') ? { path: url.pathname.slice('/noauth'.length), key: false } : null;
    if (proxied) {
      if (/^\/v1\/teams\/[^/]+\/presence$/.test(proxied.path)) page.teamRequests++;
      try {
        const headers = proxied.key ? { authorization: `Bearer ${apiKey}` } : {};
        const up = await fetch(greendot.http + proxied.path + url.search, { method: req.method, headers });
        const body = Buffer.from(await up.arrayBuffer());
        res.writeHead(up.status, { 'content-type': up.headers.get('content-type') ?? 'application/json' });
        res.end(body);
      } catch (err) {
        res.writeHead(502, { 'content-type': 'text/plain' });
        res.end(`proxy: ${err.message}`);
      }
      return;
    }
    const f = files.get(url.pathname);
    if (!f) {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('not found');
      return;
    }
    res.writeHead(200, { 'content-type': `${f.type}; charset=utf-8`, 'cache-control': 'no-store' });
    res.end(f.body);
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  page.url = `http://127.0.0.1:${server.address().port}`;
  page.close = () => new Promise((resolve) => {
    server.closeAllConnections();
    server.close(() => resolve());
  });
  return page;
}
