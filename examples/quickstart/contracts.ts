/**
 * The quickstart's contract, shared with agents: `notes.write` appends a note to a notebook.
 * Target = the notebook; intent = title + body. The implementation lives in ./tools.ts (trusted side).
 */
import { z } from 'zod';
import { defineContract, normalise } from '@tooltx/contracts';

export const notesWrite = defineContract({
  name: 'notes.write',
  version: 1,
  description: 'Append a Markdown note to a notebook.',
  effect: 'create',
  input: z.strictObject({
    notebook: z.string().regex(/^[a-z0-9-]{1,64}$/),
    title: z.string().min(1).max(200),
    body: z.string().max(20_000),
  }),
  output: z.object({ noteId: z.string() }),
  normalise: { title: normalise.title, body: normalise.markdown },
  target: (i) => ({ notebook: i.notebook }),
  intent: (i) => ({ title: i.title, body: i.body }),
  key: { scope: 'tenant', retentionMs: 7 * 24 * 3600_000 },
  timing: { timeoutMs: 5_000, runningBoundMs: 30_000, unknownDeadlineMs: 10 * 60_000 },
  downstream: { honoursKey: true, enforcesDeadline: false },
});

export const contracts = [notesWrite];
