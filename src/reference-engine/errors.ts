// Errors in vLLM's current wire shape: {"error": {message, type, param, code}}.

export class EngineHttpError extends Error {
  readonly status: number;
  readonly type: string;
  readonly param: string | null;

  constructor(status: number, message: string, type: string, param: string | null = null) {
    super(message);
    this.status = status;
    this.type = type;
    this.param = param;
  }

  body(): string {
    return JSON.stringify({ error: { message: this.message, type: this.type, param: this.param, code: this.status } });
  }
}

export const badRequest = (message: string, param: string | null = null) => new EngineHttpError(400, message, 'BadRequestError', param);
export const notFound = (message: string) => new EngineHttpError(404, message, 'NotFoundError');
export const internalError = (message: string) => new EngineHttpError(500, message, 'InternalServerError');
export const outOfMemory = () =>
  new EngineHttpError(
    500,
    'CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. (reference engine: simulated)',
    'InternalServerError',
  );
export const engineDead = () =>
  new EngineHttpError(503, 'EngineCore encountered an issue. See stack trace (above) for the root cause.', 'EngineDeadError');
