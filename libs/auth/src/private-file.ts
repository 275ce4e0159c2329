import { chmodSync, renameSync, writeFileSync } from 'node:fs';

/**
 * Writes `text` to `file` with mode 0600 whatever the file's mode was (`writeFileSync`'s mode applies
 * only to a file it creates), through a temporary file renamed into place: a crash never leaves it
 * half written.
 */
export function writePrivate(file: string, text: string): void {
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, text, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, file);
}
