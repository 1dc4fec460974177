// `npm test`: builds greendot once, then runs every test file with Node's
// built-in test runner against that binary (GREENDOT_BIN).
//
//   cd clients/js && npm ci && npm test
//
// Extra arguments go to `node --test`, e.g. `npm test -- --test-name-pattern=away`.
// clients/react/test/run.js runs its own test files through runTests.

import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(here, '../../..');

/**
 * Runs every *.test.js file of dir against one greendot binary, built here
 * unless $GREENDOT_BIN names one, and exits with the runner's status. tests
 * names them in the build failure's message; tmpPrefix names the build's
 * temporary directory.
 */
export function runTests(dir, { tests, tmpPrefix }) {
  let bin = process.env.GREENDOT_BIN;
  let tmp = null;
  if (!bin) {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), tmpPrefix));
    bin = path.join(tmp, 'greendot');
    console.log(`building greendot into ${bin}`);
    try {
      execFileSync('go', ['build', '-o', bin, './cmd/greendot'], { cwd: repoRoot, stdio: 'inherit' });
    } catch {
      console.error(`go build ./cmd/greendot failed: ${tests} need the server`);
      fs.rmSync(tmp, { recursive: true, force: true });
      process.exit(1);
    }
  }

  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.test.js')).sort().map((f) => path.join(dir, f));
  // One file at a time: the machine is small, and each file runs its own server(s).
  const res = spawnSync(process.execPath, ['--test', '--test-concurrency=1', ...process.argv.slice(2), ...files], {
    stdio: 'inherit',
    env: { ...process.env, GREENDOT_BIN: bin },
  });
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  process.exit(res.status ?? 1);
}

// Run only as `node test/run.js`, not when imported.
if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  runTests(here, { tests: 'the JS tests', tmpPrefix: 'greendot-jstest-' });
}
