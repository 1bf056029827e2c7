// Loaded into a gateway by bench/trace.ts (`node --import`): for each POST /v1/completions, the epoch
// times (ms) of what the process did, read from outside the code under test: Node's diagnostics channels
// (the request's start, undici's engine request created and its headers written, the engine's response
// headers and end), the first write to PostgreSQL (a socket to port 5432) and the first write of the
// response after the engine answered, and how long the `setImmediate` callbacks that ran between the
// engine call's hand-off and its write took in all. Requests are sequential, so "the request in flight" is the
// last one started. Written to TRACE_OUT every second.
import dc from 'node:diagnostics_channel';
import net from 'node:net';
import { writeFileSync } from 'node:fs';

const now = () => performance.timeOrigin + performance.now();
const marks = [];
let current = null;

dc.subscribe('http.server.request.start', ({ request }) => {
  if (request.method !== 'POST' || request.url !== '/v1/completions') return;
  current = { start: now(), immediateMs: 0 };
  marks.push(current);
  if (marks.length > 20_000) marks.splice(0, 10_000);
});
const first = (name) => () => {
  if (current && current[name] === undefined) current[name] = now();
};
dc.subscribe('undici:request:create', first('handoff'));
dc.subscribe('undici:client:sendHeaders', first('engineWrite'));
dc.subscribe('undici:request:headers', first('engineHeaders'));
dc.subscribe('undici:request:trailers', first('engineEnd'));

const writeGeneric = net.Socket.prototype._writeGeneric;
net.Socket.prototype._writeGeneric = function (...args) {
  if (current) {
    if (this.remotePort === 5432 && current.pgWrite === undefined) current.pgWrite = now();
    else if (this.server && current.engineHeaders !== undefined && current.responseWrite === undefined) current.responseWrite = now();
  }
  return writeGeneric.apply(this, args);
};

const setImmediate = globalThis.setImmediate;
globalThis.setImmediate = function (callback, ...args) {
  return setImmediate.call(
    this,
    function (...callbackArgs) {
      const started = now();
      try {
        return callback.apply(this, callbackArgs);
      } finally {
        const request = current;
        if (request && request.handoff !== undefined && request.engineWrite === undefined) {
          request.immediateMs += now() - started;
        }
      }
    },
    ...args,
  );
};

setInterval(() => writeFileSync(process.env.TRACE_OUT, JSON.stringify(marks)), 1000).unref();
