/**
 * `--help` at every level: `svc --help`, `svc help COMMAND`, and `svc COMMAND [SUBCOMMAND] [FLAGS] --help`
 * (or -h) print that command's usage and exit 0, whatever else is on the line; an unknown command's
 * help is refused with exit 2.
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';

const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));
const run = (...args: string[]) => {
  const result = spawnSync(process.execPath, [svc, ...args], { encoding: 'utf8', env: { ...process.env, DATABASE_URL: '' }, timeout: 120_000 });
  return { code: result.status, out: result.stdout, err: result.stderr };
};

const it = suite('svc --help');

it('the overview, with or without help', () => {
  for (const args of [['--help'], ['-h'], ['help']]) {
    const { code, out } = run(...args);
    assert.is(code, 0, args.join(' '));
    assert.match(out, /^usage: svc <command> \[options\]/);
  }
});

it('every command of the overview, and its subcommands with flags, answer --help with their usage', () => {
  const cases: Array<[string[], RegExp]> = [
    [['serve', '--help'], /serve \[--sql-port N\|off\][\s\S]*`npm start` serves it on any free port/],
    [['serve', '--sql-port', '5433', '-h'], /--no-workers/],
    [['worker', '--help'], /worker[\s\S]*SVC_HARVEST_TRANSPORT/],
    [['sql', '--help'], /svc sql "SELECT \.\.\."[\s\S]*svc sql --url/],
    [['sql-role', '--help'], /svc sql-role NAME/],
    [['engine', '--help'], /engine \[--model ID\]/],
    [['projections', '--help'], /projections rebuild/],
    [['projections', 'status', '--help'], /projections status/],
    [['audit', '--help'], /svc audit usage --key PREFIX/],
    [['audit', 'usage', '--key', 'abc', '--help'], /svc audit statement/],
    [['events', 'tail', '--help'], /svc events read STREAM/],
    [['harvest', '--help'], /svc harvest/],
    [['harvest', 'submit', '--help'], /submit/],
    [['keys', 'create', '--email', 'a@b.c', '--help'], /svc keys <command>/],
    [['help', 'audit'], /svc audit usage/],
  ];
  for (const [args, expected] of cases) {
    const { code, out, err } = run(...args);
    assert.is(code, 0, `svc ${args.join(' ')}: ${err}`);
    assert.match(out, expected, `svc ${args.join(' ')}`);
    assert.not.match(out + err, /unknown/, `svc ${args.join(' ')}`);
  }
});

it('svc serve --sql-port takes a port number or off, and says so before starting anything', () => {
  for (const value of ['nope', '-1', '65536', '']) {
    const { code, err } = run('serve', '--sql-port', value);
    assert.is(code, 2, `--sql-port ${JSON.stringify(value)}`);
    assert.match(err, /^usage: svc serve \[--sql-port N\|off\] \[--no-workers\]/);
  }
});

it('an unknown command\'s help: exit 2, naming it', () => {
  const { code, err } = run('nope', '--help');
  assert.is(code, 2);
  assert.match(err, /unknown command "nope"/);
});

it.run();
