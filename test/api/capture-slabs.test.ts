import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createHash } from 'node:crypto';
import { request } from 'undici';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { captureRequest, engineCaptureBody, postHashed, startCaptureStub, stubModel, type CaptureStub } from '../support/capture.ts';
import { captureSlabs, SlabBody, SlabPool } from '../../src/engine-client/slab-body.ts';

// The capture relay holds a plain-HTTP engine's body in slabs of a per-process pool (slab-body.ts),
// given back once the client's response has closed. The gateway runs in this process: its pool is
// the one imported here.
const slabs = suite('capture relay: pooled slabs');
let stub: CaptureStub;
let gw: TestGateway;

slabs.before(async () => {
  stub = await startCaptureStub();
  gw = await startTestGateway({ models: [stubModel(stub.url)] });
});
slabs.after(async () => {
  await gw?.stop();
  await stub?.stop();
});

const viaGateway = (req: Record<string, unknown>) => postHashed(`${gw.url}/v1/completions`, JSON.stringify(req), undefined, gw.authHeaders());
const allBack = () => until('every slab given back', async () => captureSlabs.lent === 0);

slabs('captures reuse the same slabs: none made after the first, and the free ones stay within the bound', async () => {
  const req = captureRequest('whole', 129);
  const direct = await postHashed(`${stub.url}/v1/completions`, engineCaptureBody(req));
  const first = await viaGateway(req);
  assert.is(first.sha256, direct.sha256);
  await allBack();
  const made = captureSlabs.created;
  assert.ok(made >= Math.ceil(first.bytes / captureSlabs.slabBytes), String(made));
  for (let i = 0; i < 20; i++) {
    const res = await viaGateway(req);
    assert.is(res.sha256, direct.sha256, `capture ${i}`);
    await allBack();
  }
  assert.is(captureSlabs.created, made, 'no slab made after the first capture');
  // A capture larger than the pool keeps: its extra slabs are dropped after it.
  const large = await viaGateway(captureRequest('whole', 1000));
  assert.is(large.status, 200, large.head);
  await allBack();
  assert.ok(captureSlabs.free * captureSlabs.slabBytes <= captureSlabs.keptBytes, String(captureSlabs.free));
});

slabs("a slab is not reused while the client's write of it is in flight: two concurrent captures both arrive byte-identical", async () => {
  const slow = captureRequest('whole', 1000); // 87 MB: more than the sockets buffer, so its write stays in flight
  const quick = captureRequest('whole', 129); // laid out at other offsets (its usage has fewer digits)
  const [slowDirect, quickDirect] = [await postHashed(`${stub.url}/v1/completions`, engineCaptureBody(slow)), await postHashed(`${stub.url}/v1/completions`, engineCaptureBody(quick))];
  for (let i = 0; i < 3; i++) {
    // The slow client takes the headers and reads nothing more until the quick capture has been relayed.
    const held = await request(`${gw.url}/v1/completions`, { method: 'POST', body: JSON.stringify(slow), headers: { 'content-type': 'application/json', ...gw.authHeaders() } });
    assert.is(held.statusCode, 200);
    for (let j = 0; j < 3; j++) assert.is((await viaGateway(quick)).sha256, quickDirect.sha256, `quick capture ${i}.${j}`);
    const hash = createHash('sha256');
    for await (const chunk of held.body) hash.update(chunk as Buffer);
    assert.is(hash.digest('hex'), slowDirect.sha256, `slow capture ${i}`);
  }
  await allBack();
});

slabs('a client that leaves while its capture is held or written gives every slab back', async () => {
  for (let i = 0; i < 10; i++) {
    const controller = new AbortController();
    const lentBefore = captureSlabs.lent;
    const res = fetch(`${gw.url}/v1/completions`, {
      method: 'POST',
      headers: { ...gw.authHeaders(), 'content-type': 'application/json' },
      body: JSON.stringify(captureRequest('whole', 1000)),
      signal: controller.signal,
    })
      .then((r) => r.arrayBuffer())
      .catch(() => null);
    // Left once the gateway has begun holding the body: after its first slab (i = 0), or a few more.
    while (captureSlabs.lent <= lentBefore + i) await new Promise((resolve) => setImmediate(resolve));
    controller.abort();
    await res;
    await allBack();
  }
  const after = await viaGateway(captureRequest('whole', 129));
  assert.is(after.status, 200, 'the gateway serves the next capture');
  await allBack();
});

slabs.run();

const pool = suite('capture relay: the slab pool');

pool('keeps free slabs up to its bound and drops the rest', () => {
  const p = new SlabPool(1024, 4096);
  const taken = Array.from({ length: 10 }, () => p.take());
  assert.equal([p.created, p.lent, p.free], [10, 10, 0]);
  for (const slab of taken) p.give(slab);
  assert.equal([p.created, p.lent, p.free], [10, 0, 4]);
  const again = [p.take(), p.take()];
  assert.equal([p.created, p.lent, p.free], [10, 2, 2]);
  assert.ok(taken.includes(again[0]) && taken.includes(again[1]), 'reused');
});

pool("a body nobody reads pauses the connection's reading, resumed once read; its chunks are the bytes, laid in slabs", async () => {
  const p = new SlabPool(1000, 4000);
  const calls: string[] = [];
  const body = new SlabBody(p, () => {});
  body.sink.flow!({ pause: () => calls.push('pause'), resume: () => calls.push('resume') });
  const sent = Buffer.from(Array.from({ length: 300_000 }, (_, i) => i % 251));
  for (let at = 0; at < sent.length; at += 70_000) assert.ok(body.sink.chunk(sent.subarray(at, at + 70_000)), 'taken whole');
  assert.equal(calls, ['pause'], 'paused once past its high-water mark');
  assert.is(p.lent, 300);
  const read: Buffer[] = [];
  body.on('data', (chunk: Buffer) => read.push(chunk));
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(calls, ['pause', 'resume']);
  assert.ok(read.every((chunk) => chunk.length <= 1000), 'views of the slabs');
  assert.ok(Buffer.concat(read).equals(sent));
  body.recycle();
  assert.equal([p.lent, p.free], [0, 4]);
  assert.is(body.sink.chunk(sent), false, 'a recycled body takes no more');
});

pool.run();
