// Builds and runs test/golden-libcni/main.go, which loads a CNI configuration directory with libcni itself
// (Debian's golang-github-appc-cni-dev, GOPATH mode, offline) the way containerd or CRI-O does.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

export interface LibcniAnswer {
  ok: boolean;
  file?: string;
  name: string;
  cniVersion: string;
  plugins: string[];
  error?: string;
  skipped: Array<{ file: string; error: string }>;
}

const GO_CANDIDATES = ['/usr/lib/go-1.19/bin/go', '/usr/lib/go/bin/go', '/usr/bin/go'];
const GOPATH_SRC = '/usr/share/gocode';
const LIBCNI = path.join(GOPATH_SRC, 'src/github.com/containernetworking/cni/libcni');

/** The go executable, or undefined when Go is not installed (the only reason to skip). */
export function findGo(): string | undefined {
  return GO_CANDIDATES.find((g) => fs.existsSync(g));
}

/** Builds the loader into a fresh temporary directory; throws with Go's output when it does not build. */
export function buildLoader(goBin: string): { bin: string; dir: string } {
  if (!fs.existsSync(LIBCNI)) throw new Error(`${LIBCNI} is missing: install golang-github-appc-cni-dev (install/deps.sh does)`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-libcni-load-'));
  const bin = path.join(dir, 'libcni-load');
  const r = spawnSync(goBin, ['build', '-o', bin, path.join(__dirname, 'main.go')], {
    encoding: 'utf8',
    timeout: 300_000,
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: dir,
      GO111MODULE: 'off', // GOPATH mode: libcni comes from Debian's source tree, nothing is downloaded
      GOPATH: `${GOPATH_SRC}:${path.join(dir, 'gopath')}`,
      GOCACHE: path.join(dir, 'cache'),
      GOFLAGS: '',
      GOPROXY: 'off',
    },
  });
  if (r.status !== 0) throw new Error(`go build of test/golden-libcni/main.go failed (${r.status ?? r.signal}): ${r.stderr}${r.error?.message ?? ''}`);
  return { bin, dir };
}

/** What libcni loads from `netDir` under `runtime`'s rules. */
export function libcniLoad(bin: string, runtime: 'containerd' | 'crio', netDir: string): LibcniAnswer {
  const r = spawnSync(bin, [runtime, netDir], { encoding: 'utf8', timeout: 30_000 });
  if (r.status !== 0) throw new Error(`libcni-load ${runtime} ${netDir} exited ${r.status ?? r.signal}: ${r.stderr}`);
  return JSON.parse(r.stdout) as LibcniAnswer;
}
