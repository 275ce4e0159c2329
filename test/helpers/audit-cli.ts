import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { TestNats } from './nats.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** What one `tooltx audit …` run printed, and its exit code. */
export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
  /** stdout parsed as JSON lines (or one pretty-printed JSON document). */
  json: Record<string, unknown>[];
}

/** Runs `tooltx audit <args>` as a process, authenticated as `tenant`'s auditor `auditor` (its own seed). */
export function auditCli(
  t: TestNats,
  tenant: string,
  auditor: string,
  args: string[],
  env: Record<string, string> = {},
): Promise<CliRun> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', join(ROOT, 'bin', 'tooltx.ts'), 'audit', ...args],
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          NATS_URL: t.url,
          TOOLTX_PREFIX: t.subjects.prefix,
          NATS_NKEY_FILE: env.NATS_NKEY_FILE ?? t.auth.seedFile({ kind: 'auditor', tenant, actor: auditor }),
          TOOLTX_TENANT: tenant,
          TOOLTX_AUDITOR: auditor,
          ...env,
        },
        maxBuffer: 64 * 1024 * 1024,
      },
      (err, stdout, stderr) => {
        const text = stdout.trim();
        let json: Record<string, unknown>[] = [];
        try {
          json = text.startsWith('{\n')
            ? [JSON.parse(text) as Record<string, unknown>]
            : text
                .split('\n')
                .filter(Boolean)
                .map((l) => JSON.parse(l) as Record<string, unknown>);
        } catch {
          json = [];
        }
        resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr, json });
      },
    );
  });
}
