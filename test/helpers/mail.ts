import { randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { MailClient, type MailAdmin } from '../../examples/research-kb/mail-client.js';
import { ServiceProcess } from './services.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const MAIL_SERVER = join(ROOT, 'examples', 'research-kb', 'mail-server.ts');

/** Spawns the mail outbox as its own process (free port, debug logs unless `env` says otherwise). */
export function spawnMailProcess(env: Record<string, string>, args: string[] = []): ServiceProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', MAIL_SERVER, ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', LOG_LEVEL: 'debug', MAIL_PORT: '0', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new ServiceProcess('mail-server', child);
}

/**
 * The mail outbox as its own process on a free port, with a fresh SQLite file, an operator token
 * (for its fault switch) and a service token, as a deployment runs it. `MAIL_DEDUP` defaults to
 * `off`, as the KB's test helper does: a sink that deduplicates nothing shows a double send.
 */
export interface TestMail {
  proc: ServiceProcess;
  url: string;
  db: string;
  /** The outbox's `MAIL_SERVICE_TOKEN_FILE` and the token in it. */
  serviceToken: { file: string; token: string };
  /** The operator token (its `MAIL_ADMIN_TOKEN_FILE`), for the fault switch. */
  adminToken: string;
  /** A client with the service token. */
  client: MailClient;
  admin: MailAdmin;
  stop(): Promise<number | null>;
}

export async function startMail(env: Record<string, string> = {}): Promise<TestMail> {
  const dir = mkdtempSync(join(process.env.TOOLTX_TEST_RUN_DIR ?? tmpdir(), 'tooltx-mail-'));
  const adminToken = `admin-${randomBytes(12).toString('hex')}`;
  writeFileSync(join(dir, 'admin.token'), adminToken, { mode: 0o600 });
  // A test may name the token file of an earlier outbox (a restart); the client then sends its token.
  let serviceFile = env.MAIL_SERVICE_TOKEN_FILE;
  let token: string;
  if (serviceFile === undefined) {
    token = randomBytes(32).toString('hex');
    serviceFile = join(dir, 'service.token');
    writeFileSync(serviceFile, `${token}\n`, { mode: 0o600 });
  } else token = readFileSync(serviceFile, 'utf8').trim();
  const db = join(dir, 'mail.sqlite');
  const proc = spawnMailProcess({
    LOG_LEVEL: 'debug',
    MAIL_DB: db,
    MAIL_DEDUP: 'off',
    MAIL_ADMIN_TOKEN_FILE: join(dir, 'admin.token'),
    MAIL_SERVICE_TOKEN_FILE: serviceFile,
    ...env,
  });
  const line = await proc.waitForLog('listening');
  const url = `http://127.0.0.1:${Number(line.port)}`;
  const client = new MailClient(url, { serviceToken: token });
  return {
    proc,
    url,
    db,
    serviceToken: { file: serviceFile, token },
    adminToken,
    client,
    admin: client.admin(adminToken),
    async stop() {
      await client.close();
      const code = await proc.stop();
      rmSync(dir, { recursive: true, force: true });
      return code;
    },
  };
}

/** A mail to send straight to the outbox in its own tests, overridable field by field. */
export const sampleMail = (over: Partial<{ to: string[]; cc: string[]; subject: string; body: string }> = {}) => ({
  to: ['ops@example.org'],
  subject: 'Weekly research digest',
  body: 'Three new notes on consensus:\n\n- Raft in one page\n- Paxos made simple\n- Viewstamped replication',
  ...over,
});
