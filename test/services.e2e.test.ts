/** Every service starts from one command, refuses a broken configuration, and stops cleanly on SIGTERM. */
import { describe, expect, it } from 'vitest';
import { RetentionPolicy } from '@nats-io/jetstream';
import { topology } from '@tooltx/streams';
import { decodeRaw, encode } from '@tooltx/nats';
import { sampleOperation } from './helpers/histories.js';
import { provisioned, uniquePrefix } from './helpers/nats.js';
import { startService, type ServiceName } from './helpers/services.js';

const ALL: ServiceName[] = ['authorizer', 'executor', 'reconciler', 'audit-projector'];

describe('service processes', () => {
  it('each starts against a provisioned prefix and exits 0 on SIGTERM', async () => {
    const t = await provisioned();
    try {
      const procs = await Promise.all(ALL.map((n) => startService(n, t.env)));
      expect(await Promise.all(procs.map((p) => p.stop()))).toEqual([0, 0, 0, 0]);
      for (const p of procs) expect(p.lines.some((l) => l.msg === 'stopped cleanly')).toBe(true);
    } finally {
      await t.close();
    }
  });

  it('refuses to start when the streams break a guarantee, naming the setting (exit 2)', async () => {
    const t = await provisioned({}, uniquePrefix(), { apply: false });
    try {
      const bad = t.subjects;
      const topo = topology(bad);
      await t.jsm.streams.add({ ...topo.streams.events, retention: RetentionPolicy.Interest });
      const p = await startService('executor', t.env, { wait: false });
      expect(await p.exited).toBe(2);
      const fatal = p.lines.find((l) => l.msg === 'failed to start') as { err?: { message?: string } } | undefined;
      expect(fatal?.err?.message).toContain(`stream ${bad.eventsStream} retention is interest, must be limits`);
      expect(fatal?.err?.message).toContain(`stream ${bad.auditLogStream} does not exist`);
    } finally {
      await t.close();
    }
  });

  it('fails fast on bad configuration, listing every problem (exit 2)', async () => {
    const p = await startService(
      'authorizer',
      {
        NATS_URL: 'nats://127.0.0.1:9',
        TOOLTX_PREFIX: 'Bad.Prefix',
        TOOLTX_CONCURRENCY: 'lots',
        TOOLTX_TOOLS_MODULE: '',
      },
      { wait: false },
    );
    expect(await p.exited).toBe(2);
    expect(p.stderr).toContain('TOOLTX_PREFIX');
    expect(p.stderr).toContain('TOOLTX_CONCURRENCY');
    expect(p.stderr).toContain('TOOLTX_TOOLS_MODULE');
  });

  it('prints --help with its environment and exits 0', async () => {
    for (const name of ALL) {
      const h = await startHelp(name);
      expect(h.code).toBe(0);
      expect(h.out).toContain(`tooltx ${name}:`);
      expect(h.out).toContain('TOOLTX_TOOLS_MODULE');
    }
  });
});

async function startHelp(name: ServiceName): Promise<{ code: number | null; out: string }> {
  const { spawn } = await import('node:child_process');
  const child = spawn(process.execPath, ['--import', 'tsx', `services/${name}/src/main.ts`, '--help'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  const code = await new Promise<number | null>((r) => child.once('exit', r));
  return { code, out };
}

describe('shutdown with status long-polls waiting', () => {
  it('SIGTERM answers a waiting long-poll with what is known now and exits 0, instead of waiting out its wait', async () => {
    const t = await provisioned();
    const authorizer = await startService('authorizer', t.env);
    const agent = await t.connectAs({ kind: 'agent', tenant: 'acme', actor: 'alice' });
    try {
      // A key never registered: the request would wait its whole 30 s (the longest allowed) for a change,
      // past the service's 15 s shutdown grace.
      const { operationKey } = sampleOperation('committed', 7);
      const asked = agent.request(
        t.subjects.status('acme', 'alice'),
        encode({ operationKey, waitMs: 30_000, untilFinal: true }),
        { timeout: 40_000 },
      );
      await new Promise((r) => setTimeout(r, 300)); // the request is in the authorizer's hands
      const code = authorizer.stop();
      expect(decodeRaw((await asked).data)).toMatchObject({ operationKey, state: 'not_seen' });
      expect(await code).toBe(0);
    } finally {
      await agent.close();
      await t.close();
    }
  });
});

describe('poison messages', () => {
  it("an agent's undecodable intents are terminated once, never redelivered: they hold no slot of the authorizer's consumer", async () => {
    const t = await provisioned();
    const authorizer = await startService('authorizer', t.env);
    const agent = await t.connectAs({ kind: 'agent', tenant: 'acme', actor: 'alice' });
    try {
      for (let i = 0; i < 30; i++)
        agent.publish(t.subjects.intent('acme', 'alice'), new TextEncoder().encode('{"not":"msgpack"'));
      await agent.flush();
      // Terminated (a bare +TERM, which 2.9.10 understands): nothing left pending, nothing redelivered.
      let info = await t.jsm.consumers.info(t.subjects.intentsStream('acme'), 'authorizer');
      for (let i = 0; i < 100 && (info.num_ack_pending > 0 || info.delivered.stream_seq < 30); i++) {
        await new Promise((r) => setTimeout(r, 100));
        info = await t.jsm.consumers.info(t.subjects.intentsStream('acme'), 'authorizer');
      }
      expect(info).toMatchObject({ num_ack_pending: 0, num_redelivered: 0 });
      expect(info.delivered.stream_seq).toBe(30);
      expect(authorizer.lines.filter((l) => l.msg === 'message terminated: never redelivered')).toHaveLength(30);
    } finally {
      await agent.close();
      expect(await authorizer.stop()).toBe(0);
      await t.close();
    }
  });
});
