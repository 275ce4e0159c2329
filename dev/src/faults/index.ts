/**
 * The fault-injection harness shared by the tests and the demo: real
 * sockets, no mocks. {@link TcpFaultProxy} sits between agents and nats-server and is programmable
 * per connection; {@link HttpFaultProxy} sits between the executor and an HTTP downstream (the KB)
 * and is programmable per request key header.
 */
export {
  type ConnectionMatch,
  type Direction,
  type TcpConnection,
  type TcpFault,
  TcpFaultProxy,
  type TcpInjectedFault,
} from './tcp-proxy.js';
export {
  type HttpFault,
  HttpFaultProxy,
  type InjectedFault,
  type Injection,
  type InjectOptions,
} from './http-proxy.js';
