/**
 * What the docs tests read of the repository's Markdown: the files, their relative links and headings
 * (GitHub's anchors), their runnable blocks, and the environment variables the code reads.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

export const repo = fileURLToPath(new URL('../../', import.meta.url));

/** Folders never searched: dependencies, build output, data, and hidden folders (.git, .ci). */
const skipped = new Set(['node_modules', 'dist', 'data']);

/** Every Markdown file of the checkout (tracked or not), as paths relative to the repository, sorted. */
export function markdownFiles(dir = repo): string[] {
  return readdirSync(dir)
    .flatMap((name) => {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) return name.startsWith('.') || skipped.has(name) ? [] : markdownFiles(path);
      return name.endsWith('.md') ? [relative(repo, path)] : [];
    })
    .sort();
}

/** The lines of a Markdown text with fenced blocks blanked out (links and headings in code are not links). */
function proseLines(text: string): string[] {
  let fenced = false;
  return text.split('\n').map((line) => {
    if (/^\s*```/.test(line)) {
      fenced = !fenced;
      return '';
    }
    return fenced ? '' : line;
  });
}

export interface Link {
  line: number;
  target: string;
}

/** Inline links and images whose target is not a URL with a scheme: `[text](path#anchor)`, `(#anchor)`. */
export function relativeLinks(text: string): Link[] {
  const links: Link[] = [];
  proseLines(text).forEach((raw, i) => {
    const line = raw.replace(/`[^`]*`/g, '');
    for (const m of line.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
      if (!/^[a-z][a-z0-9+.-]*:/i.test(m[1])) links.push({ line: i + 1, target: m[1] });
    }
  });
  return links;
}

/** GitHub's anchors for a file's headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
export function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const result = new Set<string>();
  for (const line of proseLines(text)) {
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!heading) continue;
    const plain = heading[1].replace(/\[([^\]]*)\]\([^)]*\)/g, '$1');
    const slug = plain.toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '').replace(/ /g, '-');
    const n = seen.get(slug) ?? 0;
    seen.set(slug, n + 1);
    result.add(n === 0 ? slug : `${slug}-${n}`);
  }
  return result;
}

export interface Snippet {
  index: number;
  lang: 'shell' | 'ts';
  line: number;
  code: string;
  notRun: string | null;
}

/** The fenced shell and TypeScript blocks of a Markdown text, with the `<!-- not run: ... -->` mark before each, if any. */
export function runnableBlocks(text: string): Snippet[] {
  const lines = text.split('\n');
  const snippets: Snippet[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)```(\S*)\s*$/.exec(lines[i]);
    if (!open) continue;
    let end = i + 1;
    while (end < lines.length && !/^\s*```\s*$/.test(lines[end])) end++;
    const tag = open[2].toLowerCase();
    const lang = ['sh', 'bash', 'shell'].includes(tag) ? 'shell' : ['ts', 'typescript'].includes(tag) ? 'ts' : null;
    if (lang) {
      let before = i - 1;
      while (before >= 0 && lines[before].trim() === '') before--;
      const mark = before >= 0 ? /^<!--\s*not run:\s*(.*?)\s*-->$/.exec(lines[before].trim()) : null;
      snippets.push({ index: snippets.length + 1, lang, line: i + 1, code: lines.slice(i + 1, end).join('\n'), notRun: mark ? mark[1] : null });
    }
    i = end;
  }
  return snippets;
}

/** TypeScript and JavaScript sources under `dir` (relative to the repository), recursively. */
function sources(dir: string): string[] {
  return readdirSync(join(repo, dir)).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(join(repo, path)).isDirectory()) return sources(path);
    return /\.(ts|js|mjs)$/.test(name) ? [path] : [];
  });
}

/**
 * The environment variables the service's code reads, found in the sources rather than listed by hand:
 * `env.NAME` / `process.env.NAME`, `env['NAME']`, and the settings helpers' calls (`intFromEnv(env, 'NAME', ...)`,
 * `envMs('NAME')`: any function whose name holds "env" called with the name as a string literal).
 */
export function variablesReadBy(dirs: string[]): Map<string, string[]> {
  const found = new Map<string, string[]>();
  const patterns = [
    /\benv\??\.([A-Z][A-Z0-9_]*)\b/g,
    /\benv\[\s*['"]([A-Z][A-Z0-9_]*)['"]\s*\]/g,
    /\b\w*[Ee]nv\w*\(\s*(?:[\w.]+\s*,\s*)?['"]([A-Z][A-Z0-9_]*)['"]/g,
  ];
  for (const file of dirs.flatMap(sources)) {
    const text = readFileSync(join(repo, file), 'utf8');
    for (const pattern of patterns) {
      for (const m of text.matchAll(pattern)) found.set(m[1], [...new Set([...(found.get(m[1]) ?? []), file])]);
    }
  }
  return found;
}

/** The variables named in the first column of the tables under a page's `## <section>` heading. */
export function variablesDocumented(text: string, section: string): Set<string> {
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.trim() === `## ${section}`);
  if (start < 0) return new Set();
  const names = new Set<string>();
  for (const line of lines.slice(start + 1)) {
    if (/^## /.test(line)) break;
    if (!line.startsWith('|') || /^\|\s*-/.test(line)) continue;
    const first = line.split('|')[1] ?? '';
    for (const m of first.matchAll(/`([A-Z][A-Z0-9_]*)`/g)) names.add(m[1]);
  }
  return names;
}
