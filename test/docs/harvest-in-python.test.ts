/**
 * docs/harvest-in-python.md, run as a researcher runs it: its shell block submits a harvest to a real
 * gateway (port 0, its reference engine and worker) and downloads it with `npx svc harvest download`;
 * its NumPy block then runs on the download under SVC_PYTHON (a venv with the pinned safetensors and
 * numpy: infra/dev/services.sh) and prints what the page says it prints. Without SVC_PYTHON the test is
 * reported skipped; an SVC_PYTHON that cannot import safetensors and numpy fails it (CI sets it on purpose).
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';

const repo = fileURLToPath(new URL('../../', import.meta.url));
const page = readFileSync(join(repo, 'docs', 'harvest-in-python.md'), 'utf8');
const python = process.env.SVC_PYTHON;

/** The page's fenced blocks of `lang`, each with the `<!-- not run: ... -->` mark right before it, if any. */
function blocks(lang: string): { code: string; notRun: boolean }[] {
  const found: { code: string; notRun: boolean }[] = [];
  const lines = page.split('\n');
  for (let i = 0; i < lines.length; i++) {
    if (lines[i].trim() !== `\`\`\`${lang}`) continue;
    let end = i + 1;
    while (end < lines.length && lines[end].trim() !== '```') end++;
    found.push({ code: lines.slice(i + 1, end).join('\n'), notRun: /^<!-- not run:/.test(lines[i - 1] ?? '') });
    i = end;
  }
  return found;
}

function run(file: string, args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string } = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(file, args, { ...options, timeout: 300_000, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      resolve({ code: error ? ((error as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

const name = 'docs/harvest-in-python.md: the shell block harvests and downloads, the NumPy block loads, checks and normalises it';

if (!python) {
  const reason = 'skipped: SVC_PYTHON is not set (infra/dev/services.sh start prints it: a venv with safetensors and numpy)';
  console.log(`harvest-in-python: ${reason}`);
  test.skip(`${name}: ${reason}`, () => {});
} else {
  test(name, async () => {
    // SVC_PYTHON set on purpose: an interpreter without the packages fails, it is not skipped.
    const probe = await run(python, ['-c', 'import safetensors, numpy; print(safetensors.__version__, numpy.__version__)']);
    assert.is(probe.code, 0, `${python} cannot import safetensors and numpy: ${probe.stderr}`);

    const [shell] = blocks('sh');
    const [numpyBlock, torchBlock] = blocks('python');
    const [expected] = blocks('text');
    assert.ok(shell && numpyBlock && torchBlock && expected, 'the page has its shell, NumPy, PyTorch and output blocks');
    assert.not.ok(numpyBlock.notRun, 'the NumPy block is the one run');
    assert.ok(torchBlock.notRun && /safetensors\.torch import load_file/.test(torchBlock.code), 'the PyTorch block, shown, uses safetensors.torch');

    const storage = mkdtempSync(join(tmpdir(), 'svc-harvest-python-'));
    const work = mkdtempSync(join(tmpdir(), 'svc-harvest-python-work-'));
    let gw: TestGateway | undefined;
    let scratch = '';
    try {
      gw = await startTestGateway({ harvest: loadSettings({ ...process.env, DATABASE_URL: '', SVC_HARVEST_DIR: storage }).harvest });
      // The shell block as written, in the checkout (npx svc), pointed at this gateway; it says where its scratch folder is.
      const env = { ...process.env, SVC_URL: gw.url, SVC_API_KEY: gw.apiKey, npm_config_update_notifier: 'false' };
      const harvested = await run('bash', ['-euo', 'pipefail', '-c', `${shell.code}\necho "SCRATCH=$SCRATCH"`], { env, cwd: repo });
      assert.is(harvested.code, 0, harvested.stderr + harvested.stdout);
      scratch = /^SCRATCH=(.+)$/m.exec(harvested.stdout)![1];
      const downloaded = join(scratch, 'activations');
      const files = readdirSync(downloaded).sort();
      assert.is(files.length, 4, files.join(', '));
      assert.equal([files[0], files[3]], ['manifest.json', 'stats.safetensors']);
      for (const shard of files.slice(1, 3)) assert.match(shard, /^shard-\d{5}-[0-9a-f]+\.safetensors$/);

      const script = join(work, 'harvest.py');
      writeFileSync(script, numpyBlock.code);
      const loaded = await run(python, [script, downloaded], { env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' } });
      assert.is(loaded.code, 0, loaded.stderr);
      const [printedFirst, printedSecond] = loaded.stdout.trim().split('\n');
      const [shownFirst, shownSecond] = expected.code.trim().split('\n');
      assert.is(printedFirst, shownFirst, 'the page shows what the block prints');
      // The normalised mean is float32 rounding (its last digits vary with the machine's summation order): its form is checked.
      assert.match(printedSecond, /^layer 2: normalised mean \d\.\de-0[5-9] \(max \|\.\|\), std 1\.0000$/);
      assert.match(shownSecond, /^layer 2: normalised mean \d\.\de-0[5-9] \(max \|\.\|\), std 1\.0000$/);

      // The block's hash check is a real check: a shard changed by one byte stops it.
      const shard = join(downloaded, files[2]);
      const bytes = readFileSync(shard);
      bytes[bytes.length - 1] ^= 1;
      writeFileSync(shard, bytes);
      const tampered = await run(python, [script, downloaded], { env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' } });
      assert.is(tampered.code, 1);
      assert.ok(tampered.stderr.includes(`${files[2]}: SHA-256 differs from the manifest`), tampered.stderr);
    } finally {
      await gw?.stop();
      for (const dir of [storage, work, scratch]) if (dir) rmSync(dir, { recursive: true, force: true });
    }
  });
}

test.run();
