/**
 * A partition's state, kept in the consumer group's committed offset and that commit's metadata:
 * which messages are acknowledged and how many deliveries each open one had.
 */
/**
 * What a consumer group knows of one partition: every offset below `base` (the committed offset) is
 * acknowledged; above it, the offsets in `acked` ranges are too (handlers finish out of order), and
 * `deliveries` counts the deliveries begun of those not acknowledged. The committed offset is `base`,
 * the rest is the commit's metadata (`encode`), so a consumer that takes the partition over knows what
 * to skip and how many deliveries each message had, and a publisher knows whether a message is done.
 */
export class PartitionLedger {
  /** null until the first message is seen when the group had no committed offset (it starts at the earliest). */
  base: bigint | null;
  /** Every offset below this has been seen (or is known not to exist): fetches go forward from `base`. */
  #scanned: bigint | null;
  /** Sorted, disjoint, half-open [start, end) ranges above `base`. */
  readonly #acked: Array<[bigint, bigint]> = [];
  readonly #deliveries = new Map<bigint, number>();

  private constructor(base: bigint | null) {
    this.base = base;
    this.#scanned = base;
  }

  static empty(): PartitionLedger {
    return new PartitionLedger(null);
  }

  /** From a committed offset ('-1' or '' when none) and its metadata (anything not ours is ignored: then only the offset counts). */
  static restore(committed: string | null | undefined, metadata: string | null | undefined): PartitionLedger {
    const base = validOffset(committed);
    const ledger = new PartitionLedger(base);
    if (base === null) return ledger;
    const decoded = decodeLedgerMetadata(metadata);
    if (!decoded) return ledger;
    for (let i = 0; i + 1 < decoded.a.length; i += 2) ledger.#addAcked(base + BigInt(decoded.a[i]), base + BigInt(decoded.a[i + 1]));
    for (let i = 0; i + 1 < decoded.d.length; i += 2) {
      const offset = base + BigInt(decoded.d[i]);
      if (!ledger.isAcknowledged(offset) && decoded.d[i + 1] > 0) ledger.#deliveries.set(offset, decoded.d[i + 1]);
    }
    ledger.#advance();
    return ledger;
  }

  /**
   * A fetched message's offset, in fetch order: `acknowledged` (skip it) or `open` (to deliver, unless
   * already held). Offsets skipped between two fetched messages do not exist (compacted, transaction
   * markers, removed by retention) and count as acknowledged, so they never hold `base` back.
   */
  see(offset: bigint): 'acknowledged' | 'open' {
    if (this.base === null) this.base = this.#scanned = offset;
    if (this.#scanned !== null && offset > this.#scanned) this.#addAcked(this.#scanned, offset);
    if (this.#scanned === null || offset >= this.#scanned) this.#scanned = offset + 1n;
    this.#advance();
    return this.isAcknowledged(offset) ? 'acknowledged' : 'open';
  }

  isAcknowledged(offset: bigint): boolean {
    if (this.base === null) return false;
    if (offset < this.base) return true;
    return this.#acked.some(([start, end]) => offset >= start && offset < end);
  }

  deliveriesOf(offset: bigint): number {
    return this.#deliveries.get(offset) ?? 0;
  }

  /** A delivery begins: its count, this one included. */
  begin(offset: bigint): number {
    const deliveries = this.deliveriesOf(offset) + 1;
    this.#deliveries.set(offset, deliveries);
    return deliveries;
  }

  /** A delivery that never reached its handler (its consumer stopped first): not counted. */
  unbegin(offset: bigint): void {
    const deliveries = this.deliveriesOf(offset) - 1;
    if (deliveries > 0) this.#deliveries.set(offset, deliveries);
    else this.#deliveries.delete(offset);
  }

  acknowledge(offset: bigint): void {
    if (this.base === null || this.isAcknowledged(offset)) return;
    this.#deliveries.delete(offset);
    this.#addAcked(offset, offset + 1n);
    this.#advance();
  }

  /**
   * Adds what a group's commit says (another member's, made while this one was out of the group): its
   * acknowledgements join these, and a delivery count is the larger of the two. Nothing acknowledged
   * here is taken back, so a commit made from the result moves the group's offset forward only.
   */
  absorb(committed: string | null | undefined, metadata: string | null | undefined): void {
    const other = PartitionLedger.restore(committed, metadata);
    if (other.base === null) return;
    if (this.base === null) this.base = this.#scanned = other.base;
    if (other.base > this.base) this.#addAcked(this.base, other.base);
    if (this.#scanned === null || other.base > this.#scanned) this.#scanned = other.base;
    for (const [start, end] of other.#acked) this.#addAcked(start, end);
    for (const [offset, deliveries] of other.#deliveries) {
      if (!this.isAcknowledged(offset) && deliveries > this.deliveriesOf(offset)) this.#deliveries.set(offset, deliveries);
    }
    this.#advance();
  }

  /** The commit's metadata: the acknowledged ranges and the deliveries, relative to `base`. */
  encode(): string {
    const base = this.base ?? 0n;
    const a = this.#acked.flatMap(([start, end]) => [Number(start - base), Number(end - base)]);
    const d = [...this.#deliveries].sort(([x], [y]) => (x < y ? -1 : 1)).flatMap(([offset, n]) => [Number(offset - base), n]);
    return JSON.stringify({ v: 1, a, d });
  }

  #addAcked(start: bigint, end: bigint): void {
    if (end <= start) return;
    for (const offset of this.#deliveries.keys()) if (offset >= start && offset < end) this.#deliveries.delete(offset);
    const ranges = this.#acked;
    ranges.push([start, end]);
    ranges.sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0));
    const merged: Array<[bigint, bigint]> = [];
    for (const range of ranges) {
      const last = merged[merged.length - 1];
      if (last && range[0] <= last[1]) last[1] = range[1] > last[1] ? range[1] : last[1];
      else merged.push([range[0], range[1]]);
    }
    ranges.splice(0, ranges.length, ...merged);
  }

  /** Moves `base` over the acknowledged offsets right above it. */
  #advance(): void {
    if (this.base === null) return;
    while (this.#acked.length > 0 && this.#acked[0][0] <= this.base) {
      const [, end] = this.#acked.shift()!;
      if (end > this.base) this.base = end;
    }
    for (const offset of this.#deliveries.keys()) if (offset < this.base) this.#deliveries.delete(offset);
  }
}

function validOffset(value: string | null | undefined): bigint | null {
  if (value === null || value === undefined || !/^\d+$/.test(value)) return null;
  return BigInt(value);
}

/** Our commit metadata, or null for anything else (another tool's commit, a reset, an older format). */
export function decodeLedgerMetadata(metadata: string | null | undefined): { a: number[]; d: number[] } | null {
  if (!metadata) return null;
  try {
    const parsed = JSON.parse(metadata) as { v?: unknown; a?: unknown; d?: unknown };
    const numbers = (value: unknown) => Array.isArray(value) && value.length % 2 === 0 && value.every((n) => Number.isSafeInteger(n) && n >= 0);
    if (parsed?.v !== 1 || !numbers(parsed.a) || !numbers(parsed.d)) return null;
    return { a: parsed.a as number[], d: parsed.d as number[] };
  } catch {
    return null;
  }
}

/** Whether the group has acknowledged the message at `offset`, by its committed offset and metadata. */
export function acknowledgedIn(committed: string | null | undefined, metadata: string | null | undefined, offset: bigint): boolean {
  return PartitionLedger.restore(committed, metadata).isAcknowledged(offset);
}
