// The image as a node gets it: dist/image/tether.oci.tar (bash install/image.sh, run by test/run.sh after
// install/build.sh) unpacked with umoci, then read as a runtime would — the config's entrypoint, the files
// the Dockerfile promises, the Debian packages tetherd calls at run time, and the executables run from the
// image's root (chroot, with a /proc of their own), answering like the ones install/build.sh made.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawnSync } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

const repo = path.resolve(__dirname, '../..');
const ARCHIVE = path.join(repo, 'dist/image/tether.oci.tar');
const VERSION = (JSON.parse(fs.readFileSync(path.join(repo, 'package.json'), 'utf8')) as { version: string }).version;
const TAG = `ghcr.io/tether-cni/tether:${VERSION}`;
const NAMES = ['tetherd', 'tether-operator', 'tetherctl', 'tether-install', 'tether', 'tether-ipam'];
// The environment the image gives a process, not this shell's (whose NODE_EXTRA_CA_CERTS and the like
// point at files the image does not hold).
const IMAGE_ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', LC_ALL: 'C' };
const EM_BPF = 247;

type Json = Record<string, any>;
interface Unpacked {
  dir: string;
  layout: string;
  rootfs: string;
  manifest: Json;
  config: Json;
}

let unpacked: Unpacked | undefined;
let tmp: string | undefined;

function blob(layout: string, digest: string): Json {
  return JSON.parse(fs.readFileSync(path.join(layout, 'blobs', ...digest.split(':')), 'utf8'));
}

/** Unpacks the archive once for all tests; the temp dir goes in test.after (or at exit, if the run dies). */
function image(): Unpacked {
  if (unpacked) return unpacked;
  if (!fs.existsSync(ARCHIVE)) throw new Error(`${ARCHIVE} is missing: build it with \`bash install/image.sh\``);
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-image-'));
  const layout = path.join(tmp, 'layout');
  const bundle = path.join(tmp, 'bundle');
  fs.mkdirSync(layout);
  // umoci reads an OCI layout directory; the archive is that directory as a tar.
  execFileSync('tar', ['-C', layout, '-xf', ARCHIVE]);
  const r = spawnSync('umoci', ['unpack', '--image', `${layout}:${TAG}`, bundle], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`umoci unpack ${TAG} failed (${r.error?.message ?? `exit ${r.status}`}): ${r.stderr}`);
  const index = JSON.parse(fs.readFileSync(path.join(layout, 'index.json'), 'utf8')) as Json;
  const entry = (index.manifests as Json[]).find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === TAG);
  if (!entry) throw new Error(`index.json names no manifest ${TAG}`);
  const manifest = blob(layout, entry.digest);
  unpacked = { dir: tmp, layout, rootfs: path.join(bundle, 'rootfs'), manifest, config: blob(layout, manifest.config.digest) };
  return unpacked;
}

function cleanup(): void {
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  tmp = undefined;
}
process.on('exit', cleanup);
test.after(cleanup);

/**
 * Runs a program from the image's root. unshare gives it a PID and mount namespace with its own /proc
 * (Bun's executables read /proc/self/exe to find their code), which disappears with the process: nothing
 * stays mounted under the temp dir.
 */
function inImage(argv: string[], opts: { input?: string; env?: Record<string, string> } = {}): { code: number | null; stdout: string; stderr: string } {
  const { rootfs } = image();
  const r = spawnSync('unshare', ['--mount', '--pid', '--fork', `--mount-proc=${path.join(rootfs, 'proc')}`, 'chroot', rootfs, ...argv], {
    encoding: 'utf8',
    env: { ...IMAGE_ENV, ...opts.env },
    input: opts.input,
    timeout: 30_000,
  });
  return { code: r.status, stdout: r.stdout ?? '', stderr: r.stderr ?? r.error?.message ?? '' };
}

const sha256 = (file: string) => crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');
const isExecutableFile = (p: string) => {
  const st = fs.statSync(p); // follows links, as exec does
  return st.isFile() && (st.mode & 0o111) === 0o111;
};

