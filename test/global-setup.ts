import type { TestProject } from 'vitest/node';
import { findOrStartNatsServer, type NatsServerHandle } from '@tooltx/nats';

declare module 'vitest' {
  export interface ProvidedContext {
    natsUrl: string;
  }
}

let server: NatsServerHandle | undefined;

/** One nats-server per test run (NATS_URL, else the binary on a free loopback port, temp store). */
export async function setup(project: TestProject): Promise<void> {
  server = await findOrStartNatsServer();
  project.provide('natsUrl', server.url);
}

export async function teardown(): Promise<void> {
  await server?.stop();
}
