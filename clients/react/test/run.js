// `npm test` (after the type check): builds greendot once, then runs every
// test file with Node's built-in test runner against that binary (GREENDOT_BIN).
//
//   cd clients/react && npm ci && npm test
//
// Extra arguments go to `node --test`, e.g. `npm test -- --test-name-pattern=team`.

import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(here, '../../..');

let bin = process.env.GREENDOT_BIN;
let tmp = null;
if (!bin) {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'greendot-reacttest-'));
  bin = path.join(tmp, 'greendot');
  console.log(`building greendot into ${bin}`);
  try {
    execFileSync('go', ['build', '-o', bin, './cmd/greendot'], { cwd: repoRoot, stdio: 'inherit' });
  } catch {
    console.error('go build ./cmd/greendot failed: the React tests need the server');
    fs.rmSync(tmp, { recursive: true, force: true });
    process.exit(1);
  }
}

const files = fs.readdirSync(here).filter((f) => f.endsWith('.test.js')).sort().map((f) => path.join(here, f));
const res = spawnSync(process.execPath, ['--test', '--test-concurrency=1', ...process.argv.slice(2), ...files], {
  stdio: 'inherit',
  env: { ...process.env, GREENDOT_BIN: bin },
});
if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
process.exit(res.status ?? 1);
