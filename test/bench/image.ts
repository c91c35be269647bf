// Benchmark (not a test): the image's size and build time. Runs `bash install/image.sh` (timed; the Debian
// base comes from its cache when its key matches, which the result says), then measures the OCI archive (what a
// node imports), each layer compressed, the base tarball alone and the unpacked root filesystem (umoci).
// BENCH_IMAGE_COLD=1 first empties the cache, so the time is a first build (debootstrap from the mirror).
// Writes results/bench-image.json and the README block bench:image.
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { machine, updateReadme } from './stats';

const repo = path.resolve(__dirname, '../..');
const ARCHIVE = path.join(repo, 'dist/image/tether.oci.tar');
const CACHE = process.env.TETHER_IMAGE_CACHE ?? '/var/cache/tether-image';
const VERSION = (JSON.parse(fs.readFileSync(path.join(repo, 'package.json'), 'utf8')) as { version: string }).version;
const TAG = `ghcr.io/tether-cni/tether:${VERSION}`;
const MB = (bytes: number) => Math.round((bytes / 2 ** 20) * 10) / 10;

function baseTarball(): string | undefined {
  if (!fs.existsSync(CACHE)) return undefined;
  const t = fs.readdirSync(CACHE).find((f) => /^base-.*\.tar$/.test(f));
  return t && path.join(CACHE, t);
}

/** Bytes under a directory as the files' sizes add up (du's apparent size: what a node's disk holds). */
function apparentBytes(dir: string): number {
  return Number(execFileSync('du', ['-sb', dir], { encoding: 'utf8' }).split('\t')[0]);
}

function main(): void {
  if (process.getuid?.() !== 0) throw new Error('the image benchmark needs root (debootstrap, buildah)');
  const cold = process.env.BENCH_IMAGE_COLD === '1';
  if (cold) fs.rmSync(CACHE, { recursive: true, force: true });
  const t0 = process.hrtime.bigint();
  const build = spawnSync('bash', ['install/image.sh'], { cwd: repo, encoding: 'utf8' });
  const buildSeconds = Math.round(Number(process.hrtime.bigint() - t0) / 1e8) / 10;
  if (build.status !== 0) throw new Error(`bash install/image.sh failed (exit ${build.status}): ${build.stderr}${build.stdout}`);
  process.stdout.write(build.stdout);
  // image-base.sh announces a debootstrap run on stderr; silent means the cached tarball was used.
  const baseCached = !/image-base: debootstrap/.test(build.stderr);

  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-bench-image-'));
  try {
    const layout = path.join(tmp, 'layout');
    fs.mkdirSync(layout);
    execFileSync('tar', ['-C', layout, '-xf', ARCHIVE]);
    const index = JSON.parse(fs.readFileSync(path.join(layout, 'index.json'), 'utf8'));
    const blob = (d: string) => JSON.parse(fs.readFileSync(path.join(layout, 'blobs', ...d.split(':')), 'utf8'));
    const manifest = blob(index.manifests[0].digest);
    const layers = (manifest.layers as { digest: string; size: number }[]).map((l) => ({ digest: l.digest, compressedMB: MB(l.size) }));
    execFileSync('umoci', ['unpack', '--image', `${layout}:${TAG}`, path.join(tmp, 'bundle')], { stdio: ['ignore', 'ignore', 'pipe'] });
    const rootfs = path.join(tmp, 'bundle/rootfs');
    const base = baseTarball();
    const result = {
      benchmark: 'image',
      machine: machine(),
      note: 'sizes in MiB; archive = the OCI tar a node imports (gzip layers); unpacked = the root filesystem as umoci lays it out; base = the Debian minbase layer (debootstrap + libbpf1, nftables, util-linux, iproute2, stripped)',
      build: { seconds: buildSeconds, baseFromCache: baseCached, cold },
      archiveMB: MB(fs.statSync(ARCHIVE).size),
      manifest: index.manifests[0].digest,
      layers,
      unpackedMB: MB(apparentBytes(rootfs)),
      tetherFilesMB: MB(apparentBytes(path.join(rootfs, 'opt/tether'))),
      base: { tarMB: base ? MB(fs.statSync(base).size) : null, layerCompressedMB: layers[0]?.compressedMB ?? null },
    };
    fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
    fs.writeFileSync(path.join(repo, 'results/bench-image.json'), JSON.stringify(result, null, 2) + '\n');
    const m = result.machine as Record<string, unknown>;
    const md = [
      `Image (\`bash install/image.sh\`, ${m.cores} cores ${m.cpu}, ${new Date().toISOString().slice(0, 10)}):`,
      '',
      '| | MiB |',
      '|---|---|',
      `| OCI archive (gzip layers, what \`ctr images import\` reads) | ${result.archiveMB} |`,
      `| Debian base layer, compressed | ${result.base.layerCompressedMB} |`,
      `| Tether layer (tetherd, tether, eBPF objects), compressed | ${layers[1]?.compressedMB} |`,
      `| Root filesystem unpacked | ${result.unpackedMB} |`,
      `| of which /opt/tether | ${result.tetherFilesMB} |`,
      `| Debian base alone, unpacked (tar) | ${result.base.tarMB} |`,
      '',
      `Build: ${buildSeconds} s (${cold ? 'first build: empty cache, debootstrap from the mirror' : baseCached ? 'base from the cache' : 'base built in this run'}).`,
    ].join('\n');
    updateReadme(path.join(repo, 'README.md'), 'image', md);
    process.stdout.write(md + '\n');
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

main();
