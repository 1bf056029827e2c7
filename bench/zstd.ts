/**
 * zstd decoders on capture-sized frames: vllm-lens sends a capture's bf16 bytes as one zstd frame
 * (level 1), so the gateway decompresses up to tens of MiB per prompt. fzstd (pure JavaScript) against
 * @bokuweb/zstd-wasm (zstd's C source as WebAssembly), each decoding into the tensor's own buffer.
 * `npm run bench -- zstd`; BENCH_ZSTD_ROUNDS (3) rounds of 16 MiB or one capture, the least CPU of each.
 */
import { Buffer } from 'node:buffer';
import { cpus, loadavg } from 'node:os';
import { decompress as fzstd } from 'fzstd';
import * as wasm from '@bokuweb/zstd-wasm';

await wasm.init();
const rounds = Number(process.env.BENCH_ZSTD_ROUNDS ?? 3);

/** bf16 residual-stream-like values: per-dimension offsets and scales, normal noise. */
function capture(bytes: number): Uint8Array {
  const out = new Uint16Array(bytes / 2);
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  let s = 12345;
  const next = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) + 0.5) / 2 ** 32;
  for (let i = 0; i < out.length; i++) {
    const d = i % 2048;
    f[0] = (d % 17 === 3 ? 300 : 0) + (1 + (d % 5)) * Math.sqrt(-2 * Math.log(next())) * Math.cos(2 * Math.PI * next());
    out[i] = u[0] >>> 16;
  }
  return new Uint8Array(out.buffer);
}

const decoders: Record<string, (frame: Uint8Array, out: Uint8Array) => void> = {
  fzstd: (frame, out) => void fzstd(frame, out),
  'zstd-wasm': (frame, out) => out.set(wasm.decompress(frame, { defaultHeapSize: out.length })),
};
const lines: string[] = [];
for (const mib of [1, 8, 32]) {
  const raw = capture(mib * 2 ** 20);
  const frame = wasm.compress(raw, 1);
  const out = new Uint8Array(raw.length);
  const cells: string[] = [];
  for (const [name, decode] of Object.entries(decoders)) {
    decode(frame, out);
    if (!Buffer.from(out).equals(Buffer.from(raw))) throw new Error(`${name} decoded other bytes`);
    let best = Infinity;
    for (let r = 0; r < rounds; r++) {
      const reps = Math.max(1, Math.round(16 / mib));
      const cpu = process.cpuUsage();
      for (let k = 0; k < reps; k++) decode(frame, out);
      const used = process.cpuUsage(cpu);
      best = Math.min(best, (used.user + used.system) / 1e6 / ((raw.length * reps) / 1e9));
    }
    cells.push(`${name} ${best.toFixed(2)}`);
  }
  lines.push(`| ${mib} MiB (frame ${(frame.length / raw.length).toFixed(2)} of it) | ${cells.join(' | ')} |`);
}
process.stdout.write(
  `zstd decoders, CPU s per GB decompressed (least of ${rounds} rounds); ${cpus().length} x ${cpus()[0]?.model ?? 'cpu'}, Node ${process.version}, load average ${loadavg()[0].toFixed(2)}\n\n| capture | ${Object.keys(decoders).join(' | ')} |\n|---|---|---|\n${lines.join('\n')}\n`,
);
