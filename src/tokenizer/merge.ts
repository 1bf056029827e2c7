// Byte-pair merging over token ids, shared by r50k_base and `hf`: the adjacent pair of lowest rank merges first,
// leftmost among equals, until no pair has a rank. A heap over a linked list makes a long word O(n log n).

/** An open-addressing hash table from a pair of ids to a number (a Map's keys above 2^31 are not small integers). */
export class PairTable {
  readonly #lefts: Int32Array;
  readonly #rights: Int32Array;
  readonly #values: Int32Array;
  readonly #mask: number;

  /** `triples`: left, right, value (>= 0), left, right, value, ... A repeated pair keeps its last value. */
  constructor(triples: number[]) {
    let capacity = 1024;
    while (capacity < (triples.length / 3) * 2) capacity *= 2;
    this.#lefts = new Int32Array(capacity);
    this.#rights = new Int32Array(capacity);
    this.#values = new Int32Array(capacity).fill(-1);
    this.#mask = capacity - 1;
    for (let i = 0; i < triples.length; i += 3) {
      const left = triples[i];
      const right = triples[i + 1];
      let slot = this.#slot(left, right);
      while (this.#values[slot] >= 0 && (this.#lefts[slot] !== left || this.#rights[slot] !== right)) slot = (slot + 1) & this.#mask;
      this.#lefts[slot] = left;
      this.#rights[slot] = right;
      this.#values[slot] = triples[i + 2];
    }
  }

  #slot(left: number, right: number): number {
    return ((Math.imul(left, 0x9e3779b1) ^ Math.imul(right, 0x85ebca6b)) >>> 7) & this.#mask;
  }

  /** The pair's value, or -1. */
  get(left: number, right: number): number {
    for (let slot = this.#slot(left, right); ; slot = (slot + 1) & this.#mask) {
      const value = this.#values[slot];
      if (value < 0 || (this.#lefts[slot] === left && this.#rights[slot] === right)) return value;
    }
  }
}

/** A symbol's pair rank when it and its right neighbour do not merge. */
const NONE = 0x7fffffff;

/**
 * Merges `ids` (a word's initial symbols; -1 for one that takes part in no merge) in place and returns the final
 * symbols' first positions (a final symbol's id is then `ids[position]`; a -1 is still its one initial symbol).
 * `rank(left, right)` is the pair's rank or -1; `merged(rank)` the id the pair with that rank becomes.
 * A symbol is named by its first position, `next` links the symbols left to right, `pairRank[s]` is the rank of s
 * with its right neighbour (NONE: no merge; -1: s was merged into its left neighbour). A heap entry whose pair
 * has changed since (its rank no longer matches) is skipped when it comes up.
 */
export function mergeIds(ids: Int32Array, rank: (left: number, right: number) => number, merged: (rank: number) => number): number[] {
  const n = ids.length;
  const next = new Int32Array(n);
  const prev = new Int32Array(n);
  const pairRank = new Int32Array(n);
  const heap = new PairHeap(n);
  const rerank = (s: number) => {
    const right = next[s];
    const r = right < n && ids[s] >= 0 && ids[right] >= 0 ? rank(ids[s], ids[right]) : -1;
    pairRank[s] = r < 0 ? NONE : r;
    if (r >= 0) heap.push(r, s);
  };
  for (let i = 0; i < n; i++) {
    next[i] = i + 1; // n: no right neighbour
    prev[i] = i - 1;
  }
  for (let i = 0; i < n; i++) rerank(i);
  while (heap.size > 0) {
    const r = heap.topRank();
    const s = heap.pop();
    if (pairRank[s] !== r) continue; // stale
    const right = next[s];
    ids[s] = merged(r);
    next[s] = next[right];
    if (next[right] < n) prev[next[right]] = s;
    pairRank[right] = -1;
    rerank(s);
    if (prev[s] >= 0) rerank(prev[s]);
  }
  const starts: number[] = [];
  for (let s = 0; s < n; s = next[s]) starts.push(s);
  return starts;
}

/** A binary min-heap of (rank, position) pairs, ordered by rank, then position. */
class PairHeap {
  #ranks: Int32Array;
  #positions: Int32Array;
  size = 0;

  constructor(capacity: number) {
    this.#ranks = new Int32Array(Math.max(16, capacity));
    this.#positions = new Int32Array(Math.max(16, capacity));
  }

  push(rank: number, position: number): void {
    if (this.size === this.#ranks.length) {
      const ranks = new Int32Array(this.size * 2);
      const positions = new Int32Array(this.size * 2);
      ranks.set(this.#ranks);
      positions.set(this.#positions);
      this.#ranks = ranks;
      this.#positions = positions;
    }
    const r = this.#ranks;
    const p = this.#positions;
    let i = this.size++;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (r[parent] < rank || (r[parent] === rank && p[parent] < position)) break;
      r[i] = r[parent];
      p[i] = p[parent];
      i = parent;
    }
    r[i] = rank;
    p[i] = position;
  }

  topRank(): number {
    return this.#ranks[0];
  }

  /** Removes the least pair; returns its position. */
  pop(): number {
    const r = this.#ranks;
    const p = this.#positions;
    const top = p[0];
    const size = --this.size;
    const rank = r[size];
    const position = p[size];
    let i = 0;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= size) break;
      if (c + 1 < size && (r[c + 1] < r[c] || (r[c + 1] === r[c] && p[c + 1] < p[c]))) c++;
      if (r[c] > rank || (r[c] === rank && p[c] > position)) break;
      r[i] = r[c];
      p[i] = p[c];
      i = c;
    }
    r[i] = rank;
    p[i] = position;
    return top;
  }
}
