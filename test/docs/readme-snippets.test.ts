/**
 * Every fenced shell (`sh`, `bash`, `shell`) and TypeScript (`ts`, `typescript`) block of README.md
 * runs, in order, against a started gateway, as a reader would run it: from a directory that looks
 * like the checkout after `npm ci` (`npx svc ...` works there, `data/admin-token` holds the admin
 * token), with the README's `127.0.0.1:8080` / `localhost:8080` pointed at the test's gateway (port
 * 0). Shell blocks run with bash (-e, pipefail; curl fails on an HTTP error status through a
 * `.curlrc`), TypeScript blocks with `node --import tsx`; what one block exports (SVC_API_KEY) the
 * next ones see. A non-zero exit fails the block's test. Only blocks marked with an HTML comment
 * `<!-- not run: why -->` right before the fence are skipped, and they are listed.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';

const repo = fileURLToPath(new URL('../../', import.meta.url));

interface Snippet {
  index: number;
  lang: 'shell' | 'ts';
  line: number;
  code: string;
  notRun: string | null;
}

/** The README's fenced shell and TypeScript blocks, with the `<!-- not run: ... -->` mark before each, if any. */
export function readmeSnippets(text: string): Snippet[] {
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

function run(command: string, args: string[], options: { cwd: string; env: NodeJS.ProcessEnv; timeoutMs: number }): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: options.cwd, env: options.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk) => (output += chunk));
    child.stderr.on('data', (chunk) => (output += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

const snippets = readmeSnippets(readFileSync(join(repo, 'README.md'), 'utf8'));

const it = suite<{ gateway: TestGateway; dir: string; env: NodeJS.ProcessEnv }>('README snippets');

it.before(async (context) => {
  context.gateway = await startTestGateway();
  // A directory shaped like the checkout: the package (for `npx svc` and `import 'openai'`) and ./data/admin-token.
  const dir = mkdtempSync(join(tmpdir(), 'svc-readme-'));
  for (const entry of ['package.json', 'bin', 'node_modules']) symlinkSync(join(repo, entry), join(dir, entry));
  mkdirSync(join(dir, 'data'));
  writeFileSync(join(dir, 'data', 'admin-token'), `${context.gateway.adminToken}\n`, { mode: 0o600 });
  writeFileSync(join(dir, '.curlrc'), 'fail-with-body\nshow-error\n');
  writeFileSync(join(dir, 'exported.sh'), '');
  context.dir = dir;
  const env: NodeJS.ProcessEnv = { ...process.env, CURL_HOME: dir, SVC_URL: context.gateway.url, npm_config_update_notifier: 'false' };
  for (const name of ['DATA_DIR', 'SVC_ADMIN_TOKEN', 'SVC_API_KEY', 'PORT', 'HOST', 'DATABASE_URL', 'SVC_CONFIG']) delete env[name];
  context.env = env;
});

it.after(async (context) => {
  await context.gateway?.stop();
  if (context.dir) rmSync(context.dir, { recursive: true, force: true });
});

it('the README has shell and TypeScript blocks, and says how to call svc', () => {
  assert.ok(snippets.filter((s) => s.notRun === null && s.lang === 'shell').length >= 3);
  assert.ok(snippets.some((s) => s.notRun === null && s.lang === 'ts' && s.code.includes("from 'openai'")));
  assert.ok(snippets.some((s) => s.notRun === null && /\bnpx svc keys create\b/.test(s.code)));
  assert.not.ok(snippets.some((s) => /(^|[\s;&|(])svc keys\b/m.test(s.code.replace(/npx svc/g, ''))), 'a bare `svc` is not on PATH after npm ci');
});

const skipped = snippets.filter((s) => s.notRun !== null);
it(`blocks marked "not run" (skipped): ${skipped.map((s) => `line ${s.line} (${s.notRun})`).join('; ') || 'none'}`, () => {
  for (const s of skipped) assert.ok(s.notRun!.length > 0, `line ${s.line}: say why it is not run`);
});

for (const snippet of snippets.filter((s) => s.notRun === null)) {
  it(`README line ${snippet.line}: ${snippet.lang} block ${snippet.index} runs`, async ({ gateway, dir, env }) => {
    const hostPort = new URL(gateway.url).host;
    const code = snippet.code.replace(/\b(127\.0\.0\.1|localhost):8080\b/g, hostPort);
    let script: string;
    if (snippet.lang === 'shell') {
      writeFileSync(join(dir, `block-${snippet.index}.sh`), `${code}\n`);
      script = `source ./exported.sh\nsource ./block-${snippet.index}.sh\nexport -p | grep -v '^declare -[a-zA-Z]*r' > ./exported.next && mv ./exported.next ./exported.sh\n`;
    } else {
      writeFileSync(join(dir, `block-${snippet.index}.ts`), `${code}\n`);
      script = `source ./exported.sh\nexec node --import tsx ./block-${snippet.index}.ts\n`;
    }
    // A bound for a hung block, not a speed target: a block of four `npx svc` calls took 30 s on a 2-core machine under load.
    const { code: exit, output } = await run('bash', ['-e', '-o', 'pipefail', '-c', script], { cwd: dir, env, timeoutMs: 90_000 });
    assert.is(exit, 0, `README line ${snippet.line} exited ${exit === null ? 'killed after 90 s' : exit}:\n${code}\n--- output ---\n${output}`);
  });
}

it.run();
