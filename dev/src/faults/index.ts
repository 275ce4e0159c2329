/**
 * The fault-injection harness shared by the tests and the demo: real
 * sockets, no mocks. {@link TcpFaultProxy} sits between agents and nats-server and is programmable
 * per connection; {@link HttpFaultProxy} sits between the executor and an HTTP downstream (the KB)
 * and is programmable per request key header.
 */
export * from './tcp-proxy.js';
export * from './http-proxy.js';
