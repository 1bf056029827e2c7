/**
 * The dispatch transport contract: every transport passes the same suite (in-process.test.ts,
 * postgres.test.ts on PGlite and, with DATABASE_URL, PostgreSQL). Each test uses kinds of its own, so
 * tests sharing one table cannot see each other's messages.
 *
 * Idle consumers poll only once a minute here: a test that waits for a delivery within seconds
 * passes only through a wake-up (a publish heard, a backoff or a lease whose end the consumer
 * computed), never through the poll.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import { DispatchClosed, DispatchStopping, type DispatchConsumer, type DispatchMessage, type DispatchTransport } from '../../src/dispatch/index.ts';
import { until } from '../support/until.ts';
import { within } from '../support/within.ts';

/** What a test may set on the transports it opens; a harness passes each on, filling the rest from `contractTiming`. */
export interface ContractTiming {
  visibilityTimeoutMs: number;
  pollIntervalMs: number;
  retryBackoffMs: number;
  stopGraceMs: number;
}

export const contractTiming: ContractTiming = {
  visibilityTimeoutMs: 400,
  pollIntervalMs: 60_000,
  retryBackoffMs: 50,
  stopGraceMs: 5_000,
};

export interface TransportHarness {
  name: string;
  setup?(): Promise<void>;
  /**
   * Two handles on one queue: on PostgreSQL two transports over two stores (separate connections),
   * on PGlite two transports over one store, in process the same transport twice.
   */
  pair(timing: ContractTiming): Promise<[DispatchTransport, DispatchTransport]>;
  teardown?(): Promise<void>;
}

/** The bound on every wait for the transport to do something by itself. */
const waitLimitMs = 5_000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const kindOf = (label: string) => `${label}-${randomUUID().slice(0, 8)}`;

interface Gate {
  promise: Promise<void>;
  open(): void;
}
/** Every gate a test made: opened after it whatever happened, so no handler is left waiting on one. */
const gates = new Set<Gate>();
function gate(): Gate {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  const made = { promise, open };
  gates.add(made);
  return made;
}

/**
 * A handler's work that ends only when its signal aborts (rejecting with the reason), or, should the
 * abort never come, after `limitMs`: the test then fails instead of leaving a handler that keeps the file alive.
 */
export function abortedOrGiveUp(signal: AbortSignal, limitMs = waitLimitMs * 2): Promise<never> {
  return new Promise<never>((_, reject) => {
    const timer = setTimeout(() => reject(new Error('the signal never aborted')), limitMs);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });
}

/** Waits for `probe` with the contract's bound, polling every 5 ms. */
const waitFor = <T>(what: string, probe: () => T | null | undefined | false) => until(what, async () => probe(), waitLimitMs, 5);

