// `npm test`: builds greendot once (unless $GREENDOT_BIN names a binary),
// then runs every test file here, one at a time, against it.
//
//   cd e2e/pusher && npm ci && npm test
//
// Extra arguments go to `node --test`, e.g. `npm test -- --test-name-pattern=kill`.

import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { runTests } from '../../../clients/js/test/run.js';

runTests(path.dirname(fileURLToPath(import.meta.url)), {
  tests: 'the Pusher compatibility tests',
  tmpPrefix: 'greendot-pushertest-',
});
