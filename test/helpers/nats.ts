import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { Kvm } from '@nats-io/kv';
import { connectNats, jetStreamOf, OperationStore, Subjects, type NatsConnection } from '@tooltx/nats';
import { applyTopology, topology, type TopologyOptions } from '@tooltx/streams';

/** A unique subject prefix per test, so tests share one server without seeing each other. */
export function uniquePrefix(): string {
  return `t${randomBytes(5).toString('hex')}`;
}

export interface TestNats {
  nc: NatsConnection;
  subjects: Subjects;
  store: OperationStore;
  js: Awaited<ReturnType<typeof jetStreamOf>>['js'];
  jsm: Awaited<ReturnType<typeof jetStreamOf>>['jsm'];
  url: string;
  close(): Promise<void>;
}

/** Connects to the run's server and provisions a fresh topology under a unique prefix. */
export async function provisioned(opts: TopologyOptions = {}, prefix = uniquePrefix()): Promise<TestNats> {
  const url = inject('natsUrl');
  const nc = await connectNats({ servers: url, name: `test-${prefix}`, reconnectForever: false });
  const { js, jsm } = await jetStreamOf(nc);
  const subjects = new Subjects(prefix);
  await applyTopology(nc, jsm, topology(subjects, opts));
  return {
    nc,
    js,
    jsm,
    subjects,
    url,
    store: new OperationStore(js, jsm, subjects),
    async close() {
      await nc.drain().catch(() => undefined);
    },
  };
}

export async function resultStore(t: TestNats) {
  return new Kvm(t.nc).open(t.subjects.resultsBucket);
}
