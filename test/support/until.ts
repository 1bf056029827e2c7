/** Polls `probe` until it returns a truthy value, and returns it; throws, naming `what`, once `limitMs` has passed. */
export async function until<T>(what: string, probe: () => Promise<T | null | undefined | false>, limitMs = 60_000, everyMs = 100): Promise<T> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
