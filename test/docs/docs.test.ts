/**
 * The docs stay true: every relative link (and its #anchor) of every Markdown file resolves; the
 * environment variables the code reads are exactly those the operations page's table documents; and
 * no page outgrows its bound. (The runnable blocks of the README and docs/ run in snippets.test.ts.)
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize } from 'node:path';
import { anchors, markdownFiles, relativeLinks, repo, variablesDocumented, variablesReadBy } from './markdown.ts';

const it = suite('docs');

const files = markdownFiles();
const read = (file: string) => readFileSync(join(repo, file), 'utf8');

it('finds the Markdown of the repository', () => {
  for (const file of ['README.md', 'BENCHMARKS.md', 'docs/README.md', 'docs/operations.md', 'src/README.md']) assert.ok(files.includes(file), file);
});

it('every relative link resolves, and every #anchor names a heading of its target', () => {
  const broken: string[] = [];
  for (const file of files) {
    for (const { line, target } of relativeLinks(read(file))) {
      const [path, anchor] = target.split('#', 2) as [string, string | undefined];
      const resolved = path === '' ? file : normalize(join(dirname(file), decodeURIComponent(path)));
      const where = `${file}:${line}: ${target}`;
      if (resolved.startsWith('..') || !existsSync(join(repo, resolved))) {
        broken.push(`${where} (no ${resolved})`);
        continue;
      }
      if (anchor === undefined || anchor === '') continue;
      if (!resolved.endsWith('.md') || statSync(join(repo, resolved)).isDirectory()) {
        broken.push(`${where} (an anchor into a file that is not Markdown)`);
      } else if (!anchors(read(resolved)).has(anchor)) {
        broken.push(`${where} (no heading #${anchor} in ${resolved})`);
      }
    }
  }
  assert.equal(broken, [], `broken links:\n${broken.join('\n')}`);
});

// Where the code reads its settings: the running system (src/). bin/run-tests.js's TEST_* variables are
// the test runner's, documented with the tests (docs/development.md).
const page = 'docs/operations.md';
const section = 'Environment variables';

it(`the variables the code reads are exactly those documented in ${page}, "${section}"`, () => {
  const readBy = variablesReadBy(['src']);
  const documented = variablesDocumented(read(page), section);
  assert.ok(readBy.has('SVC_HARVEST_DIR') && readBy.has('PORT'), 'the scan finds the settings loader\'s reads');
  assert.ok(documented.size > 0, `${page} has a "## ${section}" table`);
  const undocumented = [...readBy.keys()].filter((name) => !documented.has(name)).sort();
  const unread = [...documented].filter((name) => !readBy.has(name)).sort();
  assert.equal(
    undocumented,
    [],
    `read by the code but not documented in ${page}:\n${undocumented.map((n) => `  ${n} (${readBy.get(n)!.join(', ')})`).join('\n')}`,
  );
  assert.equal(unread, [], `documented in ${page} but read nowhere in src/: ${unread.join(', ')}`);
});

// 1 KB = 1,000 bytes, as `wc -c` counts them.
const pageBound = 15_000;
const indexBound = 5_000;
const totalBound = 155_000;

it(`no page over ${pageBound} bytes, src/README.md under ${indexBound}, all of them under ${totalBound}`, () => {
  const sizes = files.map((file) => ({ file, bytes: statSync(join(repo, file)).size }));
  const over = sizes.filter((s) => s.bytes > (s.file === 'src/README.md' ? indexBound : pageBound));
  assert.equal(over.map((s) => `${s.file}: ${s.bytes} bytes`), [], 'pages over their bound');
  const total = sizes.reduce((sum, s) => sum + s.bytes, 0);
  assert.ok(total < totalBound, `all Markdown together is ${total} bytes, over ${totalBound}: ${sizes.sort((a, b) => b.bytes - a.bytes).slice(0, 5).map((s) => `${s.file} ${s.bytes}`).join(', ')}`);
});

it.run();
