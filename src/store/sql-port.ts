/**
 * The embedded store's SQL port: the gateway's PGlite served read-only over the PostgreSQL wire
 * protocol on loopback, so `psql`, notebooks and BI tools read the tables while the gateway runs.
 *
 * Statements run on a snapshot of the database in a process of their own (sql-snapshot.ts), never on
 * the gateway's PGlite: a statement cannot hold the gateway's store, is ended after the statement
 * timeout (57014), and cannot grow past the port's memory bound (53200); the port serves on after
 * either. Analysts read data up to the snapshot's age old. Each client's Query (or extended-protocol
 * batch up to its Sync) runs alone on the snapshot's one session, inside a transaction this port
 * opens READ ONLY and always rolls back: a write fails (25006), and anything a statement changed in
 * the session (SET, set_config) is undone with it. Statements are checked before they run: only
 * SELECT, WITH, TABLE, VALUES, SHOW and EXPLAIN pass, so no COMMIT, SET TRANSACTION or procedure can
 * end or reopen the port's transaction; BEGIN/COMMIT/ROLLBACK alone are answered without running
 * (clients that wrap reads in a transaction work). The client's startup parameters are not applied
 * to the shared session.
 *
 * Clients authenticate with a password (AuthenticationCleartextPassword, on loopback): the one the
 * port was opened with (`svc serve` keeps it in DATA_DIR/sql-password, or takes SVC_SQL_PASSWORD);
 * any user name. A wrong or missing password is 28P01 and the connection closed, before any statement.
 *
 * Written on PGlite's `execProtocolRawStream` rather than `@electric-sql/pglite-socket`: every
 * release of that package pins an exact PGlite peer version (none the one installed) and seven
 * extension packages as peers.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { ANALYST_ROLE, ANALYST_SCHEMA } from './analyst-views.ts';
import { openSnapshotReader, SqlPortError, type SnapshotOptions, type SnapshotSource } from './sql-snapshot.ts';

export interface SqlPortOptions {
  /** 0: any free port. */
  port: number;
  /** Loopback by default. */
  host?: string;
  /** What clients must send as their password: user `svc` the owner's (every table), any other user the analysts'. */
  passwords: { owner: string; analyst: string };
}

export interface SqlPort {
  readonly host: string;
  readonly port: number;
  close(): Promise<void>;
}

const sslRequest = 80877103;
const gssEncRequest = 80877104;
const cancelRequest = 80877102;
const protocol3 = 196608;

/** First keywords of the statements the port runs. */
const readingStatements = new Set(['select', 'with', 'table', 'values', 'show', 'explain']);
/** Transaction control a client sends around reads; answered with its tag, not run. */
const transactionControl = new Map([
  ['begin', 'BEGIN'],
  ['start', 'START TRANSACTION'],
  ['commit', 'COMMIT'],
  ['end', 'COMMIT'],
  ['rollback', 'ROLLBACK'],
  ['abort', 'ROLLBACK'],
]);

function message(type: string, body: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(5);
  head.write(type, 0, 'latin1');
  head.writeInt32BE(body.length + 4, 1);
  return Buffer.concat([head, body]);
}

const cstring = (text: string) => Buffer.from(`${text}\0`, 'utf8');
const int32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeInt32BE(n);
  return b;
};

function errorResponse(code: string, text: string): Buffer {
  return message('E', Buffer.concat([cstring('SERROR'), cstring('VERROR'), cstring(`C${code}`), cstring(`M${text}`), Buffer.from([0])]));
}
/** Bytes of reply a client may leave unread before it is disconnected. */
const maxUnreadBytes = 64 * 1024 * 1024;

/**
 * Forwards a backend reply message by message as its bytes come (a message's bytes are not held,
 * however long it is), all but ReadyForQuery ('Z'), which is dropped.
 */
