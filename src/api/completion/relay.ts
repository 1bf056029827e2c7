/**
 * 8. Relay the engine's answer to the client, in one of four ways: a stream's SSE frames whole as they
 * arrive; a small body (or one whose logprob offsets are rewritten) gathered and sent in one go; a
 * capture once its envelope holds every requested layer (502 `capture_incomplete`); a larger body
 * through a tap that keeps its ends, gzipped on request. Each settles the request once it is over.
 * After a cold boot's commit, the 200 went out with the keepalives: the body (or an error object)
 * follows them (cold-boot.ts).
 */
import { Readable } from 'node:stream';
import type { FastifyReply } from 'fastify';
import { apiError } from '../../errors/index.ts';
import type { EngineResponse } from '../../engine-client/index.ts';
import type { PreparedCompletion } from '../../completion-request/index.ts';
import { checkCapture, type CheckedCapture } from '../capture-relay.ts';
import { bodyWithByteOffsets, needsByteOffsets, rewriteEngineStream } from '../stream-rewrite.ts';
import { acceptsGzip, feed, gzipStream, sendUncompressed } from '../compression.ts';
import { SseUsageRelay, UsageTail, usageFrom, type RelayedUsage } from '../usage-relay.ts';
import type { CompletionCall } from './call.ts';
import { cutShort, settle } from './settle.ts';

/** Bodies up to this size are gathered before sending rather than piped. */
const smallBodyBytes = 256 * 1024;

export function relay(call: CompletionCall, upstream: EngineResponse): FastifyReply | Promise<FastifyReply> {
  const { reply, completion } = call;
  reply.headers(call.upstreamHeaders());
  if (completion.maxTokensClamped) reply.header('x-svc-max-tokens-clamped', completion.maxTokensClamped);
  if (completion.stream) return relayStream(call, upstream);
  reply.header('content-type', 'application/json');
  const length = Number(upstream.headers['content-length'] ?? NaN);
  if ((length <= smallBodyBytes || needsByteOffsets(completion, length)) && !completion.capture) return relaySmallBody(call, upstream);
  if (completion.capture) return relayCapture(call, upstream);
  return relayLargeBody(call, upstream, length);
}

/** SSE frames are relayed whole as they arrive and never compressed, so no frame is held back. */
function relayStream(call: CompletionCall, upstream: EngineResponse): FastifyReply {
  const { request, reply, completion } = call;
  reply.header('content-type', 'text/event-stream; charset=utf-8').header('cache-control', 'no-cache').header('x-accel-buffering', 'no');
  // text_offset in bytes and prompt_logprobs: 0 delivered, as the contract says (stream-rewrite.ts).
  const modelId = completion.model.id;
  const contractual = rewriteEngineStream(upstream, completion, { engines: call.options.engines, modelId, requestId: request.id, upstreamHeaders: call.upstreamHeaders(), signal: call.controller.signal });
  const relay = relayEvents(contractual, request.id, call.upstreamHeaders(), completion.clientWantsUsage);
  call.relayed = relay.result;
  relay.once('close', () => settle(call, relay.result, 200));
  // Written by the relay itself, not piped by reply.send: its write callbacks say which frames the
  // client's socket took (relayedFrames), which a pipe's writes do not report.
  reply.hijack();
  if (!call.coldBoot?.handOver()) reply.raw.writeHead(reply.statusCode, reply.getHeaders() as Record<string, string | number>);
  relay.writeTo(reply.raw);
  return reply;
}

/**
 * A small body is gathered and written in one go: cheaper than a pipe for the common case. One with
 * logprobs is gathered whatever its size: its text_offset is made byte offsets (stream-rewrite.ts).
 */
async function relaySmallBody(call: CompletionCall, upstream: EngineResponse): Promise<FastifyReply> {
  const { reply, completion, coldBoot } = call;
  let whole: ArrayBuffer;
  try {
    whole = await upstream.body.arrayBuffer();
  } catch {
    // The client left (the engine call was cancelled) or the engine's connection broke: settled as cut short.
    settle(call, cutShort(), 502);
    if (call.clientLeft()) return reply;
    const broke = apiError('upstream_unreachable', 'the model server connection broke while sending the completion', { headers: call.upstreamHeaders() });
    // After a cold boot's commit the 200 went out with the keepalives: the error goes in the body, and they stop.
    if (coldBoot?.committed) return coldBoot.fail(broke);
    throw broke;
  }
  const body = bodyWithByteOffsets(Buffer.from(whole), completion);
  call.relayed = { usage: usageFrom(body.subarray(Math.max(0, body.length - 4096))), contentFrames: 0, relayedFrames: 0, completed: true };
  settle(call, call.relayed, 200);
  if (coldBoot?.committed) return coldBoot.end(body);
  return reply.send(body); // gzipped on its way out when the client accepts it (compression.ts)
}

