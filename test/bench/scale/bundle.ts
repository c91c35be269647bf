// Bundles the simulation worker with the kernel-facing modules of tetherd swapped for recording fakes.
// The swap is by resolved path at bundle time, so the controllers, stores, IPAM and config source bundled
// are tetherd's own, whatever their constructors or internals become. A kernel-facing module with no fake
// is bundled as a tripwire: loading it works, calling any of its exports throws naming it.
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as esbuild from 'esbuild';

const ROOT = path.resolve(__dirname, '../../..');
const FAKES = path.join(__dirname, 'fakes');

/** Real module (relative to the repository) → its fake (relative to fakes/). */
export const FAKED: Record<string, string> = {
  'daemon/bpf/lb.ts': 'bpf-lb.ts',
  'daemon/bpf/fou.ts': 'bpf-fou.ts',
  'daemon/bpf/egress-steer.ts': 'bpf-egress-steer.ts',
  'daemon/netlink/index.ts': 'netlink.ts',
  'daemon/netlink/handle.ts': 'netlink.ts',
  'daemon/conntrack/index.ts': 'conntrack.ts',
  'daemon/conntrack/handle.ts': 'conntrack.ts',
  'daemon/conntrack/events.ts': 'conntrack.ts',
  'daemon/egress/gateway-datapath.ts': 'gateway-datapath.ts',
  'daemon/sys/netns.ts': 'netns.ts',
  'daemon/bfd/threaded.ts': 'bfd-threaded.ts',
};

/** Kernel-facing modules that must never run in the simulation (no fake: calls throw). */
export const TRIPWIRED = [
  'daemon/sys/ffi.ts', 'daemon/sys/libc.ts',
  'daemon/bpf/libbpf.ts', 'daemon/bpf/object.ts', 'daemon/bpf/map.ts', 'daemon/bpf/tc.ts', 'daemon/bpf/egress-guard.ts', 'daemon/bpf/bpffs.ts',
  'daemon/netlink/socket.ts', 'daemon/conntrack/ctnl-socket.ts', 'daemon/conntrack/event-reader.ts', 'daemon/conntrack/event-ring.ts',
  'daemon/egress/announce-l2.ts', 'daemon/bfd/endpoint.ts', 'daemon/bfd/worker-main.ts',
];

function resolveTs(base: string): string | undefined {
  for (const c of [base, `${base}.ts`, path.join(base, 'index.ts')]) if (fs.existsSync(c) && fs.statSync(c).isFile()) return c;
  return undefined;
}

export function substitutionPlugin(seen?: Set<string>): esbuild.Plugin {
  const faked = new Map(Object.entries(FAKED).map(([real, fake]) => [path.join(ROOT, real), path.join(FAKES, fake)]));
  const tripwired = new Set(TRIPWIRED.map((p) => path.join(ROOT, p)));
  return {
    name: 'tether-sim-substitution',
    setup(build) {
      build.onResolve({ filter: /^\.\.?\// }, (args) => {
        if (args.importer.startsWith(FAKES)) return undefined; // a fake imports the real pure modules
        const target = resolveTs(path.resolve(args.resolveDir, args.path));
        if (!target) return undefined;
        const fake = faked.get(target);
        if (fake) {
          seen?.add(path.relative(ROOT, target));
          return { path: fake };
        }
        if (tripwired.has(target)) {
          seen?.add(path.relative(ROOT, target));
          return { path: path.relative(ROOT, target), namespace: 'tether-sim-tripwire' };
        }
        return undefined;
      });
      build.onLoad({ filter: /.*/, namespace: 'tether-sim-tripwire' }, (args) => ({
        loader: 'js',
        contents: `module.exports = new Proxy({}, { get(_t, k) {
  if (typeof k !== 'string' || k === '__esModule' || k === 'then' || k === 'default') return undefined;
  return function () { throw new Error('simulation: ' + k + ' of ${args.path} reaches the kernel and has no fake (add one under test/bench/scale/fakes)'); };
} });`,
      }));
    },
  };
}

/** Bundles `entry` (CommonJS, node) to `outfile`; returns the real modules that were substituted. */
export async function bundleSim(entry: string, outfile: string): Promise<string[]> {
  const seen = new Set<string>();
  await esbuild.build({
    entryPoints: [entry],
    outfile,
    bundle: true,
    platform: 'node',
    target: 'node20',
    format: 'cjs',
    sourcemap: false,
    logLevel: 'error',
    external: ['koffi', 'esbuild'],
    alias: { 'supports-color': path.join(ROOT, 'install/stubs/supports-color.js'), bufferutil: path.join(ROOT, 'install/stubs/absent-optional.js'), 'utf-8-validate': path.join(ROOT, 'install/stubs/absent-optional.js'), encoding: path.join(ROOT, 'install/stubs/absent-optional.js') },
    plugins: [substitutionPlugin(seen)],
  });
  return [...seen].sort();
}
