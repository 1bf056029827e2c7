/**
 * Which of a metered request's two writes goes first when its engine call starts alongside its
 * reservation's append (a reservation in the process's slot lease): the one whose answer usually comes
 * later, since the response waits for both. Per model, a moving share of such requests whose engine
 * answered before their reservation was durable, each timed from when both were asked for; a share
 * over half puts the append first. Until a model has one, the engine call goes first (a real engine
 * takes longer than a commit). Against an engine that answers at once the commit is the later, and
 * writing it first saves it the engine call's write (about 0.1 ms); against a 20 ms engine the append
 * first would cost the engine call 0.3-0.4 ms, what a write to a sleeping PostgreSQL backend costs its
 * writer on this VM (BENCHMARKS.md, gateway). A share, not mean times: one long answer does not flip it.
 */
export class WriteOrder {
  /** Per model: the moving share of early requests whose engine answered first. */
  readonly #engineFirst = new Map<string, number>();

  /** The append goes before the engine call for this model. */
  appendFirst(modelId: string): boolean {
    return (this.#engineFirst.get(modelId) ?? 0) > 0.5;
  }

  /** One request's two waits, both timed from when the engine call and the append were asked for. */
  observe(modelId: string, engineMs: number, commitMs: number): void {
    const answeredFirst = engineMs < commitMs ? 1 : 0;
    const share = this.#engineFirst.get(modelId);
    this.#engineFirst.set(modelId, share === undefined ? answeredFirst : share + (answeredFirst - share) * weight);
  }
}

/** Each request's weight in the share: about the last 20 requests count. */
const weight = 0.1;
