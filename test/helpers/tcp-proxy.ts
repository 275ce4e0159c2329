/** The agents → nats-server hop now lives in the shared fault harness (`@tooltx/dev/faults`, also used by the demo). */
export { TcpFaultProxy as TcpProxy, type TcpConnection, type TcpFault } from '@tooltx/dev/faults';
