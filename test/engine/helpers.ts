import { loadServiceConfig, type ModelConfig } from '../../src/config/index.ts';

export function configuredModel(id: string): ModelConfig {
  const model = loadServiceConfig(null).models.find((m) => m.id === id);
  if (!model) throw new Error(`no model ${id} in the default configuration`);
  return model;
}

export async function post(url: string, body: unknown): Promise<{ status: number; json: any }> {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : null };
}

/** Reads an SSE completion stream into its data payloads (the [DONE] marker included as a string). */
export async function postStream(url: string, body: unknown): Promise<(any | string)[]> {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (res.status !== 200) throw new Error(`stream status ${res.status}: ${await res.text()}`);
  const text = await res.text();
  return text
    .split('\n\n')
    .filter((f) => f.length > 0)
    .map((f) => {
      if (!f.startsWith('data: ')) throw new Error(`bad frame ${f}`);
      const data = f.slice(6);
      return data === '[DONE]' ? data : JSON.parse(data);
    });
}
