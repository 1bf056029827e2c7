// DATA_DIR holds the embedded store (catalogs, WAL: keys' e-mails and secret hashes), the admin token,
// and by default the harvest data: owner-only, directories 0700 and files 0600. The serve and worker
// entry points set a umask of 0o077 so that whatever they (and PGlite, and child processes) create
// is born that way, and tighten at start whatever an earlier release or a copy left wider.
import { chmodSync, lstatSync, mkdirSync, readdirSync, type Stats } from 'node:fs';
import { join, resolve } from 'node:path';

/** The umask of the serve and worker processes: nothing for group or others. */
export const OWNER_ONLY_UMASK = 0o077;

export interface TightenResult {
  dir: string;
  /** Entries (the directory itself included) whose mode gave group or others any access, now owner-only. */
  tightened: number;
}

/**
 * Creates `dataDir` (0700) when missing, then takes group and other permissions off it and every
 * directory and file below it (symbolic links are neither followed nor changed). Returns how many
 * entries were wider.
 */
export function tightenDataDir(dataDir: string): TightenResult {
  const dir = resolve(dataDir);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  let tightened = 0;
  const visit = (path: string, stat: Stats) => {
    if (stat.isSymbolicLink()) return;
    if ((stat.mode & 0o077) !== 0) {
      chmodSync(path, stat.mode & 0o7700);
      tightened++;
    }
    if (!stat.isDirectory()) return;
    for (const name of readdirSync(path)) {
      const child = join(path, name);
      let childStat: Stats;
      try {
        childStat = lstatSync(child);
      } catch {
        continue; // removed meanwhile (a lock's draft file)
      }
      visit(child, childStat);
    }
  };
  visit(dir, lstatSync(dir));
  return { dir, tightened };
}

/** The start line about DATA_DIR's permissions, or null when nothing was wider than owner-only. */
export function tightenedLine(result: TightenResult): string | null {
  if (result.tightened === 0) return null;
  return `svc: DATA_DIR ${result.dir} gave other users access to ${result.tightened} entr${result.tightened === 1 ? 'y' : 'ies'}; made them owner-only (directories 0700, files 0600)\n`;
}
