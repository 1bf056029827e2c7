/**
 * The completion route's steps before the engine call, in order. Each refusal is recorded (metadata
 * only) and thrown for the error handler to answer; `false` means the client left and nothing is answered.
 */
import type { ModelConfig } from '../../config/index.ts';
import type { CompletionRequest, PreparedCompletion } from '../../completion-request/index.ts';
import { prepareValidCompletionAsync } from '../../completion-request/index.ts';
import { ColdBootWait } from '../cold-boot.ts';
import { tokensSeen } from './settle.ts';
import type { CompletionCall } from './call.ts';

/** 1. Validate: the body's first schema problem (400 `invalid_request` naming the field). */
export function validate(call: CompletionCall): CompletionRequest {
  if (call.request.validationError) throw refusedUnprepared(call, call.request.validationError);
  return call.request.body as CompletionRequest;
}

/** 2. Resolve the model the body names, or the default (400 `model_not_found`). */
export function resolveModel(call: CompletionCall, body: CompletionRequest): ModelConfig {
  try {
    return call.options.context.registry.resolve(body.model);
  } catch (error) {
    throw refusedUnprepared(call, error);
  }
}

/**
 * 3. Preflight: the rules that need the model (fan-out, logprobs, activations, deadline, context; 400s
 * and 503 `tokenizer_unavailable`), each text prompt tokenized once (long ones off the event loop), the
 * engine body made. A default max_tokens on a model of unknown context is sized to what its engine
 * reports (engine-context.ts).
 */
export async function preflight(call: CompletionCall, body: CompletionRequest, model: ModelConfig): Promise<PreparedCompletion> {
  let prepared: PreparedCompletion;
  try {
    prepared = await call.route.contextLengths.fit(await prepareValidCompletionAsync(body, call.options.context, model));
  } catch (error) {
    throw refusedUnprepared(call, error);
  }
  call.prepared = call.completion = prepared;
  call.requestFacts = call.facts(prepared.model.id, prepared.user);
  // The request's log line (request-log.ts) names the model and, read when it ends, the tokens relayed so far.
  call.request.served = { model: prepared.model.id, tokens: () => tokensSeen(call.relayed, prepared) };
  return prepared;
}

/** 4. The backend's circuit breaker, before anything is held: an open one refuses at once (503 `circuit_open`). */
export async function checkBreaker(call: CompletionCall): Promise<void> {
  const backends = call.options.backends;
  if (!backends) return;
  try {
    const admitted = backends.admit(call.prepared.model.id);
    call.backendCall = admitted instanceof Promise ? await admitted : admitted;
  } catch (error) {
    throw call.refusedPrepared(error);
  }
}

/**
 * 5. Cold boot: holds the model's engine up until the response closes and watches the client (one that
 * goes away cancels the upstream request and leaves the key's queue). A cold model's boot is waited
 * for up to its acknowledgement and the grace, before anything is held: one that stalls or fails by
 * then is refused (503 `platform_cold_boot`) with no reservation made or left. False: the client left.
 */
export async function awaitColdBoot(call: CompletionCall): Promise<boolean> {
  const { reply, prepared, controller } = call;
  call.coldBoot = ColdBootWait.begin(call.options.coldBoots, prepared.model.id, reply, prepared.stream, call.upstreamHeaders());
  reply.raw.once('close', () => {
    if (!reply.raw.writableFinished) controller.abort();
  });
  const booting = call.coldBoot?.beforeAdmission(controller.signal);
  if (!booting) return true;
  try {
    await booting;
    return true;
  } catch (error) {
    if (controller.signal.aborted) return false; // the client left; nothing was held
    call.backendCall?.failed(error);
    throw call.refusedPrepared(error);
  }
}

/**
 * 6. Reserve: the worst case (prompt + max_tokens × choices) is reserved in memory, limits and budgets
 * decided at once, queueing FIFO when the key's slots are taken (429 `budget_exceeded`, `spend_cap`,
 * `queue_full`, `rate_limited`; 403 `invalid_api_key`). The engine call waits for it to be durable
 * (engine-call.ts). False: the client left the queue, nothing to answer.
 */
export async function reserve(call: CompletionCall): Promise<boolean> {
  const { key, prepared } = call;
  const metering = call.options.metering;
  if (!key || !metering) return true;
  const caps = prepared.model.capabilities;
  try {
    call.admission = await metering.meter.admit({
      key: key.current,
      keyId: key.keyId,
      facts: call.requestFacts,
      inputTokens: prepared.promptTokens,
      maxTokens: prepared.maxTokens,
      maxTokensRequested: prepared.maxTokensSource === 'client' ? prepared.maxTokensRequested : null,
      choices: prepared.promptCount * prepared.n,
      limits: { maxActive: caps.max_inflight_per_key, maxQueued: caps.max_queued_per_key, perMinute: caps.rate_limit_per_minute },
      signal: call.controller.signal,
    });
    return true;
  } catch (error) {
    if (call.controller.signal.aborted) return false; // left the queue: nothing to answer
    throw call.refusedPrepared(error);
  }
}

/** A refusal before the request is prepared: recorded with the model and user the body names, if strings. */
function refusedUnprepared(call: CompletionCall, error: unknown): unknown {
  const body = call.request.body as { model?: unknown; user?: unknown } | null;
  return call.refused(error, typeof body?.model === 'string' ? body.model : null, typeof body?.user === 'string' ? body.user : null, 0);
}
