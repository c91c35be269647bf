// The releases a test can run: this tree's build (dist/) and the previous release (release/previous), built
// from the repository's own history by install/build-release.sh. A node of the testbed runs one of them: its
// tetherd (the executable, or the image in its container), its CNI executables and its DaemonSet manifest.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

const root = path.resolve(__dirname, '../..');

export interface Release {
  /** How logs name it: '<version> (this tree)', or the previous release's version. */
  name: string;
  version: string;
  /** tetherd, tetherctl, tether, tether-ipam. */
  binDir: string;
  /** The image install/image.sh built (the DaemonSet's container). */
  imageArchive: string;
  /** The tree whose install/ holds the release's manifests. */
  tree: string;
}

export function currentRelease(): Release {
  const version = (JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')) as { version: string }).version;
  return {
    name: `${version} (this tree)`,
    version,
    binDir: process.env.TETHER_BIN_DIR ?? path.join(root, 'dist/bin'),
    imageArchive: process.env.TETHER_IMAGE_ARCHIVE ?? path.join(root, 'dist/image/tether.oci.tar'),
    tree: root,
  };
}

/** release/previous: "<commit> <version>" on its one line that is not a comment. */
export function previousReleaseRef(): { commit: string; version: string } {
  const line = fs.readFileSync(path.join(root, 'release/previous'), 'utf8').split('\n').find((l) => l.trim() && !l.startsWith('#'));
  const [commit, version] = (line ?? '').trim().split(/\s+/);
  if (!/^[0-9a-f]{40}$/.test(commit ?? '') || !/^\d+\.\d+\.\d+$/.test(version ?? '')) throw new Error(`release/previous: want "<40-hex commit> <version>", have ${JSON.stringify(line)}`);
  return { commit, version };
}

/** The previous release, built (or taken from the cache) by install/build-release.sh. */
export function previousRelease(): Release {
  const { commit, version } = previousReleaseRef();
  const r = spawnSync('bash', [path.join(root, 'install/build-release.sh'), commit], { cwd: root, encoding: 'utf8', timeout: 30 * 60_000, maxBuffer: 1 << 26 });
  if (r.status !== 0) throw new Error(`install/build-release.sh ${commit} failed (${r.status ?? r.signal}):\n${(r.stderr ?? '').split('\n').slice(-30).join('\n')}`);
  const dir = r.stdout.trim().split('\n').pop()!;
  const rel: Release = { name: version, version, binDir: path.join(dir, 'dist/bin'), imageArchive: path.join(dir, 'dist/image/tether.oci.tar'), tree: dir };
  for (const f of [path.join(rel.binDir, 'tetherd'), path.join(rel.binDir, 'tether'), rel.imageArchive]) if (!fs.existsSync(f)) throw new Error(`the previous release's build has no ${f}`);
  return rel;
}

/**
 * The previous release's source (its daemon/, ipam/, cni/ and package.json, by `git archive` of
 * release/previous), for tests that run its modules beside this release's in one process (a sync sender of
 * N−1 against a receiver of N). Under <repo>/.previous-release/<commit>, so its imports of packages resolve
 * to this checkout's node_modules. Extracted once per commit.
 */
export function previousSource(): string {
  const { commit } = previousReleaseRef();
  const dir = path.join(root, '.previous-release', commit);
  const done = path.join(dir, '.done');
  if (fs.existsSync(done)) return dir;
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const tar = spawnSync('sh', ['-c', 'git archive --format=tar "$1" daemon ipam cni package.json | tar -x -C "$2"', 'sh', commit, dir], { cwd: root, encoding: 'utf8' });
  if (tar.status !== 0) throw new Error(`git archive ${commit} (release/previous): ${tar.stderr.trim()} (a shallow clone? the history must hold it)`);
  fs.writeFileSync(done, `${commit}\n`);
  return dir;
}

/** A module of the previous release by its repository path (e.g. 'daemon/conntrack-sync/sender'), typed as this release's. */
export function previousModule<T>(rel: string): T {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  return require(path.join(previousSource(), rel)) as T;
}

