import type { Command } from 'commander';

/**
 * Makes commander's own usage errors — an unknown option or command, a missing argument or
 * required option, an invalid choice — exit 2 like every other bad-usage error of tooltx's CLIs
 * (docs/operating.md "The tooltx CLI": "2 bad usage or configuration"); commander exits 1 for them by default. `--help` and
 * `--version` still exit 0. Commander prints its message before exiting, as without this.
 *
 * Call it on the program before adding subcommands: `.command()` copies the setting to each one
 * (commander `copyInheritedSettings`). Its error messages are cut at 2,000 characters. Returns `cmd`.
 */
export function usageErrorsExitTwo<C extends Command>(cmd: C): C {
  cmd.exitOverride((err) => process.exit(err.exitCode === 0 ? 0 : 2));
  // Commander quotes an unknown option or argument in full: bounded, as every other message.
  cmd.configureOutput({
    outputError: (text, write) => write(text.length > 2_000 ? `${text.slice(0, 2_000)}…\n` : text),
  });
  return cmd;
}
