/**
 * The quickstart's trusted side: `notes.write` stores notes in a JSON-lines file under
 * `TOOLTX_STATE_DIR` (default `.state`), one file per tenant, deduplicating by the downstream key
 * (`honoursKey: true`) and answering probes by it.
 */
import { appendFile, mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { defineImplementation } from '@tooltx/contracts';
import { notesWrite } from './contracts.js';

const dir = () => join(process.env.TOOLTX_STATE_DIR ?? '.state', 'notes');
const file = (tenant: string) => join(dir(), `${tenant}.jsonl`);

async function find(tenant: string, key: string): Promise<{ noteId: string } | null> {
  const text = await readFile(file(tenant), 'utf8').catch(() => '');
  for (const line of text.split('\n')) {
    if (!line) continue;
    const row = JSON.parse(line) as { key: string; noteId: string };
    if (row.key === key) return { noteId: row.noteId };
  }
  return null;
}

export const implementations = [
  defineImplementation({
    contract: notesWrite,
    async execute(input, ctx) {
      const existing = await find(ctx.tenant, ctx.downstreamKey);
      if (existing) return { resourceId: existing.noteId, result: existing };
      const noteId = `note_${randomUUID()}`;
      await mkdir(dir(), { recursive: true });
      await appendFile(file(ctx.tenant), `${JSON.stringify({ key: ctx.downstreamKey, noteId, notebook: input.notebook, title: input.title, bytes: input.body.length, at: new Date().toISOString() })}\n`);
      return { resourceId: noteId, result: { noteId } };
    },
    async probe(ctx) {
      const hit = await find(ctx.tenant, ctx.downstreamKey);
      return hit ? { found: true, resourceId: hit.noteId } : { found: false };
    },
  }),
];
