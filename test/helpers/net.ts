/** A loopback TCP port nothing listens on right now (bound once to port 0, then closed). */
export { freeLoopbackPort as closedPort } from '@tooltx/dev/nats-server';
