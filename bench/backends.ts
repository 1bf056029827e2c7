/**
 * What the circuit breaker costs a request: `BackendService.admit` and the call's `succeeded()` on a
 * closed breaker (what every request to a healthy backend does), timed over a million calls, next to
 * the same loop without them, in one run. The gateway bench gives the request's whole CPU to compare
 * with, and the projections' share (backend_health among them) with and without them in one run.
 *   node --import tsx bench/backends.ts [calls, default 1,000,000]
 */
import { CommandHandler } from '../src/command-handler/index.ts';
import { BackendService } from '../src/backends/index.ts';
import { openEventStore } from '../src/store/index.ts';

const calls = Number(process.argv[2] ?? 1_000_000);
const store = await openEventStore({ inMemory: true });
const handler = new CommandHandler({ store });
const service = new BackendService({ handler });
await service.start([{ id: 'bench' }]);

let sink = 0;
function withBreaker(n: number): number {
  const started = performance.now();
  for (let i = 0; i < n; i++) {
    const call = service.admit('bench');
    if (call instanceof Promise) throw new Error('the breaker should be closed');
    call.succeeded();
    sink += i;
  }
  return performance.now() - started;
}
function without(n: number): number {
  const started = performance.now();
  for (let i = 0; i < n; i++) sink += i;
  return performance.now() - started;
}
withBreaker(calls / 10); // warm-up: JIT
without(calls / 10);
const rounds = [1, 2, 3].map(() => ({ breaker: withBreaker(calls), bare: without(calls) }));
const ns = (ms: number) => ((ms * 1e6) / calls).toFixed(1);
const best = rounds.reduce((a, b) => (a.breaker - a.bare <= b.breaker - b.bare ? a : b));
process.stdout.write(
  `breaker check on a closed breaker (admit + succeeded), ${calls.toLocaleString('en-US')} calls, best of 3: ${ns(best.breaker)} ns per request, ${ns(best.bare)} ns for the bare loop: ${ns(best.breaker - best.bare)} ns the check's own (appends made: ${(await store.readAll(store.start, 10)).length})\n`,
);
void sink;
await service.stop();
await store.close();
