/**
 * The names a host addresses (docs/mcp.md), apart from the server's code: `tooltx --help` and every
 * other CLI command read them without loading the MCP SDK.
 */
/** The HTTP header that carries a connection's task id. */
export const TASK_ID_HEADER = 'tooltx-task-id';
/** The Streamable HTTP endpoint. */
export const MCP_PATH = '/mcp';
