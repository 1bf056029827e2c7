/**
 * 7. Call the engine. A reservation in this process's slot lease starts the engine at once, its
 * append alongside (no other process can take that slot meanwhile); any other waits until the
 * reservation is durable: decided in memory, it can still be refused on fresh state (another process
 * took the key's last slot or budget first), and an engine call made on it would count against the
 * key's 16 at the engine. Either way no byte reaches the client before the reservation is durable.
 */
import { apiError, ApiError } from '../../errors/index.ts';
import type { EngineResponse } from '../../engine-client/index.ts';
import { lowerMaxTokens, type PreparedCompletion } from '../../completion-request/index.ts';
import type { Admission, Reservation, Voiding } from '../../metering/index.ts';
import { checkCapture } from '../capture-relay.ts';
import type { RelayedUsage } from '../usage-relay.ts';
import { deadlineReason, type CompletionCall } from './call.ts';
import { cutShort, settle } from './settle.ts';

/**
 * The engine's answer (its headers; the body follows), or null when there is nothing more to do: the
 * client left, or a cold boot's committed 200 carries the error in its body. Otherwise a failure is
 * thrown (the engine's 400 `engine_*`, 502 `upstream_*`/`engine_*`, 504 `upstream_deadline`, 503
 * `wrapper_saturated`, or the reservation's refusal on fresh state), settled first and told to the
 * breaker.
 */
export async function callEngine(call: CompletionCall): Promise<EngineResponse | null> {
  call.gpuStarted = performance.now();
  let upstream: EngineResponse;
  try {
    upstream = call.admission ? await callReserved(call, call.admission) : await dispatch(call, call.completion, call.controller.signal);
  } catch (err) {
    // A client that left while the model booted used nothing: the engine was never called.
    settle(call, call.controller.signal.aborted && !call.coldBoot?.leftDuringBoot ? cutShort() : null, err instanceof ApiError ? err.status : 500);
    if (call.clientLeft()) return null; // the client left: nothing to answer, and no fault of the backend's
    call.backendCall?.failed(err);
    if (call.coldBoot?.committed) {
      call.coldBoot.fail(err); // 200 went out with the keepalives: the error goes in the body
      return null;
    }
    throw err;
  }
  upstream.body.once('close', upstream.release);
  call.backendCall?.succeeded();
  call.options.onServed?.(call.prepared.model.id, call.engineCall.gatewayMs + performance.now() - call.engineCall.answeredAt);
  return upstream;
}

/** With a reservation: the early call (in a slot lease) or the call once the reservation is durable. */
async function callReserved(call: CompletionCall, admission: Admission): Promise<EngineResponse> {
  const { prepared, controller } = call;
  const atLimit = (reservation: Reservation) => lowerMaxTokens(prepared, reservation.maxTokens);
  const early = admission.startNow ? startEarly(call, atLimit(admission), admission.voiding) : null;
  // A capture's body is read and checked as it arrives, while the reservation becomes durable too
  // (only sending it waits for that): held back, the engine's socket would stall meanwhile.
  if (early && prepared.capture) {
    const relayedEarly: RelayedUsage = cutShort();
    const checked = early.then((r) => checkCapture(r, prepared.captureLayerCount, call.upstreamHeaders(), controller.signal, relayedEarly));
    checked.catch(() => {}); // awaited, and its error thrown, only if the early call is the one answered
    call.earlyCapture = { relayed: relayedEarly, checked };
  }
  let stored: Reservation;
  let durableAt = 0;
  try {
    stored = await admission.durable;
    durableAt = performance.now();
  } catch (error) {
    call.admission = null; // nothing was reserved: nothing to settle
    // The early call is not answered: its body, if any, is let go, and its slabs (nothing will send them).
    if (early) void early.then((r) => r.recycle?.(), () => {});
    throw call.refusedPrepared(error);
  }
  call.completion = atLimit(stored);
  // Voided: decided again otherwise (fewer tokens now fit, say); the early call was cancelled. Its
  // replacement holds the same slot, so it starts once the cancelled call has ended on this side
  // (its connection closed), not beside it: the key's running requests at the engine stay in bound.
  if (early && !admission.voiding.voided) {
    const upstream = await early;
    call.route.writeOrder.observe(prepared.model.id, call.engineCall.answeredAt - call.engineCall.postedAt, durableAt - call.engineCall.postedAt);
    return upstream;
  }
  call.earlyCapture = null;
  if (early) {
    await early.then((r) => r.body.destroyed || new Promise((closed) => r.body.once('close', closed)), () => {});
    void early.then((r) => r.recycle?.(), () => {}); // its capture's check, if any, is over and unused
  }
  return dispatch(call, call.completion, controller.signal);
}

/**
 * The engine call made before the reservation is durable, on a signal of its own: the client's
 * leaving (or the deadline) cancels it, and so does the reservation's voiding, which also drops a
 * response that came meanwhile.
 */
function startEarly(call: CompletionCall, completion: PreparedCompletion, voiding: Voiding): Promise<EngineResponse> {
  const { controller } = call;
  const modelId = call.prepared.model.id;
  const cancel = new AbortController();
  if (controller.signal.aborted) cancel.abort(controller.signal.reason);
  else controller.signal.addEventListener('abort', () => cancel.abort(controller.signal.reason), { once: true });
  voiding.onVoided(() => cancel.abort());
  // Its reservation's append goes out alongside the engine call's write, the longer wait first (WriteOrder).
  const response = dispatch(call, completion, cancel.signal, () => call.options.metering?.meter.sendDecisions(call.route.writeOrder.appendFirst(modelId)));
  response.then(
    (r) =>
      voiding.onVoided(() => {
        r.body.destroy();
        r.release();
      }),
    () => {}, // awaited, and its error thrown, only if not voided
  );
  return response;
}

/**
 * One engine call, after the cold boot (bounded by its own safety deadline: a boot that never finishes
 * is platform_cold_boot, no fault of the engine's); the request window times a non-streaming
 * generation from the engine call on (504 `upstream_deadline`). `posted`: called once the call is on
 * its way (its write queued), before it is answered.
 */
async function dispatch(call: CompletionCall, completion: PreparedCompletion, signal: AbortSignal, posted?: () => void): Promise<EngineResponse> {
  const { controller, engineCall } = call;
  const { engines, requestWindowMs } = call.options;
  const modelId = call.prepared.model.id;
  let deadline: NodeJS.Timeout | null = null;
  try {
    const entered = performance.now();
    await call.coldBoot?.waitOut(signal, call.admission?.durable ?? Promise.resolve(), completion.maxTokensClamped);
    if (!completion.stream) deadline = setTimeout(() => controller.abort(deadlineReason), requestWindowMs);
    // A capture's body is held (capture-relay.ts): read into pooled slabs, no allocation per read.
    const pending = (completion.capture ? engines.postCapture : engines.post).call(engines, modelId, '/v1/completions', JSON.stringify(completion.engineBody), signal);
    const postedAt = performance.now();
    posted?.();
    const response = await pending;
    if (!signal.aborted) {
      engineCall.gatewayMs = entered - call.started;
      engineCall.postedAt = postedAt;
      engineCall.answeredAt = performance.now();
    }
    return response;
  } catch (err) {
    if (controller.signal.reason === deadlineReason) {
      throw apiError('upstream_deadline', `generation did not finish within the ${Math.round(requestWindowMs / 1000)} s request window and was cancelled`, {
        headers: engines.upstreamHeaders(modelId),
      });
    }
    throw err;
  } finally {
    if (deadline) clearTimeout(deadline);
  }
}
