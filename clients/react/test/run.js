// `npm test` (after the type check): builds greendot once, then runs every
// test file with Node's built-in test runner against that binary (GREENDOT_BIN).
//
//   cd clients/react && npm ci && npm test
//
// Extra arguments go to `node --test`, e.g. `npm test -- --test-name-pattern=team`.

import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { runTests } from '../../js/test/run.js';

runTests(path.dirname(fileURLToPath(import.meta.url)), { tests: 'the React tests', tmpPrefix: 'greendot-reacttest-' });
