// The pod sandbox image for the CRI tests, built here because no registry is reachable: pause.c compiled
// static, packed by buildah into an OCI archive cached by the source's hash (a second run only imports it).
import { spawnSync } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';

/** Where built archives are kept between runs (TETHER_CRI_CACHE overrides). */
export const CACHE_DIR = process.env.TETHER_CRI_CACHE ?? '/var/cache/tether-test/cri';
const SOURCE = path.join(__dirname, 'pause.c');
/** The repository part of the image's name; the tag is the source's hash. */
export const PAUSE_REPO = 'localhost/tether-test/pause';

export interface PauseImage {
  /** The OCI archive (`ctr images import` input). */
  archive: string;
  /** The name containerd gives it on import with --base-name PAUSE_REPO, for the CRI's sandbox_image. */
  ref: string;
  tag: string;
  /** True when this call built it (false: found in the cache). */
  built: boolean;
}

function sh(argv: string[], env?: NodeJS.ProcessEnv): string {
  const r = spawnSync(argv[0], argv.slice(1), { encoding: 'utf8', env: env ?? process.env, timeout: 120_000 });
  if (r.status !== 0) throw new Error(`${argv.join(' ')} failed (${r.status ?? r.signal}): ${r.stderr || r.error?.message}`);
  return r.stdout.trim();
}

/** Returns the cached archive for the current pause.c, building it first when missing. */
export function pauseImage(): PauseImage {
  const source = fs.readFileSync(SOURCE);
  // The build recipe is part of the key, so changing how the image is packed invalidates old archives.
  const tag = crypto.createHash('sha256').update(source).update('recipe-1').digest('hex').slice(0, 16);
  const archive = path.join(CACHE_DIR, `pause-${tag}.tar`);
  const image: PauseImage = { archive, ref: `${PAUSE_REPO}:${tag}`, tag, built: false };
  if (fs.existsSync(archive)) return image;
  fs.mkdirSync(CACHE_DIR, { recursive: true });
  const work = fs.mkdtempSync(path.join(CACHE_DIR, 'build-'));
  // buildah creates its CNI lock under the configured network directory even when nothing runs a
  // network; pointing containers.conf at our work dir keeps the host's /etc/cni/net.d untouched.
  const conf = path.join(work, 'containers.conf');
  fs.writeFileSync(conf, `[network]\nnetwork_config_dir = "${work}/net.d"\ncni_plugin_dirs = ["${work}/cni-bin"]\n`);
  fs.mkdirSync(path.join(work, 'net.d'));
  fs.mkdirSync(path.join(work, 'cni-bin')); // buildah refuses a configured plugin dir that does not exist
  const env = { ...process.env, CONTAINERS_CONF: conf };
  // Own storage (vfs: no mounts to leak) so a failed build never leaves anything in the host's store.
  // containers/image keeps a blob-info cache under /var/lib/containers whatever --root says: remove it
  // afterwards only when this build is what created that directory.
  const hadSharedDir = fs.existsSync('/var/lib/containers');
  const bh = ['buildah', '--root', path.join(work, 'storage'), '--runroot', path.join(work, 'run'), '--storage-driver', 'vfs'];
  try {
    const bin = path.join(work, 'pause');
    sh(['gcc', '-static', '-O2', '-Wall', '-Wextra', '-Werror', '-o', bin, SOURCE]);
    sh(['strip', bin]);
    const ctr = sh([...bh, 'from', '--network', 'none', '--isolation', 'chroot', 'scratch'], env);
    sh([...bh, 'copy', ctr, bin, '/pause'], env);
    sh([...bh, 'config', '--entrypoint', '["/pause"]', '--cmd', '', '--user', '65535:65535', ctr], env);
    sh([...bh, 'commit', '--rm', ctr, `pause:${tag}`], env);
    // Written beside the final path and renamed, so a concurrent test never imports a half-written archive.
    const partial = `${archive}.${process.pid}.partial`;
    sh([...bh, 'push', `pause:${tag}`, `oci-archive:${partial}:${tag}`], env);
    fs.renameSync(partial, archive);
  } finally {
    // vfs layers keep read-only dirs that rm -r handles; buildah's own cleanup first, in case of locks.
    spawnSync('buildah', [...bh.slice(1), 'rm', '--all'], { env, stdio: 'ignore' });
    spawnSync('buildah', [...bh.slice(1), 'rmi', '--all', '--force'], { env, stdio: 'ignore' });
    fs.rmSync(work, { recursive: true, force: true });
    if (!hadSharedDir) fs.rmSync('/var/lib/containers', { recursive: true, force: true });
  }
  image.built = true;
  return image;
}
