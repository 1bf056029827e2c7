/**
 * One long prompt does not hold up the gateway (issue 44): while ref-gpt2 (GPT-2's BPE, a 2,048-token context) is
 * sent long runs of one letter, another client polls GET /health, and it is answered within 100 ms (the median poll, on
 * a machine loaded by other work, and none past a second). A
 * 64,000-letter prompt (a lower bound cannot prove it too long: it is tokenized, in the tokenizer pool) and a
 * 7.9 MB one (under the 8 MB body cap; the bound refuses it before it is tokenized) both get the contract's
 * 400 context_length_exceeded. Before the fix, the first held the event loop for seconds and the second for
 * hours. The gateway runs in this process, so a blocked event loop delays the polls' own timers too.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from 'undici';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';

const it = suite('a long prompt does not block other requests');
let gw: TestGateway;

it.before(async () => {
  // Metering off (SVC_METERING=off): each refused request's metering append runs PGlite's WebAssembly on the event
  // loop, a per-request cost whatever the prompt's size that, on a machine short of CPU, alone passes 100 ms now
  // and then (30 refused five-character prompts did, at load average 18 on 2 cores). This test is about the cost
  // that grows with the prompt.
  gw = await startTestGateway({ metering: false });
});
it.after(async () => {
  await gw?.stop();
});

/**
 * How long each /health poll took, polling every 10 ms until `done` settles. The polls ask for no compression and
 * pause between them, so that the polling itself (in this process) does not keep the event loop busy.
 */
async function pollHealthUntil(done: Promise<unknown>, took: number[] = []): Promise<number[]> {
  let finished = false;
  void done.finally(() => (finished = true)).catch(() => undefined);
  while (!finished) {
    const started = performance.now();
    const res = await request(`${gw.url}/health`);
    await res.body.arrayBuffer();
    assert.is(res.statusCode, 200);
    took.push(performance.now() - started);
    await sleep(10);
  }
  return took;
}

/**
 * Sends the body `times` times in turn, then on while `more()` says so (at most 20 times as many); resolves with
 * each answer's status and JSON.
 */
async function sendAll(body: Buffer, times: number, more: () => boolean = () => false): Promise<{ status: number; body: any }[]> {
  const answers: { status: number; body: any }[] = [];
  // undici's request writes the encoded body as it is (fetch would encode and copy it again in this process).
  for (let i = 0; i < times || (more() && i < 20 * times); i++) {
    const res = await request(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body });
    answers.push({ status: res.statusCode, body: await res.body.json() });
  }
  return answers;
}

async function check(what: string, prompt: string, rounds: number, message: RegExp): Promise<void> {
  const body = Buffer.from(JSON.stringify({ model: 'ref-gpt2', prompt, max_tokens: 1 }));
  assert.ok(body.length < 8_000_000, 'under the body cap');
  // Requests go on until the polls are enough to judge by: a fast machine refuses `rounds` of them in fewer polls.
  const polls: number[] = [];
  const sending = sendAll(body, rounds, () => polls.length < 2 * rounds);
  await pollHealthUntil(sending, polls);
  const answers = await sending;
  for (const answer of answers) {
    assert.is(answer.status, 400, JSON.stringify(answer.body).slice(0, 300));
    assert.is(answer.body.error.code, 'context_length_exceeded');
    assert.is(answer.body.error.type, 'invalid_request_error');
    assert.is(answer.body.error.param, 'prompt');
    assert.match(answer.body.error.message, message);
  }
  // Within 100 ms, allowing for what the machine does to any request: on 2 cores loaded by other work an idle
  // gateway's poll passes 100 ms now and then (153 ms once in 139 at load 20), and a 7.9 MB body's receipt and
  // hand-over to the pool take a few tens of ms of the event loop that contention stretches (8 polls in 21 over
  // 100 ms, the most 668, beside a CI run and two CPU-bound processes). So: the median poll within 100 ms, and
  // none past a second, where a prompt tokenized on the event loop held every poll for seconds.
  const slow = polls.filter((ms) => ms > 100);
  const said = `${what}: /health took ${slow.map((ms) => `${Math.round(ms)} ms`).join(', ')} of ${polls.length} polls (the most ${Math.round(Math.max(...polls))} ms)`;
  const median = [...polls].sort((x, y) => x - y)[Math.floor(polls.length / 2)];
  assert.ok(median <= 100, `median ${Math.round(median)} ms; ${said}`);
  assert.ok(Math.max(...polls) < 1_000, said);
  assert.ok(polls.length >= 2 * rounds, `${what}: only ${polls.length} polls while ${answers.length} requests were in flight`);
}

// One test, the 64,000 letters first: before the fix that phase failed after seconds, where the 7.9 MB one would have
// held this process (gateway and pollers alike) for hours.
it('/health answers within 100 ms throughout while long prompts are refused with 400 context_length_exceeded', async () => {
  // The pool's thread starts on the first long prompt and loads GPT-2's tokenizer; under tsx it compiles the
  // tokenizer's sources first (a build starts it in tens of ms). One request, unpolled, pays that here.
  await sendAll(Buffer.from(JSON.stringify({ model: 'ref-gpt2', prompt: 'b'.repeat(64_000), max_tokens: 1 })), 1);
  // 64,000 letters: 16,001 tokens by count (GPT-2 spells a run of a's four at a time, and adds BOS), above the
  // context, though the bound (64,000 bytes at most 128 a token) says only 501: tokenized, in the pool.
  await check('64,000 letters', 'a'.repeat(64_000), 6, /^prompt: 16001 prompt tokens \+ max_tokens 1 = 16002 exceeds the context length 2048 of model ref-gpt2$/);
  // 7.9 MB: the bound refuses it before it is tokenized (its JSON is parsed in the pool too).
  await check('7.9 MB', 'a'.repeat(7_900_000), 4, /^prompt: at least 61720 prompt tokens \+ max_tokens 1 = 61721 exceeds the context length 2048 of model ref-gpt2$/);

  // A body over 1 MiB is parsed in the pool like any other: malformed JSON is 400 bad_json, a valid one is judged.
  const post = async (body: Buffer) => {
    const res = await request(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body });
    return { status: res.statusCode, body: (await res.body.json()) as any };
  };
  const prompt = 'word '.repeat(300_000);
  const broken = await post(Buffer.from(`{"model": "ref-gpt2", "prompt": "${prompt}", "max_tokens": 1`));
  assert.is(broken.status, 400);
  assert.is(broken.body.error.code, 'bad_json');
  const unknownField = await post(Buffer.from(JSON.stringify({ model: 'ref-gpt2', prompt, max_tokens: 1, best_of: 2 })));
  assert.is(unknownField.status, 400);
  assert.is(unknownField.body.error.message, 'unknown field: best_of');
});

it.run();