/** A capture is relayed unchanged once its envelope holds every requested layer (capture-relay.ts). */
function relayCapture(call: CompletionCall, upstream: EngineResponse): FastifyReply | Promise<FastifyReply> {
  const { reply, completion, coldBoot, controller, earlyCapture } = call;
  const captured: RelayedUsage = earlyCapture?.relayed ?? cutShort();
  call.relayed = captured;
  // Settled, and its slabs given back, once the response is over: sent whole, refused (502), or left
  // by the client (maybe already, while the engine answered: then its 'close' has been and gone).
  const over = () => {
    upstream.body.destroy();
    upstream.recycle?.(); // nothing reads the body's chunks any more: the response has closed
    settle(call, captured, reply.statusCode);
  };
  if (call.clientLeft()) {
    over();
    return reply;
  }
  reply.raw.once('close', over);
  if (coldBoot?.committed) return coldBoot.sendCapture(upstream, completion.captureLayerCount, controller.signal, captured, earlyCapture?.checked ?? null);
  // Full-vocabulary prompt logprobs beside the capture compress well, and the contract gzips them on request.
  const gzip = completion.fullVocab && acceptsGzip(call.request);
  return sendCapture(reply, completion, upstream, call.upstreamHeaders(), controller.signal, captured, earlyCapture?.checked ?? null, gzip);
}

/** Larger bodies flow through a tap that keeps their first and last bytes, where `usage` is. */
function relayLargeBody(call: CompletionCall, upstream: EngineResponse, length: number): FastifyReply {
  const { request, reply } = call;
  const tail = new UsageTail();
  call.relayed = tail.result;
  upstream.body.once('error', (err) => tail.destroy(err));
  upstream.body.pipe(tail);
  tail.once('close', () => {
    upstream.body.destroy();
    settle(call, tail.result, reply.statusCode);
  });
  reply.raw.once('close', () => tail.destroy());
  if (call.coldBoot?.committed) return call.coldBoot.pipe(tail);

  if (acceptsGzip(request)) {
    // Fed with backpressure from the tap (a full-vocabulary body can be a gigabyte).
    const gzip = gzipStream(reply);
    void feed(tail, gzip);
    return reply.send(gzip);
  }
  if (Number.isFinite(length)) reply.header('content-length', length);
  return reply.send(tail);
}

/**
 * Relays SSE frames whole. The engine is always asked for usage (streams are always billed); its usage
 * frame is dropped unless the client asked for it. If the engine's connection breaks mid-stream, the
 * client gets the contract's mid-stream error (`data: {"error": ...}`) and `data: [DONE]` after the last
 * whole frame, never torn bytes.
 */
function relayEvents(upstream: EngineResponse, requestId: string, headers: Record<string, string>, forwardUsage: boolean): SseUsageRelay {
  const relay = new SseUsageRelay(forwardUsage);
  upstream.body.once('error', () => {
    const error = apiError('upstream_unreachable', 'the model server connection broke during the stream', { headers });
    relay.fail(`data: ${JSON.stringify(error.body(requestId))}\n\ndata: [DONE]\n\n`);
  });
  relay.once('close', () => upstream.body.destroy());
  upstream.body.pipe(relay);
  return relay;
}

/** A capture is relayed unchanged once its envelope holds every requested layer (see capture-relay.ts). */
async function sendCapture(reply: FastifyReply, prepared: PreparedCompletion, upstream: EngineResponse, headers: Record<string, string>, signal: AbortSignal, relayed: RelayedUsage, started: Promise<CheckedCapture | null> | null, gzip: boolean): Promise<FastifyReply> {
  const checked = await (started ?? checkCapture(upstream, prepared.captureLayerCount, headers, signal, relayed));
  if (checked === null) return reply; // the client left; nothing to answer
  sendUncompressed(reply);
  if (gzip) {
    const compressor = gzipStream(reply);
    void feed(Array.isArray(checked.body) ? Readable.from(checked.body) : checked.body, compressor);
    return reply.send(compressor);
  }
  if (checked.length !== null) reply.header('content-length', checked.length);
  if (!Array.isArray(checked.body)) return reply.send(checked.body);
  // The whole body is held: it leaves in one corked write, a writev of all its chunks, where a pipe
  // would write and wait for the socket to drain chunk by chunk (the capture bench: 11 MB in 64 KB
  // chunks). Each chunk is let go once the socket has sent it; a client that leaves closes the
  // response, which ends the engine's body and settles the request (the route's close listener).
  reply.hijack();
  const res = reply.raw;
  res.writeHead(reply.statusCode, reply.getHeaders() as Record<string, string | number>);
  res.cork();
  for (const chunk of checked.body) res.write(chunk);
  checked.body.length = 0;
  res.uncork();
  res.end();
  return reply;
}
