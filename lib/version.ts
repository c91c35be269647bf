// What each name of the executable says about itself: --version, --help, and (for the CNI plugins run by
// hand without CNI_COMMAND) the "about" text the reference plugins print. Kept free of heavy imports.
import { version } from '../package.json';
import { SUPPORTED_VERSIONS } from './cni-spec';

export const VERSION: string = version;

const CNI_VERSIONS = `CNI protocol versions supported: ${SUPPORTED_VERSIONS.join(', ')}`;

const DESCRIPTION: Record<string, string> = {
  tether: 'CNI tether plugin (chained: egress steering and gateways, pod MTU, VIPs; the work is done by tetherd)',
  'tether-ipam': 'CNI tether-ipam plugin (IPAM from tetherd\'s address pools)',
  tetherd: 'tetherd, the Tether node daemon',
  'tether-operator': 'tether-operator, the cluster\'s controllers of Tether',
  tetherctl: 'tetherctl, the command line of a node\'s tetherd',
  'tether-install': 'tether-install, the installer of the CNI executables and configuration on a node',
};

const CNI_USAGE = (name: string) => `usage: ${name} --help | --version
  Run by the container runtime as a CNI plugin: the command in CNI_COMMAND (ADD, DEL, CHECK, VERSION,
  STATUS, GC), the network configuration on stdin, the result or error on stdout (CNI specification).
  It forwards each request to the node's tetherd over its socket (${name === 'tether' ? 'socketPath' : 'ipam.socketPath'} in the
  configuration, default /run/tether/tetherd.sock).
${CNI_VERSIONS}`;

/** The names that are not CNI plugins (each prints its own usage); any other name answers as one. */
const NOT_CNI = new Set(['tetherd', 'tether-operator', 'tetherctl', 'tether-install']);

export function isCniPlugin(name: string): boolean {
  return !NOT_CNI.has(name);
}

/** The reference plugins' "about": name and version, then the spec versions. */
export function about(name: string): string {
  return `${DESCRIPTION[name] ?? DESCRIPTION.tether} v${VERSION}${isCniPlugin(name) ? `\n${CNI_VERSIONS}` : ''}`;
}

/** Where answerCommandLine writes (process.stdout and process.stderr unless told otherwise). */
export interface TextSink {
  write(text: string): unknown;
}

/**
 * The answers that need no daemon: `--version` and `--help` for every name (tetherd, tether-operator and
 * tetherctl print their own usage), and the CNI plugins run with no CNI_COMMAND. Returns the exit code, or undefined when
 * the command line is not one of these.
 */
export function answerCommandLine(name: string, args: string[], env: NodeJS.ProcessEnv, out: TextSink = process.stdout, err: TextSink = process.stderr): number | undefined {
  if (args.includes('--version')) {
    out.write(`${about(name)}\n`);
    return 0;
  }
  if (!isCniPlugin(name)) return undefined;
  if (args.includes('--help') || args.includes('-h')) {
    out.write(`${about(name)}\n${CNI_USAGE(name === 'tether-ipam' ? name : 'tether')}\n`);
    return 0;
  }
  if (!env.CNI_COMMAND) {
    err.write(`${about(name)}\n`);
    return 0;
  }
  return undefined;
}
