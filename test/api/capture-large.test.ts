import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { captureRequest, engineCaptureBody, postHashed, startCaptureStub, stubModel, type CaptureStub } from '../support/capture.ts';

// A 610 MB capture (16 layers x 6,980 positions x 2048, bf16 as base64): past V8's longest string, so a
// relay that made a string of the body could not serve it. One file, one gateway, both cases.
const large = suite('capture relay: 610 MB');
let stub: CaptureStub;
let gw: TestGateway;

large.before(async () => {
  stub = await startCaptureStub();
  gw = await startTestGateway({ models: [stubModel(stub.url)] });
});
large.after(async () => {
  await gw?.stop();
  await stub?.stop();
});

const POSITIONS = 6980;
const TENSOR_BASE64 = 4 * Math.ceil((16 * POSITIONS * 2048 * 2) / 3); // 609,921,708

large('every layer: byte-identical through the gateway (hashed while streaming)', async () => {
  const req = captureRequest('whole', POSITIONS);
  const direct = await postHashed(`${stub.url}/v1/completions`, engineCaptureBody(req));
  assert.is(direct.status, 200);
  assert.ok(direct.bytes > TENSOR_BASE64 && direct.bytes > 0x1fffffe8, `${direct.bytes} bytes: longer than V8's longest string`);
  const relayed = await postHashed(`${gw.url}/v1/completions`, JSON.stringify(req), undefined, gw.authHeaders());
  assert.is(relayed.status, 200, relayed.head);
  assert.is(relayed.bytes, direct.bytes);
  assert.is(relayed.sha256, direct.sha256);
  assert.is(relayed.headers['content-length'], String(direct.bytes));
});

large('fewer layers than requested: 502 capture_incomplete', async () => {
  const res = await postHashed(`${gw.url}/v1/completions`, JSON.stringify(captureRequest("fewer", POSITIONS)), undefined, gw.authHeaders());
  assert.is(res.status, 502, res.head);
  const body = JSON.parse(res.head);
  assert.is(body.error.code, 'capture_incomplete');
  assert.is(body.error.message, 'the activation capture returned 15 of 16 requested layers');
  assert.is(res.headers['x-svc-upstream-error-kind'], 'capture_incomplete');
});

large.run();