export function transportContract(harness: TransportHarness): void {
  const it = suite<{ opened: DispatchTransport[]; consumers: DispatchConsumer[] }>(`dispatch transport contract (${harness.name})`);

  /** Transports and consumers a test opens, closed after it whatever happened. */
  const open = async (context: { opened: DispatchTransport[] }, timing: Partial<ContractTiming> = {}) => {
    const pair = await harness.pair({ ...contractTiming, ...timing });
    context.opened.push(...pair);
    return pair;
  };

  it.before(async () => {
    await harness.setup?.();
  });
  it.after(async () => {
    await harness.teardown?.();
  });
  it.before.each((context) => {
    context.opened = [];
    context.consumers = [];
  });
  it.after.each(async (context) => {
    for (const g of gates) g.open();
    gates.clear();
    await Promise.all(context.consumers.map((c) => within(waitLimitMs * 2, c.stop(), 'a consumer stops after a test')));
    await Promise.all(context.opened.map((t) => within(waitLimitMs * 2, t.close(), 'a transport closes after a test')));
  });

  it('a published message reaches a consumer with its kind, key, payload and deliveries 1; once acknowledged the key can be published again', async (context) => {
    const [transport] = await open(context);
    const kind = kindOf('job');
    const payload = { job_id: 'hj_1', nested: { list: [1, 'two', null], flag: true } };
    assert.is(await transport.publish(kind, 'hj_1', payload), true);
    const got: DispatchMessage[] = [];
    context.consumers.push(transport.consume(kind, async (message) => void got.push(message)));
    await waitFor('the first delivery', () => got.length === 1);
    assert.is(got[0].kind, kind);
    assert.is(got[0].key, 'hj_1');
    assert.equal(got[0].payload, payload);
    assert.is(got[0].deliveries, 1);
    assert.type(got[0].id, 'string');
    // refused while the acknowledgement is on its way, accepted once it has removed the message
    await until('the key accepted again after the acknowledgement', () => transport.publish(kind, 'hj_1', { again: true }), waitLimitMs, 5);
    await waitFor('the second message', () => got.length === 2);
    assert.equal(got[1].payload, { again: true });
    assert.is(got[1].deliveries, 1);
    assert.is.not(got[1].id, got[0].id);
  });

  it('publish refuses a second message of the same kind and key while one waits, and accepts the key under another kind', async (context) => {
    const [transport] = await open(context);
    const kind = kindOf('job');
    const other = kindOf('other');
    assert.is(await transport.publish(kind, 'a', { n: 1 }), true);
    assert.is(await transport.publish(kind, 'a', { n: 2 }), false);
    assert.is(await transport.publish(other, 'a', { n: 3 }), true);
    assert.is(await transport.publish(kind, 'z', { n: 4 }), true);
    const got: string[] = [];
    context.consumers.push(transport.consume(kind, async (m) => void got.push(`${m.key}:${m.payload.n}`)));
    await waitFor('the later message', () => got.includes('z:4'));
    // oldest first, so a second 'a' would have come before 'z'
    assert.equal(got, ['a:1', 'z:4']);
  });

  it('publish refuses the key while its message is in flight, and accepts it once the handler has resolved', async (context) => {
    const [transport] = await open(context);
    const kind = kindOf('job');
    const release = gate();
    const got: DispatchMessage[] = [];
    context.consumers.push(
      transport.consume(kind, async (message) => {
        got.push(message);
        if (got.length === 1) await release.promise;
      }),
    );
    await transport.publish(kind, 'k', {});
    await waitFor('the delivery', () => got.length === 1);
    assert.is(await transport.publish(kind, 'k', {}), false, 'in flight');
    release.open();
    await until('the key accepted after the acknowledgement', () => transport.publish(kind, 'k', {}), waitLimitMs, 5);
    await waitFor('the new message delivered', () => got.length === 2);
    assert.is(got[1].deliveries, 1);
  });

  it('a consumer gets only its own kind; the other kind waits for its consumer', async (context) => {
    const [transport] = await open(context);
    const mine = kindOf('mine');
    const theirs = kindOf('theirs');
    await transport.publish(theirs, 'x', {});
    await transport.publish(mine, 'y', {});
    const got: string[] = [];
    context.consumers.push(transport.consume(mine, async (m) => void got.push(`${m.kind}/${m.key}`)));
    await waitFor('the own kind delivered', () => got.length === 1);
    assert.equal(got, [`${mine}/y`]);
    assert.is(await transport.publish(theirs, 'x', {}), false, 'still waiting for a consumer of its kind');
    const theirsGot: string[] = [];
    context.consumers.push(transport.consume(theirs, async (m) => void theirsGot.push(m.key)));
    await waitFor('the other kind delivered to its consumer', () => theirsGot.length === 1);
    assert.equal(got, [`${mine}/y`]);
  });

  it('a consumer runs at most `concurrency` handlers at once, and that many when there is work', async (context) => {
    const [transport] = await open(context);
    const kind = kindOf('job');
    for (let i = 0; i < 7; i++) await transport.publish(kind, `m${i}`, {});
    let running = 0;
    let most = 0;
    const started: Gate[] = [];
    const done: string[] = [];
    context.consumers.push(
      transport.consume(
        kind,
        async (message) => {
          running += 1;
          most = Math.max(most, running);
          const g = gate();
          started.push(g);
          await g.promise;
          running -= 1;
          done.push(message.key);
        },
        { concurrency: 3 },
      ),
    );
    await waitFor('three handlers at once', () => running === 3);
    for (let opened = 0; opened < 7; opened++) {
      await waitFor(`handler ${opened + 1} started`, () => started.length > opened);
      started[opened].open();
    }
    await waitFor('every message handled', () => done.length === 7);
    assert.is(most, 3);
    assert.equal([...done].sort(), ['m0', 'm1', 'm2', 'm3', 'm4', 'm5', 'm6']);
  });

  it('without options a consumer handles one message at a time, oldest first', async (context) => {
    const [transport] = await open(context);
    const kind = kindOf('job');
    const keys = ['e', 'd', 'c', 'b', 'a'];
    for (const key of keys) await transport.publish(kind, key, {});
    let running = 0;
    let most = 0;
    const got: string[] = [];
    context.consumers.push(
      transport.consume(kind, async (message) => {
        running += 1;
        most = Math.max(most, running);
        await sleep(5);
        got.push(message.key);
        running -= 1;
      }),
    );
    await waitFor('every message', () => got.length === keys.length);
    assert.is(most, 1);
    assert.equal(got, keys, 'publish order');
  });

  it('a handler that throws gets the message again after the backoff, deliveries counting up, until it resolves', async (context) => {
    const failures: unknown[] = [];
    const [transport] = await open(context, { retryBackoffMs: 60 });
    const kind = kindOf('job');
    const seen: Array<{ id: string; deliveries: number; at: number }> = [];
    context.consumers.push(
      transport.consume(kind, async (message) => {
        seen.push({ id: message.id, deliveries: message.deliveries, at: performance.now() });
        if (message.deliveries < 3) {
          failures.push(message.deliveries);
          throw new Error(`failure ${message.deliveries}`);
        }
      }),
    );
    await transport.publish(kind, 'flaky', {});
    await waitFor('the third delivery', () => seen.length === 3);
    assert.equal(seen.map((s) => s.deliveries), [1, 2, 3]);
    assert.is(new Set(seen.map((s) => s.id)).size, 1, 'the same message');
    // backoff doubles: 60 ms after the first failure, 120 after the second (timers may fire a little early)
    assert.ok(seen[1].at - seen[0].at >= 50, `second delivery ${seen[1].at - seen[0].at} ms after the first`);
    assert.ok(seen[2].at - seen[1].at >= 110, `third delivery ${seen[2].at - seen[1].at} ms after the second`);
    await until('removed once resolved', () => transport.publish(kind, 'flaky', {}), waitLimitMs, 5);
  });

  it('two consumers (on PostgreSQL, two connections) never hold the same message at once, and every message is handled once', async (context) => {
    // A visibility timeout a busy machine cannot outlast by accident: this test is about sharing, not lapses.
    const [first, second] = await open(context, { visibilityTimeoutMs: 30_000 });
    const kind = kindOf('job');
    const count = 24;
    const holding = new Set<string>();
    const overlaps: string[] = [];
    const handled: Array<{ key: string; by: string; deliveries: number }> = [];
    const handler = (by: string) => async (message: DispatchMessage) => {
      if (holding.has(message.key)) overlaps.push(message.key);
      holding.add(message.key);
      await sleep(3);
      holding.delete(message.key);
      handled.push({ key: message.key, by, deliveries: message.deliveries });
    };
    context.consumers.push(first.consume(kind, handler('first'), { concurrency: 3 }), second.consume(kind, handler('second'), { concurrency: 3 }));
    for (let i = 0; i < count; i++) await (i % 2 ? first : second).publish(kind, `m${i}`, { i });
    await waitFor('every message handled', () => handled.length >= count);
    await sleep(50); // a double delivery would show up here
    assert.equal(overlaps, []);
    assert.is(handled.length, count, 'each once');
    assert.is(new Set(handled.map((h) => h.key)).size, count);
    assert.ok(handled.every((h) => h.deliveries === 1), 'never redelivered');
  });

  it('a heartbeat keeps a long handler\'s message from other consumers well past the visibility timeout', async (context) => {
    const visibilityTimeoutMs = 300;
    const [first, second] = await open(context, { visibilityTimeoutMs });
    const kind = kindOf('job');
    const firstGot: DispatchMessage[] = [];
    const secondGot: DispatchMessage[] = [];
    const finish = gate();
    context.consumers.push(
      first.consume(kind, async (message) => {
        firstGot.push(message);
        await finish.promise;
      }),
    );
    await first.publish(kind, 'long', {});
    await waitFor('the first consumer holds it', () => firstGot.length === 1);
    context.consumers.push(second.consume(kind, async (message) => void secondGot.push(message)));
    await sleep(visibilityTimeoutMs * 4); // four lapses of the visibility timeout the heartbeat must prevent
    assert.equal(secondGot, []);
    finish.open();
    await until('acknowledged', () => first.publish(kind, 'after', {}), waitLimitMs, 5);
    await waitFor('a later message reaches the consumers', () => firstGot.length + secondGot.length === 2);
    assert.ok(![...firstGot, ...secondGot].some((m) => m.key === 'long' && m.deliveries > 1), 'the long one was never redelivered');
  });

  it('an idle consumer is woken by a publish (on PostgreSQL, from another connection) long before its poll', async (context) => {
    const [publisher, consumerSide] = await open(context);
    const kind = kindOf('job');
    const got: Array<{ key: string; at: number }> = [];
    context.consumers.push(consumerSide.consume(kind, async (m) => void got.push({ key: m.key, at: performance.now() })));
    await publisher.publish(kind, 'first', {});
    await waitFor('the first message', () => got.length === 1);
    await sleep(100); // the consumer goes back to waiting (sooner only makes this easier to pass)
    const sent = performance.now();
    await publisher.publish(kind, 'second', {});
    await within(3_000, waitFor('the second message', () => got.length === 2), 'a wake-up (the poll is a minute)');
    assert.ok(got[1].at - sent < 3_000);
  });

  it('stop takes no more messages and waits for the handlers in flight; the rest wait for another consumer', async (context) => {
    const [first, second] = await open(context);
    const kind = kindOf('job');
    const finish = gate();
    const got: string[] = [];
    const consumer = first.consume(kind, async (message) => {
      got.push(message.key);
      await finish.promise;
    });
    context.consumers.push(consumer);
    await first.publish(kind, 'a', {});
    await waitFor('a in flight', () => got.length === 1);
    let stopped = false;
    const stopping = consumer.stop().then(() => (stopped = true));
    await first.publish(kind, 'b', {});
    await sleep(100);
    assert.is(stopped, false, 'waits for the handler');
    finish.open();
    await within(waitLimitMs, stopping, 'stop once the handler resolved');
    assert.equal(got, ['a'], 'b not taken by a stopping consumer');
    assert.is(await first.publish(kind, 'a', {}), true, 'a was acknowledged');
    assert.is(await first.publish(kind, 'b', {}), false, 'b still waits');
    const later: string[] = [];
    context.consumers.push(second.consume(kind, async (m) => void later.push(m.key)));
    await waitFor('b and the new a delivered to another consumer', () => later.length === 2);
    assert.equal(later.sort(), ['a', 'b']);
  });

  it('stop aborts a handler still running after the grace; its message goes to another consumer at once, not after a backoff', async (context) => {
    const [first, second] = await open(context, { stopGraceMs: 100, retryBackoffMs: 60_000 });
    const kind = kindOf('job');
    let reason: unknown = null;
    let started = false;
    const consumer = first.consume(kind, async (_message, signal) => {
      started = true;
      signal.addEventListener('abort', () => (reason = signal.reason));
      await abortedOrGiveUp(signal);
    });
    context.consumers.push(consumer);
    await first.publish(kind, 'stuck', {});
    await waitFor('the handler running', () => started);
    await within(waitLimitMs, consumer.stop(), 'stop after the grace');
    assert.instance(reason, DispatchStopping);
    const later: DispatchMessage[] = [];
    context.consumers.push(second.consume(kind, async (m) => void later.push(m)));
    await waitFor('the message handed to another consumer', () => later.length === 1);
    assert.is(later[0].key, 'stuck');
    assert.is(later[0].deliveries, 2);
  });

  it('close stops its consumers, waiting for their handlers; publishing or consuming after it is refused with DispatchClosed', async (context) => {
    const [transport] = await open(context);
    const kind = kindOf('job');
    const finish = gate();
    let started = false;
    let settled = false;
    transport.consume(kind, async () => {
      started = true;
      await finish.promise;
      settled = true;
    });
    await transport.publish(kind, 'a', {});
    await waitFor('the handler running', () => started);
    let closed = false;
    const closing = transport.close().then(() => (closed = true));
    let closedAgain = false;
    void transport.close().then(() => (closedAgain = true));
    await sleep(50);
    assert.is(closed, false, 'close waits for the handler');
    assert.is(closedAgain, false, 'so does a second close meanwhile');
    finish.open();
    await within(waitLimitMs, closing, 'close');
    assert.ok(settled);
    try {
      await transport.publish(kind, 'b', {});
      assert.unreachable('publish after close');
    } catch (error) {
      assert.instance(error, DispatchClosed);
    }
    assert.throws(() => transport.consume(kind, async () => {}), (error: unknown) => error instanceof DispatchClosed);
  });

  it('a concurrency that is not a whole number of at least 1 is refused', async (context) => {
    const [transport] = await open(context);
    for (const concurrency of [0, -1, 1.5, Number.NaN]) {
      assert.throws(() => transport.consume('job', async () => {}, { concurrency }), (error: unknown) => error instanceof RangeError);
    }
  });

  it.run();
}
