// A tokenizer thread of the pool (pool.ts): loads each tokenizer it is asked for once (from its spec, as the main
// thread does) and answers each job with the prompts' token counts or ids; it also parses large JSON bodies.
import { parentPort } from 'node:worker_threads';
import { loadTokenizer, type TokenizerSpec } from './index.ts';

export type PoolJob = TokenizeJob | { id: number; want: 'json'; bytes: Uint8Array };

export interface TokenizeJob {
  id: number;
  spec: TokenizerSpec;
  texts: string[];
  addSpecialTokens: boolean;
  /** counts: one number per text; ids: one Int32Array per text (transferred). */
  want: 'counts' | 'ids';
}

export type TokenizeReply = { id: number; counts: number[] } | { id: number; ids: Int32Array[] } | { id: number; value: unknown } | { id: number; error: string };

const port = parentPort!;
port.on('message', (job: PoolJob) => {
  if (job.want === 'json') {
    try {
      port.postMessage({ id: job.id, value: JSON.parse(Buffer.from(job.bytes.buffer, job.bytes.byteOffset, job.bytes.length).toString('utf8')) } satisfies TokenizeReply);
    } catch (err) {
      port.postMessage({ id: job.id, error: (err as Error)?.message ?? String(err) } satisfies TokenizeReply);
    }
    return;
  }
  loadTokenizer(job.spec).then(
    (tokenizer) => {
      try {
        if (job.want === 'counts') {
          port.postMessage({ id: job.id, counts: job.texts.map((text) => tokenizer.encode(text, job.addSpecialTokens).length) } satisfies TokenizeReply);
        } else {
          const ids = job.texts.map((text) => Int32Array.from(tokenizer.encode(text, job.addSpecialTokens)));
          port.postMessage({ id: job.id, ids } satisfies TokenizeReply, ids.map((a) => a.buffer));
        }
      } catch (err) {
        port.postMessage({ id: job.id, error: (err as Error)?.message ?? String(err) } satisfies TokenizeReply);
      }
    },
    (err: Error) => port.postMessage({ id: job.id, error: err?.message ?? String(err) } satisfies TokenizeReply),
  );
});