test('the archive is an OCI layout naming the image by its release tag, with gzip layers', () => {
  const { layout, manifest } = image();
  assert.equal(JSON.parse(fs.readFileSync(path.join(layout, 'oci-layout'), 'utf8')).imageLayoutVersion, '1.0.0');
  assert.equal(manifest.mediaType, 'application/vnd.oci.image.manifest.v1+json');
  // Two layers: the Debian base (shared by every release built on it) and Tether's files.
  assert.equal(manifest.layers.length, 2, `layers: ${JSON.stringify(manifest.layers)}`);
  for (const l of manifest.layers) assert.equal(l.mediaType, 'application/vnd.oci.image.layer.v1.tar+gzip');
  // Tether's layer holds its files and their directories, nothing a build step left behind (the RUN
  // step's /etc/hosts and /etc/resolv.conf mount points, for one).
  const entries = execFileSync('tar', ['-tzf', path.join(layout, 'blobs', ...manifest.layers[1].digest.split(':'))], { encoding: 'utf8', maxBuffer: 1 << 24 })
    .split('\n')
    .filter(Boolean);
  const stray = entries.filter((e) => !/^(opt\/tether\/.*|usr\/local\/bin\/.+|opt\/|usr\/|usr\/local\/|usr\/local\/bin\/|run\/)$/.test(e));
  assert.equal(stray, [], `unexpected entries in Tether's layer: ${stray.join(', ')}`);
  for (const n of NAMES) assert.ok(entries.includes(`usr/local/bin/${n}`), `usr/local/bin/${n} not in Tether's layer`);
});

test('the config starts tetherd as root with the image PATH, at fixed timestamps', () => {
  const { config } = image();
  assert.equal(config.os, 'linux');
  assert.equal(config.architecture, 'amd64');
  assert.equal(config.config.Entrypoint, ['/usr/local/bin/tetherd']);
  assert.equal(config.config.User, '0');
  assert.ok((config.config.Env as string[]).includes(`PATH=${IMAGE_ENV.PATH}`), `Env: ${config.config.Env}`);
  assert.equal(config.config.Labels['org.opencontainers.image.version'], VERSION);
  // SOURCE_DATE_EPOCH (0 unless set): a build's wall clock would make every build a different image.
  const epoch = new Date(Number(process.env.SOURCE_DATE_EPOCH ?? 0) * 1000).toISOString().replace('.000Z', 'Z');
  assert.equal(config.created, epoch);
  for (const h of config.history as Json[]) assert.equal(h.created, epoch, `history ${h.created_by}`);
});

test('the executables are the ones install/build.sh made, with the links beside them and in /usr/local/bin', () => {
  const { rootfs } = image();
  const bin = path.join(rootfs, 'opt/tether/bin');
  for (const exe of ['tetherd', 'tether']) {
    assert.ok(isExecutableFile(path.join(bin, exe)), `/opt/tether/bin/${exe} is not an executable file`);
    assert.equal(sha256(path.join(bin, exe)), sha256(path.join(repo, 'dist/bin', exe)), `/opt/tether/bin/${exe} differs from dist/bin/${exe}`);
  }
  // tetherctl and tether-install are tetherd answering to another name; tether-ipam is tether.
  assert.equal(fs.readlinkSync(path.join(bin, 'tetherctl')), 'tetherd');
  assert.equal(fs.readlinkSync(path.join(bin, 'tether-operator')), 'tetherd');
  assert.equal(fs.readlinkSync(path.join(bin, 'tether-install')), 'tetherd');
  assert.equal(fs.readlinkSync(path.join(bin, 'tether-ipam')), 'tether');
  for (const n of NAMES) {
    const link = path.join(rootfs, 'usr/local/bin', n);
    assert.equal(fs.readlinkSync(link), `/opt/tether/bin/${n}`);
    // Absolute links resolve inside the image: check through the rootfs, not the host.
    assert.ok(isExecutableFile(path.join(rootfs, 'opt/tether/bin', n)), `/usr/local/bin/${n} does not lead to an executable`);
  }
});