class ReplyForwarder {
  private header = Buffer.alloc(0);
  private remaining = 0;
  private dropping = false;
  constructor(private readonly out: (bytes: Buffer) => void) {}
  push(chunk: Buffer): void {
    let at = 0;
    while (at < chunk.length) {
      if (this.remaining > 0) {
        const n = Math.min(this.remaining, chunk.length - at);
        if (!this.dropping) this.out(chunk.subarray(at, at + n));
        this.remaining -= n;
        at += n;
        continue;
      }
      const part = chunk.subarray(at, at + 5 - this.header.length);
      this.header = Buffer.concat([this.header, part]);
      at += part.length;
      if (this.header.length < 5) continue;
      this.dropping = this.header[0] === 0x5a;
      if (!this.dropping) this.out(this.header);
      this.remaining = this.header.readInt32BE(1) - 4;
      this.header = Buffer.alloc(0);
    }
  }
  /** Part of a message was forwarded and the rest has not come. */
  get midMessage(): boolean {
    return this.remaining > 0 && !this.dropping;
  }
}

const readyForQuery = () => message('Z', Buffer.from('I', 'latin1'));
const commandComplete = (tag: string) => message('C', cstring(tag));

/**
 * The statements of a SQL text, split on semicolons outside strings, quoted identifiers, dollar
 * quotes and comments; each reduced to its first keyword (lower case, '' for an empty statement).
 */
