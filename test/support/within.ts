/**
 * Settles as `promise` does, or rejects naming `what` once `ms` have passed: a test that waits for a
 * wake-up, a subscriber or a commit fails on its own, fast, instead of hanging until the runner kills
 * its file (and every later test in it with it).
 */
export function within<T>(ms: number, promise: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}
