/** The command line of the `svc` subcommands that take `--flag value` (or `--flag=value`), `--json` and positional arguments. */

/** A command line that cannot be run: the subcommand prints it with its usage and exits 2. */
export class UsageError extends Error {}

export interface ParsedArgs {
  positional: string[];
  flags: Map<string, string>;
  json: boolean;
}

export function parseArgs(args: readonly string[]): ParsedArgs {
  const positional: string[] = [];
  const flags = new Map<string, string>();
  let json = false;
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === '--json') json = true;
    else if (arg.startsWith('--')) {
      const eq = arg.indexOf('=');
      const [name, value] = eq > 0 ? [arg.slice(0, eq), arg.slice(eq + 1)] : [arg, args[++i]];
      if (value === undefined) throw new UsageError(`${name} needs a value`);
      flags.set(name, value);
    } else positional.push(arg);
  }
  return { positional, flags, json };
}
