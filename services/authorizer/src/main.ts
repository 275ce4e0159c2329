/**
 * tooltx authorizer — consumes intents, checks them in DESIGN.md's order and registers operations;
 * also serves the status endpoint (`<prefix>.status.<tenant>.<actor>`, queue group `tooltx-status`).
 *
 * Usage: `tsx services/authorizer/src/main.ts [--help]`. Configuration from the environment:
 * NATS_URL, NATS_CREDS_FILE, TOOLTX_PREFIX, TOOLTX_TOOLS_MODULE (required), TOOLTX_CONCURRENCY,
 * LOG_LEVEL, TOOLTX_INSTANCE_ID and the stream settings of `tooltx streams apply`.
 * Stops cleanly on SIGTERM/SIGINT: stops pulling, finishes in-flight intents, drains.
 */
import { AnswerPusher, FrozenTaskWatch, startConsumerLoop, openBucket } from '@tooltx/nats';
import { runService } from '@tooltx/runtime/service';
import { Durables } from '@tooltx/streams';
import { intentHandler } from './authorize.js';
import { StatusService } from './status.js';

await runService({
  name: 'authorizer',
  summary: 'consumes intents, checks identity, contract, key and policy, registers operations, and answers status requests',
  async start({ subjects, store, tools, log, js, nc, config }) {
    const results = await openBucket(nc, subjects.resultsBucket);
    const status = new StatusService({ nc, js, subjects, store, results, tools, log: log.child({ component: 'status' }) });
    await status.start();
    const frozen = new FrozenTaskWatch(await openBucket(nc, subjects.tasksBucket), log.child({ component: 'frozen-tasks' }));
    await frozen.start();
    const loop = await startConsumerLoop({
      js,
      stream: subjects.intentsStream,
      durable: Durables.authorizer,
      concurrency: config.TOOLTX_CONCURRENCY,
      log,
      handle: intentHandler({ subjects, store, tools, log, frozen, results, pusher: new AnswerPusher({ subjects, log, publish: (subject, data) => nc.publish(subject, data) }) }),
    });
    return async () => {
      await loop.stop();
      await status.stop();
      await frozen.stop();
    };
  },
});
