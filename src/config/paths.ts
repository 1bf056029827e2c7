import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The package root, found from this file whether it runs as TypeScript source (src/config) or as
 * compiled JavaScript (dist/src/config), so shipped files (infra/) resolve the same either way.
 */
function findPackageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) || !existsSync(join(dir, 'infra'))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error('cannot find the package root (package.json beside infra/)');
    dir = parent;
  }
  return dir;
}

export const packageRoot = findPackageRoot();

/** `node` arguments that run the `svc` CLI the way this process runs: compiled, or TypeScript through tsx. */
export function svcCommand(): string[] {
  const self = fileURLToPath(import.meta.url);
  const compiled = self.endsWith('.js');
  const main = join(dirname(self), '..', 'cli', compiled ? 'main.js' : 'main.ts');
  return compiled ? [main] : ['--import', 'tsx', main];
}
