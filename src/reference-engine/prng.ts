// Seeded PRNG (sfc32 seeded through splitmix32): fast, 32-bit state, reproducible across platforms.

export class Prng {
  #a: number;
  #b: number;
  #c: number;
  #d: number;

  /** `seed` may be any non-negative integer up to 2^63-1 (as much of it as a double holds). */
  constructor(seed: number) {
    const lo = seed % 0x100000000 >>> 0;
    const hi = Math.floor(seed / 0x100000000) >>> 0;
    let s = splitmix(lo ^ 0x9e3779b9);
    s = splitmix(s ^ hi);
    this.#a = s = splitmix(s);
    this.#b = s = splitmix(s);
    this.#c = s = splitmix(s);
    this.#d = 1;
    for (let i = 0; i < 12; i++) this.nextU32();
  }

  nextU32(): number {
    const t = (((this.#a + this.#b) | 0) + this.#d) | 0;
    this.#d = (this.#d + 1) | 0;
    this.#a = this.#b ^ (this.#b >>> 9);
    this.#b = (this.#c + (this.#c << 3)) | 0;
    this.#c = (this.#c << 21) | (this.#c >>> 11);
    this.#c = (this.#c + t) | 0;
    return t >>> 0;
  }

  /** Uniform in [0, 1) with 53 random bits. */
  next(): number {
    return ((this.nextU32() >>> 5) * 67108864 + (this.nextU32() >>> 6)) / 9007199254740992;
  }

  #spare = NaN;

  /** Standard normal (Box-Muller; the second value of each pair is kept for the next call). */
  normal(): number {
    if (this.#spare === this.#spare) {
      const s = this.#spare;
      this.#spare = NaN;
      return s;
    }
    let u = this.next();
    while (u === 0) u = this.next();
    const r = Math.sqrt(-2 * Math.log(u));
    const a = 2 * Math.PI * this.next();
    this.#spare = r * Math.sin(a);
    return r * Math.cos(a);
  }
}

function splitmix(x: number): number {
  x = (x + 0x9e3779b9) | 0;
  x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
  x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}
