/** The executor → KB hop now lives in the shared fault harness (`@tooltx/dev/faults`, also used by the demo). */
export { HttpFaultProxy as DelayProxy, type HttpFault, type InjectedFault } from '@tooltx/dev/faults';
