/**
 * Who a connection is, as subjects see it, and where its replies arrive: every identity has one
 * inbox prefix and subscribes nowhere else (FM-32).
 */

export type Role =
  | { kind: 'agent'; tenant: string; actor: string }
  | { kind: 'auditor'; tenant: string; actor: string }
  | { kind: 'service'; service: ServiceName }
  | { kind: 'operator'; operator: string }
  | { kind: 'provisioner' };
/**
 * The service identities. `host` is the identity of a process that hosts every role (`tooltx
 * serve`): one connection with the union of the four roles' permissions and the event log's `host`
 * durable, which it reads once for the three roles that consume the log (docs/operating.md "One
 * process or four"). A process that holds every role's seed holds that union already.
 */
export const SERVICE_NAMES = ['authorizer', 'executor', 'reconciler', 'audit-projector', 'host'] as const;
export type ServiceName = (typeof SERVICE_NAMES)[number];

/** The inbox prefix of a user: replies to its requests arrive only under it. */
export function inboxPrefixOf(role: Role): string {
  switch (role.kind) {
    case 'agent':
    case 'auditor':
      return `_INBOX.${role.tenant}.${role.actor}`;
    case 'service':
      return `_INBOX._svc.${role.service}`;
    case 'operator':
      return `_INBOX._op.${role.operator}`;
    case 'provisioner':
      return '_INBOX._provisioner';
  }
}

/**
 * Whether `reply` lies in `role`'s own reply inbox (`<inboxPrefixOf(role)>.…`). A request/reply
 * service answers only there: the reply subject is chosen by the requester, and the service may
 * publish on subjects the requester may not (e.g. operation subjects), so answering anywhere else
 * would let a requester make the service write into another tenant's stream (FM-31, FM-32).
 */
export function isOwnReplyInbox(role: Role, reply: string | undefined): boolean {
  if (reply === undefined || /[\s*>]/.test(reply)) return false;
  // Across a service import the server rewrote the reply to a mapping back into the requester's own
  // account (generateAuth puts agents, auditors and operators in their own accounts).
  return reply.startsWith('_R_.') || reply.startsWith(`${inboxPrefixOf(role)}.`);
}

/**
 * The reply subjects nats-server makes for a request that crossed a service import (`_R_.<id>.<id>`
 * in the exporting account): an answer published there goes back to the requester's account only.
 */
export const RESPONSE_SUBJECTS = '_R_.>';
