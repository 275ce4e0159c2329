/**
 * `tooltx console`: serves the web console for operators and auditors (docs/console.md). Its code
 * (fastify and the templates) is loaded only when this command runs, not by every other command.
 */
import type { Command } from 'commander';

/** Registers `console` on the CLI: the console owns its arguments (--help) and its environment. */
export function registerConsole(program: Command): void {
  program
    .command('console')
    .description(
      'serve the console: web pages for operators and auditors (operations by state, timelines, takeovers): tooltx console --help',
    )
    .helpOption(false)
    .allowUnknownOption()
    .allowExcessArguments()
    .action(async () => {
      const at = process.argv.indexOf('console');
      const { runConsole } = await import('../../services/console/src/console.js');
      await runConsole([process.argv[0]!, 'tooltx console', ...process.argv.slice(at + 1)]);
    });
}