export function firstKeywords(sql: string): string[] {
  const keywords: string[] = [];
  let keyword: string | null = null;
  let i = 0;
  const n = sql.length;
  while (i < n) {
    const c = sql[i];
    const next = sql[i + 1];
    if (c === '-' && next === '-') {
      while (i < n && sql[i] !== '\n') i++;
    } else if (c === '/' && next === '*') {
      let depth = 1;
      i += 2;
      while (i < n && depth > 0) {
        if (sql[i] === '/' && sql[i + 1] === '*') (depth++, (i += 2));
        else if (sql[i] === '*' && sql[i + 1] === '/') (depth--, (i += 2));
        else i++;
      }
    } else if (c === "'" || c === '"') {
      // E'...' strings take backslash escapes; a doubled quote is a quote in every form.
      const escapes = c === "'" && /[eE]/.test(sql[i - 1] ?? '') && !/[\w$]/.test(sql[i - 2] ?? '');
      i++;
      while (i < n) {
        if (escapes && sql[i] === '\\') i += 2;
        else if (sql[i] === c && sql[i + 1] === c) i += 2;
        else if (sql[i] === c) break;
        else i++;
      }
      i++;
      keyword ??= '?';
    } else if (c === '$' && !/[\w$]/.test(sql[i - 1] ?? '')) {
      const tag = /^\$([A-Za-z_][\w]*)?\$/.exec(sql.slice(i));
      if (tag) {
        const end = sql.indexOf(tag[0], i + tag[0].length);
        i = end < 0 ? n : end + tag[0].length;
      } else i++;
      keyword ??= '?';
    } else if (c === ';') {
      keywords.push(keyword ?? '');
      keyword = null;
      i++;
    } else if (/[A-Za-z_]/.test(c)) {
      const word = /^[A-Za-z_][\w$]*/.exec(sql.slice(i, i + 64))![0];
      keyword ??= word.toLowerCase();
      i += word.length;
    } else {
      // A parenthesized query, `(SELECT ...)`, starts with its first word; any other symbol first is no statement we run.
      if (!/[\s(]/.test(c)) keyword ??= '?';
      i++;
    }
  }
  if (keyword !== null) keywords.push(keyword);
  return keywords.length === 0 ? [''] : keywords;
}

/** Why a statement is refused, or null when it may run. */
function refusal(keyword: string): string | null {
  if (keyword === '' || readingStatements.has(keyword)) return null;
  return `the SQL port is read-only: only SELECT, WITH, TABLE, VALUES, SHOW and EXPLAIN run (got ${keyword === '?' ? 'another statement' : keyword.toUpperCase()})`;
}

interface Session {
  socket: Socket;
  buffer: Buffer;
  started: boolean;
  /** The startup message came; its password has not yet. */
  authenticating: boolean;
  /** An analyst (any user but `svc`): reads the `analyst` views only, as role svc_analyst. */
  analyst: boolean;
  /** Extended-protocol messages up to the next Sync. */
  batch: Buffer[];
  /** Messages are handled one at a time, in order. */
  work: Promise<void>;
}

/** Both sides hashed, then compared in constant time: neither length nor content leaks through timing. */
function passwordsMatch(given: Buffer, expected: string): boolean {
  const digest = (b: Buffer | string) => createHash('sha256').update(b).digest();
  return timingSafeEqual(digest(given), digest(expected));
}

export async function serveSqlPort(source: SnapshotSource, options: SqlPortOptions & { snapshotsDir: string; limits: SnapshotOptions }): Promise<SqlPort> {
  const db = source.database;
  const host = options.host ?? '127.0.0.1';
  if (!options.passwords.owner || !options.passwords.analyst) throw new Error('the SQL port needs its passwords');
  const { rows } = await db.query<{ server_version: string; timezone: string }>(`SELECT current_setting('server_version') AS server_version, current_setting('TimeZone') AS timezone`);
  const parameters: [string, string][] = [
    ['server_version', rows[0].server_version],
    ['server_encoding', 'UTF8'],
    ['client_encoding', 'UTF8'],
    ['DateStyle', 'ISO, MDY'],
    ['IntervalStyle', 'postgres'],
    ['TimeZone', rows[0].timezone],
    ['integer_datetimes', 'on'],
    ['standard_conforming_strings', 'on'],
    ['is_superuser', 'off'],
    ['default_transaction_read_only', 'on'],
    ['in_hot_standby', 'on'],
  ];
  const greeting = Buffer.concat([
    message('R', int32(0)),
    ...parameters.map(([k, v]) => message('S', Buffer.concat([cstring(k), cstring(v)]))),
    message('K', Buffer.concat([int32(process.pid), int32(0)])),
    readyForQuery(),
  ]);

  const sessions = new Set<Session>();

  const reader = openSnapshotReader(source, options.snapshotsDir, options.limits);

  /**
   * Runs `messages` on the snapshot, in a read-only transaction that is rolled back. The reply's
   * messages are forwarded as they come but its ReadyForQuery, which said "in a transaction": the
   * port sends its own, "idle", which the client is once the transaction is rolled back.
   */
  const runReading = async (session: Session, messages: Buffer[]) => {
    // An analyst reads as svc_analyst, through the analyst schema's views only (analyst-views.ts).
    const open = session.analyst
      ? `BEGIN READ ONLY; SET LOCAL ROLE ${ANALYST_ROLE}; SET LOCAL search_path = ${ANALYST_SCHEMA}, pg_catalog; SELECT 1`
      : 'BEGIN READ ONLY; SELECT 1';
    const reply = new ReplyForwarder((b) => {
      if (!session.socket.writable) return;
      session.socket.write(b);
      // A client that does not read its reply: cut off, rather than the reply held in the gateway's memory.
      if (session.socket.writableLength > maxUnreadBytes) session.socket.destroy();
    });
    try {
      await reader.read({ open, messages, onData: (chunk) => reply.push(chunk) });
    } catch (error) {
      // Part of a message sent: the stream cannot be mended, only closed.
      if (reply.midMessage) return void session.socket.destroy();
      const e = error instanceof SqlPortError ? error : new SqlPortError('XX000', (error as Error).message);
      if (session.socket.writable) session.socket.write(errorResponse(e.code, e.message));
    }
    if (session.socket.writable) session.socket.write(readyForQuery());
  };

  const refuse = (session: Session, text: string) => {
    if (session.socket.writable) session.socket.write(Buffer.concat([errorResponse('25006', text), readyForQuery()]));
  };

  async function handle(session: Session, type: string, whole: Buffer): Promise<void> {
    const body = whole.subarray(5);
    switch (type) {
      case 'Q': {
        const sql = body.toString('utf8', 0, Math.max(0, body.length - 1));
        const keywords = firstKeywords(sql);
        const alone = keywords.length === 1 ? transactionControl.get(keywords[0]) : undefined;
        if (alone) {
          session.socket.write(Buffer.concat([commandComplete(alone), readyForQuery()]));
          return;
        }
        const refused = keywords.map(refusal).find((r) => r !== null);
        if (refused) return void refuse(session, refused);
        return runReading(session, [whole]);
      }
      case 'P':
      case 'B':
      case 'D':
      case 'E':
      case 'C':
      case 'H':
        session.batch.push(whole);
        return;
      case 'S': {
        const batch = session.batch;
        session.batch = [];
        for (const m of batch) {
          if (m[0] !== 0x50) continue; // 'P': name\0 sql\0 ...
          const nameEnd = m.indexOf(0, 5);
          const sql = m.toString('utf8', nameEnd + 1, m.indexOf(0, nameEnd + 1));
          const refused = firstKeywords(sql).map(refusal).find((r) => r !== null);
          if (refused) return void refuse(session, refused);
        }
        return runReading(session, [...batch, whole]);
      }
      case 'X':
        session.socket.end();
        return;
      default:
        // Function calls (F) and COPY data: nothing an analyst's read needs.
        refuse(session, `the SQL port does not take protocol message ${JSON.stringify(type)}`);
    }
  }

  function receive(session: Session): void {
    for (;;) {
      const b = session.buffer;
      if (!session.started) {
        if (b.length < 8) return;
        const length = b.readInt32BE(0);
        if (b.length < length) return;
        const code = b.readInt32BE(4);
        session.buffer = b.subarray(length);
        if (code === sslRequest || code === gssEncRequest) session.socket.write('N');
        else if (code === cancelRequest) session.socket.end();
        else if (code === protocol3) {
          session.started = true;
          session.authenticating = true;
          // Startup parameters: name\0value\0 pairs after the protocol version.
          const fields = b.subarray(8, length).toString('utf8').split('\0');
          const userAt = fields.findIndex((f, i) => i % 2 === 0 && f === 'user');
          session.analyst = userAt < 0 || fields[userAt + 1] !== 'svc';
          session.socket.write(message('R', int32(3))); // AuthenticationCleartextPassword
        } else {
          session.socket.end(errorResponse('08P01', 'unsupported frontend protocol'));
          return;
        }
        continue;
      }
      if (b.length < 5) return;
      const length = b.readInt32BE(1) + 1;
      if (b.length < length) return;
      const whole = Buffer.from(b.subarray(0, length));
      session.buffer = b.subarray(length);
      const type = String.fromCharCode(whole[0]);
      if (session.authenticating) {
        // The password message: the password and its terminating zero.
        const given = whole.subarray(5, Math.max(5, whole.length - 1));
        if (type !== 'p' || !passwordsMatch(given, session.analyst ? options.passwords.analyst : options.passwords.owner)) {
          session.socket.end(errorResponse('28P01', 'password authentication failed: the SQL port\'s password is in DATA_DIR/sql-password (or SVC_SQL_PASSWORD)'));
          session.buffer = Buffer.alloc(0);
          return;
        }
        session.authenticating = false;
        session.socket.write(greeting);
        continue;
      }
      session.work = session.work
        .then(() => handle(session, type, whole))
        .catch((error: unknown) => refuse(session, (error as Error).message));
    }
  }

  const server: Server = createServer((socket) => {
    const session: Session = { socket, buffer: Buffer.alloc(0), started: false, authenticating: false, analyst: true, batch: [], work: Promise.resolve() };
    sessions.add(session);
    socket.setNoDelay(true);
    socket.on('data', (data) => {
      session.buffer = Buffer.concat([session.buffer, data]);
      receive(session);
    });
    socket.on('error', () => socket.destroy());
    socket.on('close', () => sessions.delete(session));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, host, () => {
      server.off('error', reject);
      resolve();
    });
  }).catch(async (error: unknown) => {
    await reader.close();
    throw error;
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : options.port;
  return {
    host,
    port,
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sessions) s.socket.destroy();
      await reader.close(); // ends a statement under way, and waits for a snapshot being copied
      await Promise.all([...sessions].map((s) => s.work));
      await closed;
    },
  };
}
