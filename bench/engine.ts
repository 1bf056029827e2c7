// Reference engine benchmarks: decode tokens/s for one stream (ref-byte), and a full-vocabulary prompt-logprobs
// response for a 1024-token prompt on ref-gpt2 (bytes, seconds, peak engine RSS sampled from /proc).
// Run: node --import tsx bench/engine.ts
import { readFileSync } from 'node:fs';
import { spawnReferenceEngine } from '../src/reference-engine/index.ts';

function rssMb(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : 0;
  } catch {
    return 0;
  }
}

/** CPU seconds (user + system) the process has used: a figure that survives a busy machine. */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

async function decodeBench(): Promise<void> {
  const engine = await spawnReferenceEngine('ref-byte', { configPath: null });
  try {
    const run = async (maxTokens: number, stream: boolean) => {
      const body = { prompt: 'Once upon a time', max_tokens: maxTokens, temperature: 1, top_p: 1, top_k: -1, min_p: 0, seed: 1, ignore_eos: true, stream };
      const started = performance.now();
      const cpu0 = cpuSeconds(engine.pid);
      const res = await fetch(`${engine.url}/v1/completions`, { method: 'POST', body: JSON.stringify(body) });
      await res.text();
      const wall = maxTokens / ((performance.now() - started) / 1000);
      const cpu = maxTokens / Math.max(cpuSeconds(engine.pid) - cpu0, 0.01);
      return `${wall.toFixed(0)} tokens/s wall (${cpu.toFixed(0)} per engine CPU-second)`;
    };
    await run(256, false); // warm-up (JIT)
    for (const n of [256, 1024, 4096]) {
      console.log(`decode ref-byte, one stream, ${n} tokens: non-streaming ${await run(n, false)}; streaming ${await run(n, true)}`);
    }
  } finally {
    await engine.stop();
  }
}

async function fullVocabBench(): Promise<void> {
  const engine = await spawnReferenceEngine('ref-gpt2', { configPath: null });
  let peak = rssMb(engine.pid);
  const idle = peak;
  const sampler = setInterval(() => (peak = Math.max(peak, rssMb(engine.pid))), 50);
  try {
    const prompt = Array.from({ length: 1024 }, (_, i) => (i * 7919 + 13) % 50256);
    const started = performance.now();
    const res = await fetch(`${engine.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt, max_tokens: 1, temperature: 0, prompt_logprobs: -1 }),
    });
    let bytes = 0;
    let firstByte = 0;
    const reader = res.body!.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (bytes === 0) firstByte = performance.now() - started;
      bytes += value.length;
      peak = Math.max(peak, rssMb(engine.pid));
    }
    const secs = (performance.now() - started) / 1000;
    console.log(
      `full-vocab prompt logprobs ref-gpt2, 1024-token prompt: status ${res.status}, ${(bytes / 1e9).toFixed(2)} GB (${bytes} bytes) in ${secs.toFixed(1)} s ` +
        `(${(bytes / 1e6 / secs).toFixed(0)} MB/s, first byte ${(firstByte / 1000).toFixed(1)} s); engine RSS idle ${idle.toFixed(0)} MB, peak ${peak.toFixed(0)} MB (target < 300 MB)`,
    );
  } finally {
    clearInterval(sampler);
    await engine.stop();
  }
}

if (!process.env.ENGINE_BENCH_ONLY || process.env.ENGINE_BENCH_ONLY === "decode") await decodeBench();
if (!process.env.ENGINE_BENCH_ONLY || process.env.ENGINE_BENCH_ONLY === "fullvocab") await fullVocabBench();
