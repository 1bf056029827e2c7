import pino, { type DestinationStream, type Logger } from 'pino';

export type { Logger };

/**
 * JSON-lines logger. Only metadata is ever logged (request id, route, status, latency, key prefix, e-mail, client IP):
 * request and response bodies, prompts, completions and keys never reach it.
 */
export function createLogger(level: string, destination?: DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: 'svc' },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    destination ?? pino.destination({ dest: 1, sync: false }),
  );
}
