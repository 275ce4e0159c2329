import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * The KB service token of this test process (examples/research-kb/kb-server.ts
 * `KB_SERVICE_TOKEN_FILE`): one random token (64 hex characters, mode 0600) per test file's
 * process, so every KB `startKb` starts and every service `startService` gives a `KB_URL` talk
 * with the same credential — whatever proxy sits between them. Written under the run's directory
 * (`TOOLTX_TEST_RUN_DIR`, which the global setup removes when the run ends) and removed when the
 * process exits.
 */
let file: string | undefined;
let token: string | undefined;

export function kbServiceToken(): { file: string; token: string } {
  if (file === undefined || token === undefined) {
    const dir = mkdtempSync(join(process.env.TOOLTX_TEST_RUN_DIR ?? tmpdir(), 'tooltx-kb-service-'));
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    token = randomBytes(32).toString('hex');
    file = join(dir, 'kb-service.token');
    writeFileSync(file, `${token}\n`, { mode: 0o600 });
  }
  return { file, token };
}
