import type { TestNats } from './nats.js';

/** One stored message of a stream, raw. */
export interface StoredMessage {
  subject: string;
  seq: number;
  data: Uint8Array;
  headers: string;
}

/**
 * Every message stored in `stream` right now, in order, read with an ordered consumer as the
 * provisioner (a test's full-access identity). KV buckets are streams `KV_<bucket>`.
 */
export async function readStream(t: TestNats, stream: string): Promise<StoredMessage[]> {
  const info = await t.jsm.streams.info(stream);
  if (info.state.messages === 0) return [];
  const last = info.state.last_seq;
  const c = await t.js.consumers.get(stream);
  const out: StoredMessage[] = [];
  const it = await c.consume();
  for await (const m of it) {
    out.push({
      subject: m.subject,
      seq: m.seq,
      data: m.data,
      headers: m.headers ? [...m.headers.keys()].map((k) => `${k}: ${m.headers!.values(k).join(',')}`).join('\n') : '',
    });
    if (m.seq >= last) break;
  }
  it.stop();
  return out;
}
