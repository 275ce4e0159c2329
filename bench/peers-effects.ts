/**
 * The side effect of the peers workload and how it is counted (the same as the peers bench's
 * lib/workload.mjs): each call appends one line `<key> <execId>` to a local file, opened with
 * `O_APPEND` (flag `a`), one `write(2)` per line; after a run the lines are counted per key, and
 * every key must have exactly one. Keys are `<runId>-<k>`: call `k` of the run.
 */
import { closeSync, existsSync, openSync, readFileSync, writeSync } from 'node:fs';
import { randomBytes } from 'node:crypto';

/** The key of call `k` of run `runId` (what the line starts with). */
export function effectsKey(runId: string, k: number): string {
  return `${runId}-${k}`;
}

/** An appender to `file` (opened on first use): writes `<key> <execId>\n` and returns the execId. */
export function effectsAppender(file: string): { append(key: string): string; close(): void } {
  let fd: number | undefined;
  return {
    append(key) {
      fd ??= openSync(file, 'a');
      const execId = `${process.pid}-${randomBytes(5).toString('hex')}`;
      writeSync(fd, `${key} ${execId}\n`);
      return execId;
    },
    close() {
      if (fd !== undefined) closeSync(fd);
      fd = undefined;
    },
  };
}

/**
 * The lines of `file` counted per key: `rows` = all lines, `duplicateRows` = lines beyond one per
 * key (the duplicates figure). A missing file counts as no line.
 */
export function countEffects(file: string): { rows: number; duplicateRows: number; keys: number } {
  const counts = new Map<string, number>();
  const text = existsSync(file) ? readFileSync(file, 'utf8') : '';
  let rows = 0;
  for (const line of text.split('\n')) {
    if (!line) continue;
    rows++;
    const key = line.slice(0, line.indexOf(' ') < 0 ? line.length : line.indexOf(' '));
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  let duplicateRows = 0;
  for (const n of counts.values()) duplicateRows += n - 1;
  return { rows, duplicateRows, keys: counts.size };
}
