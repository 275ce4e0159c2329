import { errors, type NatsConnection } from '@nats-io/transport-node';

type PermissionViolation = InstanceType<typeof errors.PermissionViolationError>;

/**
 * Resolves with the permission violation the server raises for `fn` on `nc` (thrown by the call,
 * or reported asynchronously on the connection's status), or rejects after 5 s without one.
 */
export async function permissionError(nc: NatsConnection, fn: () => unknown): Promise<PermissionViolation> {
  let stop = false;
  const seen = new Promise<PermissionViolation>((resolve) => {
    void (async () => {
      for await (const s of nc.status()) {
        if (stop) return;
        if (s.type === 'error' && s.error instanceof errors.PermissionViolationError) return resolve(s.error);
      }
    })();
  });
  try {
    await fn();
  } catch (err) {
    if (err instanceof errors.PermissionViolationError) return err;
    if (err instanceof Error && err.cause instanceof errors.PermissionViolationError) return err.cause;
  }
  try {
    return await Promise.race([
      seen,
      new Promise<never>((_, reject) => setTimeout(() => reject(new Error('no permission violation')), 5_000)),
    ]);
  } finally {
    stop = true;
  }
}