test('the eBPF objects are in /opt/tether/bpf, the same set as dist/bpf, each an eBPF ELF', () => {
  const { rootfs } = image();
  const bpf = path.join(rootfs, 'opt/tether/bpf');
  const want = fs.readdirSync(path.join(repo, 'dist/bpf')).filter((f) => f.endsWith('.o')).sort();
  assert.ok(want.length > 0, 'dist/bpf holds no objects');
  assert.equal(fs.readdirSync(bpf).sort(), want);
  for (const f of want) {
    const b = fs.readFileSync(path.join(bpf, f));
    assert.equal(b.subarray(0, 4).toString('latin1'), '\x7fELF', `${f} is not ELF`);
    assert.equal(b.readUInt16LE(18), EM_BPF, `${f}: e_machine is not EM_BPF`);
    assert.equal(sha256(path.join(bpf, f)), sha256(path.join(repo, 'dist/bpf', f)), `${f} differs from dist/bpf`);
  }
});

test('what tetherd calls at run time is in the image: libbpf.so.1 in the loader cache, nft, nsenter', () => {
  const { rootfs } = image();
  // koffi dlopen()s "libbpf.so.1": the dynamic loader finds it through ld.so.cache.
  const cache = inImage(['/sbin/ldconfig', '-p']);
  assert.equal(cache.code, 0, cache.stderr);
  assert.match(cache.stdout, /libbpf\.so\.1 \(/);
  assert.ok(fs.existsSync(path.join(rootfs, 'usr/sbin/nft')), '/usr/sbin/nft missing');
  assert.ok(fs.existsSync(path.join(rootfs, 'usr/bin/nsenter')), '/usr/bin/nsenter missing');
  const nft = inImage(['nft', '--version']);
  assert.equal(nft.code, 0, nft.stderr);
  assert.match(nft.stdout, /^nftables v1\./);
  const nsenter = inImage(['nsenter', '--version']);
  assert.equal(nsenter.code, 0, nsenter.stderr);
  assert.match(nsenter.stdout, /util-linux/);
  const pkgs = fs.readFileSync(path.join(rootfs, 'usr/share/tether/base-packages.txt'), 'utf8');
  for (const p of ['libbpf1', 'nftables', 'util-linux', 'iproute2']) assert.match(pkgs, new RegExp(`^${p} `, 'm'), `${p} not in the base`);
});

test('tetherd, tether-operator, tetherctl and tether run from the image and answer as dist/bin does', () => {
  for (const n of ['tetherd', 'tether-operator', 'tetherctl']) {
    const want = execFileSync(path.join(repo, 'dist/bin', n), ['--version'], { encoding: 'utf8', env: IMAGE_ENV }).trim();
    const got = inImage([`/usr/local/bin/${n}`, '--version']);
    assert.equal(got.code, 0, `${n} --version in the image: ${got.stderr}`);
    assert.equal(got.stdout.trim(), want);
    assert.ok(got.stdout.includes(`v${VERSION}`), got.stdout);
  }
  // The CNI executable is copied to the host by tether-install, but must run at all (Bun, glibc 2.36).
  const cni = inImage(['/usr/local/bin/tether'], { input: '{}', env: { CNI_COMMAND: 'VERSION' } });
  assert.equal(cni.code, 0, `tether VERSION in the image: ${cni.stderr}`);
  assert.ok((JSON.parse(cni.stdout) as Json).supportedVersions.includes('1.0.0'), cni.stdout);
});

test('the base is stripped: no apt lists, man pages, locales or docs beyond copyright files', () => {
  const { rootfs } = image();
  assert.equal(fs.readdirSync(path.join(rootfs, 'var/lib/apt/lists')).filter((f) => f !== 'partial' && f !== 'lock'), []);
  assert.not.ok(fs.existsSync(path.join(rootfs, 'usr/share/man')), '/usr/share/man present');
  assert.equal(fs.readdirSync(path.join(rootfs, 'usr/share/locale')).filter((f) => f !== 'locale.alias'), []);
  const docs = execFileSync('find', [path.join(rootfs, 'usr/share/doc'), '-type', 'f', '!', '-name', 'copyright'], { encoding: 'utf8' }).trim();
  assert.equal(docs, '', `docs left: ${docs.slice(0, 300)}`);
  assert.equal(execFileSync('find', [path.join(rootfs, 'var/log'), '-type', 'f'], { encoding: 'utf8' }).trim(), '');
  // The runtime provides these; the build machine's must not leak in.
  assert.not.ok(fs.existsSync(path.join(rootfs, 'etc/resolv.conf')), '/etc/resolv.conf leaked from the build machine');
  assert.equal(fs.readFileSync(path.join(rootfs, 'etc/hostname'), 'utf8'), '');
});

test.run();
