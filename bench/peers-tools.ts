/**
 * The trusted half of the peers workload's tool (./peers-contracts.ts), loaded by the services from
 * `TOOLTX_TOOLS_MODULE`: `execute` appends `<key> <execId>\n` to the file named by
 * `PEERS_EFFECTS_FILE` with one `write(2)` on a descriptor opened once with `O_APPEND` (flag `a`),
 * as the peers bench's `sideEffect` does, and returns the execId as the resource id with an empty
 * result (a receipt-only write). The execId is the operation's downstream key and the attempt
 * (`tx_….1`), so `probe` can find an attempt's line by the key alone: recovery then commits an
 * attempt whose line exists instead of leaving it `unknown`. Nothing is fsynced: the line's
 * durability is the OS's, the same for every system of the workload.
 */
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs';
import { StartupError } from '@tooltx/runtime';
import { appendLine } from './peers-contracts.js';

const EFFECTS_FILE = process.env.PEERS_EFFECTS_FILE ?? '';
if (!EFFECTS_FILE.trim())
  throw new StartupError('PEERS_EFFECTS_FILE', process.env.PEERS_EFFECTS_FILE, 'required: the file the lines go to');

/** This module's own settings, listed by a service's `--help`. */
export const settingsHelp = `  PEERS_EFFECTS_FILE       the file each call appends its line to (required)`;

let fd: number | undefined;
process.once('exit', () => {
  if (fd !== undefined) closeSync(fd);
});

export const implementations = [
  appendLine.implement({
    async execute({ key }, ctx) {
      fd ??= openSync(EFFECTS_FILE, 'a');
      const execId = `${ctx.downstreamKey}.${ctx.attempt}`;
      writeSync(fd, `${key} ${execId}\n`);
      return { resourceId: execId, result: {} };
    },
    // Read-only: the first line whose execId carries this operation's downstream key.
    async probe(ctx) {
      let text = '';
      try {
        text = readFileSync(EFFECTS_FILE, 'utf8');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
      const prefix = `${ctx.downstreamKey}.`;
      for (const line of text.split('\n')) {
        const execId = line.slice(line.indexOf(' ') + 1);
        if (execId.startsWith(prefix)) return { found: true, resourceId: execId };
      }
      return { found: false };
    },
  }),
];
