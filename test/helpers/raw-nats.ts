import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { fromSeed } from '@nats-io/nkeys';

/** One message delivered to a subscription of a {@link RawNats} connection. */
export interface RawMsg {
  subject: Buffer;
  headers: Buffer | null;
  data: Buffer;
}

const CRLF = Buffer.from('\r\n');

/**
 * A NATS connection spoken by hand over TCP (the client protocol: https://docs.nats.io/reference/reference-protocols/nats-protocol),
 * authenticated with an nkey seed. Subjects and headers go out as the exact bytes given — invalid
 * UTF-8 included, which a client library would have re-encoded — so a test can see what the server
 * and the services make of them.
 */
export class RawNats {
  readonly #s: Socket;
  #buf = Buffer.alloc(0);
  readonly errors: string[] = [];
  #pongs: (() => void)[] = [];
  #subs = new Map<number, (m: RawMsg) => void>();
  #sid = 0;

  private constructor(s: Socket) {
    this.#s = s;
  }

  /** Connects to `url` (nats://host:port) as the identity of `seedFile`; resolves once the server answered PONG. */
  static async connect(url: string, seedFile: string): Promise<RawNats> {
    const u = new URL(url.split(',')[0]!);
    const s = connect(Number(u.port), u.hostname);
    const c = new RawNats(s);
    const info = await new Promise<{ nonce?: string }>((resolve, reject) => {
      s.once('error', reject);
      const onData = (d: Buffer) => {
        c.#buf = Buffer.concat([c.#buf, d]);
        const i = c.#buf.indexOf(CRLF);
        if (i < 0) return;
        const line = c.#buf.subarray(0, i).toString('utf8');
        c.#buf = c.#buf.subarray(i + 2);
        s.off('data', onData);
        resolve(JSON.parse(line.slice(5)) as { nonce?: string });
      };
      s.on('data', onData);
    });
    s.on('data', (d: Buffer) => c.#read(d));
    const kp = fromSeed(new TextEncoder().encode(readFileSync(seedFile, 'utf8').trim()));
    const sig = Buffer.from(kp.sign(new TextEncoder().encode(info.nonce ?? ''))).toString('base64');
    s.write(
      `CONNECT ${JSON.stringify({ verbose: false, pedantic: false, headers: true, no_responders: true, protocol: 1, lang: 'raw', version: '0', nkey: kp.getPublicKey(), sig })}\r\n`,
    );
    await c.ping();
    return c;
  }

  /** Publishes `data` on the exact bytes of `subject`, with a raw header block (`NATS/1.0\r\n…\r\n\r\n`) when given. */
  publish(subject: Buffer, data: Buffer, o: { reply?: string; headers?: Buffer } = {}): void {
    const reply = o.reply ? ` ${o.reply}` : '';
    const head = o.headers
      ? Buffer.concat([
          Buffer.from('HPUB '),
          subject,
          Buffer.from(`${reply} ${o.headers.length} ${o.headers.length + data.length}\r\n`),
        ])
      : Buffer.concat([Buffer.from('PUB '), subject, Buffer.from(`${reply} ${data.length}\r\n`)]);
    this.#s.write(Buffer.concat([head, o.headers ?? Buffer.alloc(0), data, CRLF]));
  }

  /** Subscribes to `subject`; `onMsg` gets every message. */
  subscribe(subject: string, onMsg: (m: RawMsg) => void): void {
    const sid = ++this.#sid;
    this.#subs.set(sid, onMsg);
    this.#s.write(`SUB ${subject} ${sid}\r\n`);
  }

  /** Resolves at the server's PONG: everything sent before it has been processed (and any -ERR of it received). */
  ping(): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no PONG; errors: ${this.errors.join(' | ')}`)), 5_000);
      this.#pongs.push(() => {
        clearTimeout(timer);
        resolve();
      });
      this.#s.write('PING\r\n');
    });
  }

  close(): void {
    this.#s.destroy();
  }

  #read(d: Buffer): void {
    this.#buf = Buffer.concat([this.#buf, d]);
    for (;;) {
      const i = this.#buf.indexOf(CRLF);
      if (i < 0) return;
      const line = this.#buf.subarray(0, i);
      const text = line.toString('latin1');
      if (text.startsWith('MSG ') || text.startsWith('HMSG ')) {
        const parts = text.split(' ');
        const hmsg = text.startsWith('HMSG ');
        const total = Number(parts.at(-1));
        const hdrLen = hmsg ? Number(parts.at(-2)) : 0;
        if (this.#buf.length < i + 2 + total + 2) return;
        const body = this.#buf.subarray(i + 2, i + 2 + total);
        this.#buf = this.#buf.subarray(i + 2 + total + 2);
        this.#subs.get(Number(parts[2]))?.({
          subject: Buffer.from(parts[1]!, 'latin1'),
          headers: hmsg ? Buffer.from(body.subarray(0, hdrLen)) : null,
          data: Buffer.from(body.subarray(hdrLen)),
        });
        continue;
      }
      this.#buf = this.#buf.subarray(i + 2);
      if (text === 'PING') this.#s.write('PONG\r\n');
      else if (text === 'PONG') this.#pongs.shift()?.();
      else if (text.startsWith('-ERR')) this.errors.push(text);
    }
  }
}
