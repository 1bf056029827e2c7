// A capture whose reservation is refused while the engine's early answer is being read into pooled
// slabs (capture-relay.ts, engine-client/slab-body.ts): the slabs go back to the pool. The gateway runs
// in this process (its pool is the one imported here) on PostgreSQL behind a proxy that cuts the
// database's connections during the request, so the reservation's append fails and it is refused. Skipped, saying why, without a reachable PostgreSQL.
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { captureRequest, postHashed, startCaptureStub, stubModel, type CaptureStub } from '../support/capture.ts';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy.ts';
import { postgresUnavailable, scratchDatabase } from '../support/postgres.ts';
import { captureSlabs } from '../../src/engine-client/slab-body.ts';

const databaseUrl = process.env.DATABASE_URL || null;
const skipReason = await postgresUnavailable(databaseUrl);
const test = suite('capture relay: a refused reservation gives its slabs back');
const it = skipReason ? test.skip : test;
if (skipReason) console.log(`capture-slabs-refused tests skipped: ${skipReason}`);

let stub: CaptureStub;
let gw: TestGateway;
let proxy: TcpProxy;
let database: Awaited<ReturnType<typeof scratchDatabase>>;

test.before(async () => {
  if (skipReason) return;
  stub = await startCaptureStub();
  database = await scratchDatabase(databaseUrl!, 'slabs');
  proxy = await startTcpProxy(database.url);
  gw = await startTestGateway({ models: [stubModel(stub.url)], databaseUrl: proxy.url });
});

test.after(async () => {
  if (skipReason) return;
  await gw?.stop();
  await stub?.stop();
  await proxy?.close();
  await database?.drop();
});

const viaGateway = (req: Record<string, unknown>) => postHashed(`${gw.url}/v1/completions`, JSON.stringify(req), undefined, gw.authHeaders());
const allBack = () => until('every slab given back', async () => captureSlabs.lent === 0, 20_000);

it('the capture read early for a reservation the store then refused: every slab back, and the next capture served', async () => {
  const capture = captureRequest('whole', 1000); // 87 MB: still being read when the refusal comes
  assert.is((await viaGateway(capture)).status, 200, 'a capture before');
  await allBack();
  // The database goes away: the reservation's append fails, after the early engine call has started.
  proxy.cut();
  const res = await viaGateway(capture);
  proxy.restore();
  assert.is.not(res.status, 200, `refused: ${res.head}`);
  await allBack();
  assert.is((await viaGateway(captureRequest('whole', 129))).status, 200, 'the next capture');
  await allBack();
});

test.run();
