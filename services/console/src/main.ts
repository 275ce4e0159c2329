/**
 * tooltx console — web pages for operators and auditors over the tooltx services (docs/console.md);
 * the same as `tooltx console`. Usage: `tsx services/console/src/main.ts [--help]`; TOOLTX_AUTH_DIR
 * names the directory `tooltx auth generate` wrote. Stops cleanly on SIGTERM/SIGINT.
 */
import { runConsole } from './console.js';

await runConsole(process.argv);
