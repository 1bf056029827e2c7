/**
 * The source of the SQL port's snapshot process (sql-snapshot.ts), run as `node --input-type=module -e`
 * (a string, so it runs the same from the sources and from a build). Arguments: PGlite's module URL,
 * its NodeFS module URL, the snapshot (`dir` and a copied data directory, or `tar` and a file from
 * PGlite's dumpDataDir), and the most bytes its WebAssembly memory may grow to.
 *
 * PGlite makes its WebAssembly memory itself (maximum 2 GiB) and takes no option for it, so the
 * constructor is wrapped in this process: the maximum becomes the bound, a growth beyond it fails,
 * PostgreSQL's allocation fails with it, and the statement ends in its own `out of memory` error
 * (53200) while the database goes on serving.
 *
 * Requests come one at a time over IPC: `query` (rows back), `exec`, and `read`, a client's protocol
 * messages run inside a transaction this process opens (`open`, which must not fail) and rolls back,
 * the raw reply streamed back as `data` messages.
 */
export const snapshotChildSource = String.raw`
const [pgliteUrl, nodefsUrl, kind, source, maxBytes] = process.argv.slice(1);
const Memory = WebAssembly.Memory;
const pages = Math.max(1, Math.floor(Number(maxBytes) / 65536));
function BoundedMemory(descriptor) {
  return new Memory({ ...descriptor, initial: Math.min(descriptor.initial, pages), maximum: Math.min(descriptor.maximum ?? pages, pages) });
}
BoundedMemory.prototype = Memory.prototype;
WebAssembly.Memory = BoundedMemory;

const { readFileSync } = await import('node:fs');
const { PGlite } = await import(pgliteUrl);
let db;
if (kind === 'dir') {
  const { NodeFS } = await import(nodefsUrl);
  db = await PGlite.create({ fs: new NodeFS(source) });
} else db = await PGlite.create({ loadDataDir: new Blob([readFileSync(source)]) });

const query = (sql) => {
  const body = Buffer.from(sql + '\0', 'utf8');
  const head = Buffer.alloc(5);
  head.write('Q', 0, 'latin1');
  head.writeInt32BE(body.length + 4, 1);
  return Buffer.concat([head, body]);
};
const hasError = (reply) => {
  for (let at = 0; at + 5 <= reply.length; at += 1 + reply.readInt32BE(at + 1)) if (reply[at] === 0x45) return true;
  return false;
};

async function read(request) {
  const opened = [];
  await db.execProtocolRawStream(query(request.open), { onRawData: (d) => opened.push(Buffer.from(d)), syncToFs: false });
  try {
    if (hasError(Buffer.concat(opened))) throw new Error('the SQL port could not open its read-only transaction');
    // Sent in pieces of up to 256 KiB: fewer IPC messages than PGlite's own pieces.
    let pending = [];
    let size = 0;
    const flush = () => {
      if (size > 0) process.send({ type: 'data', chunk: Buffer.concat(pending) });
      pending = [];
      size = 0;
    };
    for (const m of request.messages) {
      await db.execProtocolRawStream(Buffer.from(m), {
        syncToFs: false,
        onRawData: (d) => {
          pending.push(Buffer.from(d));
          size += d.length;
          if (size >= 262144) flush();
        },
      });
    }
    flush();
  } finally {
    await db.execProtocolRawStream(query('ROLLBACK'), { onRawData: () => {}, syncToFs: false });
  }
}

process.on('disconnect', () => process.exit(0));
process.on('message', async (request) => {
  try {
    if (request.op === 'query') process.send({ type: 'done', rows: (await db.query(request.sql, request.params ?? [])).rows });
    else if (request.op === 'exec') (await db.exec(request.sql), process.send({ type: 'done' }));
    else (await read(request), process.send({ type: 'done' }));
  } catch (error) {
    process.send({ type: 'failed', message: String(error?.message ?? error), code: error?.code ?? null });
  }
});
process.send({ type: 'ready' });
`;
