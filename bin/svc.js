#!/usr/bin/env node
// The package's CLI. It runs the build in dist/ when that is current (npm ci builds it; npm start and
// `node bin/build.js` rebuild it), which starts in well under a second; after a change to the sources it
// runs them through tsx's loader instead (slower to start, never stale).
import { pathToFileURL } from 'node:url';
import { join } from 'node:path';
import { isBuilt, root } from './build.js';

if (isBuilt()) {
  await import(pathToFileURL(join(root, 'dist', 'src', 'cli', 'main.js')).href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import('../src/cli/main.ts');
}
