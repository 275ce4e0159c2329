/**
 * A retransmitted append answered `duplicate` with sequence 0 — what a clustered stream answers while
 * the first copy is still being replicated (observed in the FM-29 rolling-restart test) — is asked
 * again until the stream names the stored message, which is then read back and checked: it is never
 * taken for another writer's win (a ConcurrencyError would make the executor drop its own `running`).
 */
import { describe, expect, it } from 'vitest';
import type { JetStreamClient, JetStreamManager, PubAck } from '@nats-io/jetstream';
import { StoreUnavailableError } from '@tooltx/lifecycle';
import { encode, JetStreamStore, Subjects } from '@tooltx/nats';
import { acceptedEvent } from '../../../test/contracts/event-store.js';

const subjects = new Subjects('tdup');

const acceptedOnce = () => acceptedEvent({ operationKey: `opk_${'C'.repeat(43)}`, at: 1 });

/** A stream that answers the given PubAcks in turn and holds `event` at sequence 7 on its subject. */
function fakeStream(acks: Partial<PubAck>[], stored: { subject: string; data: Uint8Array }) {
  let publishes = 0;
  const js = {
    publish: async () => ({
      stream: subjects.eventsStream,
      domain: '',
      ...acks[Math.min(publishes++, acks.length - 1)]!,
    }),
  } as unknown as JetStreamClient;
  const jsm = {
    direct: { getMessage: async (_s: string, q: { seq?: number }) => (q.seq === 7 ? { seq: 7, ...stored } : null) },
  } as unknown as JetStreamManager;
  return { js, jsm, publishes: () => publishes };
}

describe('JetStreamStore.append and a duplicate answered with sequence 0', () => {
  it('asks again until the stream names the message, reads it back and returns its sequence', async () => {
    const event = acceptedOnce();
    const subject = subjects.op('acme', 'a'.repeat(32));
    const f = fakeStream(
      [
        { duplicate: true, seq: 0 },
        { duplicate: true, seq: 0 },
        { duplicate: true, seq: 7 },
      ],
      { subject, data: encode(event) },
    );
    const store = new JetStreamStore(f.js, f.jsm, subjects);
    await expect(store.append('acme', 'a'.repeat(32), event, 0)).resolves.toBe(7);
    expect(f.publishes()).toBe(3);
  });

  it('still unconfirmed after every attempt: StoreUnavailableError (the caller retries the message), never a ConcurrencyError', async () => {
    const event = acceptedOnce();
    const f = fakeStream([{ duplicate: true, seq: 0 }], { subject: 'x', data: new Uint8Array() });
    const store = new JetStreamStore(f.js, f.jsm, subjects);
    await expect(store.append('acme', 'b'.repeat(32), event, 0)).rejects.toBeInstanceOf(StoreUnavailableError);
  });
});
