import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { downstreamKeyOf } from '@tooltx/contracts';
import { KbClient, type KbAdmin, type KbNote } from '../../examples/research-kb/kb-client.js';
import type { KbSeedFile } from '../../examples/research-kb/kb-seed.js';
import { kbServiceToken } from './kb-service-token.js';
import { ServiceProcess } from './services.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const RESEARCH_TOOLS = join(ROOT, 'examples', 'research-kb', 'tools.ts');
export const KB_SERVER = join(ROOT, 'examples', 'research-kb', 'kb-server.ts');

/** Spawns the KB server as its own process (free port, debug logs unless `env` says otherwise). */
export function spawnKbProcess(env: Record<string, string>, args: string[] = []): ServiceProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', KB_SERVER, ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', LOG_LEVEL: 'debug', KB_PORT: '0', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new ServiceProcess('kb-server', child);
}

/**
 * The research KB as its own process on a free port, with a fresh SQLite file, an operator token
 * and this test process's service token (./kb-service-token.ts; `startService` gives it to every
 * service with a `KB_URL`), as `npm start` runs it.
 */
export interface TestKb {
  proc: ServiceProcess;
  url: string;
  /** The KB's `KB_SERVICE_TOKEN_FILE` and the token in it. */
  serviceToken: { file: string; token: string };
  /** A client with the service token. */
  client: KbClient;
  admin: KbAdmin;
  stop(): Promise<number | null>;
}

/** Rows the KB holds under the downstream key of `operationKey` of `tenant` (its own probe): more than 1 = a double execution. */
export async function kbRowsFor(kb: TestKb, tenant: string, operationKey: string): Promise<number> {
  const p = await kb.client.probe({ tenant, key: downstreamKeyOf(tenant, operationKey) });
  return p.found ? p.count : 0;
}

export async function startKb(seed: KbSeedFile, env: Record<string, string> = {}): Promise<TestKb> {
  const dir = mkdtempSync(join(tmpdir(), 'tooltx-kb-'));
  const token = `token-${Math.random().toString(36).slice(2)}-${Date.now()}`;
  writeFileSync(join(dir, 'admin.token'), token, { mode: 0o600 });
  writeFileSync(join(dir, 'seed.json'), JSON.stringify(seed));
  // A test may name its own token file; the client then sends that token.
  const serviceToken =
    env.KB_SERVICE_TOKEN_FILE === undefined
      ? kbServiceToken()
      : { file: env.KB_SERVICE_TOKEN_FILE, token: readFileSync(env.KB_SERVICE_TOKEN_FILE, 'utf8').trim() };
  const proc = spawnKbProcess({
    LOG_LEVEL: 'info',
    KB_DB: join(dir, 'kb.sqlite'),
    KB_DEDUP: 'off',
    KB_SEED_FILE: join(dir, 'seed.json'),
    KB_ADMIN_TOKEN_FILE: join(dir, 'admin.token'),
    KB_SERVICE_TOKEN_FILE: serviceToken.file,
    ...env,
  });
  const line = await proc.waitForLog('listening');
  const url = `http://127.0.0.1:${Number(line.port)}`;
  const client = new KbClient(url, { serviceToken: serviceToken.token });
  return {
    proc,
    url,
    serviceToken,
    client,
    admin: client.admin(token),
    async stop() {
      await client.close();
      const code = await proc.stop();
      rmSync(dir, { recursive: true, force: true });
      return code;
    },
  };
}

/** A note to write straight to the KB in its own tests (`kb` = the reference), overridable field by field. */
export const sampleNote = (kb = 'research', over: Partial<KbNote> = {}): KbNote => ({
  kb,
  title: 'Raft in one page',
  body: 'Leader election, log replication and safety.',
  sourceUrl: 'https://example.org/raft',
  fetchedAt: '2024-05-01T10:00:00+02:00',
  ...over,
});

/** An absolute deadline 30 s from now (ms since the epoch), for direct KB writes. */
export const soon = (): number => Date.now() + 30_000;
