import { jetstreamManager } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { currentEntrySchema, currentKeyOf } from '@tooltx/lifecycle';
import { decode, type Subjects } from '@tooltx/nats';

/**
 * The current version of each contract name in `names`, from the contract registry
 * (docs/contracts.md): one direct get of its `current.<name>` key each, the only registry read an
 * agent is allowed. A name with no entry, or a read that fails, is left out (its unpinned calls
 * are refused as before: no single contract). Never throws.
 */
export async function readCurrentVersions(
  nc: NatsConnection,
  subjects: Subjects,
  names: readonly string[],
): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  if (!names.length) return out;
  const bucket = subjects.contractsBucket;
  try {
    // No `$JS.API.INFO` (an agent may not send it): the direct gets only.
    const jsm = await jetstreamManager(nc, { checkAPI: false });
    await Promise.all(
      names.map(async (name) => {
        try {
          const m = await jsm.direct.getMessage(`KV_${bucket}`, {
            last_by_subj: `$KV.${bucket}.${currentKeyOf(name)}`,
          });
          if (m?.data.length) out.set(name, decode(currentEntrySchema, m.data).current);
        } catch {
          // not registered, or not readable: left out
        }
      }),
    );
  } catch {
    // no JetStream manager: nothing known
  }
  return out;
}
