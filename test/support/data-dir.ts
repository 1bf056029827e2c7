/** Fresh embedded-store data directories for tests, without an initdb each. */
import { spawn } from 'node:child_process';
import { constants, cpSync, existsSync, mkdtempSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { tightenDataDir } from '../../src/config/data-dir-mode.ts';

let template: Promise<string> | undefined;

/**
 * An empty PGlite database directory, made once per machine and PGlite version: initdb costs seconds of
 * CPU in a child process (~800 MB of heap) on every gateway start, a copy of its result a tenth of a
 * second. Made beside its final path and renamed into place, so a concurrent test file never sees half of one.
 */
function pgliteTemplate(): Promise<string> {
  template ??= (async () => {
    const entry = createRequire(import.meta.url).resolve('@electric-sql/pglite');
    let pkg = dirname(entry);
    while (!existsSync(join(pkg, 'package.json'))) pkg = dirname(pkg);
    const { version } = JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8')) as { version: string };
    const dir = join(tmpdir(), `svc-test-pglite-${version}`);
    if (existsSync(join(dir, 'PG_VERSION'))) return dir;
    const making = mkdtempSync(`${dir}-making-`);
    const script = `const { PGlite } = await import(${JSON.stringify(pathToFileURL(entry).href)}); const db = await PGlite.create(process.argv[1]); await db.close();`;
    const code = await new Promise((resolve) => spawn(process.execPath, ['--input-type=module', '-e', script, join(making, 'pglite')], { stdio: 'inherit' }).once('exit', resolve));
    if (code !== 0) throw new Error(`making the PGlite template failed (${code})`);
    try {
      renameSync(join(making, 'pglite'), dir);
    } catch (error) {
      if (!existsSync(join(dir, 'PG_VERSION'))) throw error; // another file made it meanwhile
    } finally {
      rmSync(making, { recursive: true, force: true });
    }
    return dir;
  })();
  return template;
}

/** A fresh data directory holding a copy of the empty PGlite database the gateway would otherwise create. */
export async function freshDataDir(prefix = 'svc-test-'): Promise<string> {
  const dataDir = mkdtempSync(join(tmpdir(), prefix));
  cpSync(await pgliteTemplate(), join(dataDir, 'pglite'), { recursive: true, mode: constants.COPYFILE_FICLONE });
  // Owner-only, as the gateway makes its own (a wider one is tightened at start, with a line on stderr).
  tightenDataDir(dataDir);
  return dataDir;
}
