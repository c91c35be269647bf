// The release's identity: package.json's version is the image tag the manifests name, and release/previous names
// a commit of this repository's history whose package.json carries the version it states, older than this one.
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { previousReleaseRef } from '../lib/releases';

const root = path.resolve(__dirname, '../..');
const version = (JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')) as { version: string }).version;
const semver = (v: string) => v.split('.').map(Number);
const newer = (a: string, b: string) => {
  const [x, y] = [semver(a), semver(b)];
  for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i] > y[i];
  return false;
};

test('every kustomization that names the image tags it with package.json\'s version', () => {
  for (const k of ['install/base/kustomization.yaml', 'install/uninstall/kustomization.yaml']) {
    const tag = /newTag:\s*(\S+)/.exec(fs.readFileSync(path.join(root, k), 'utf8'))?.[1];
    assert.is(tag, version, k);
  }
});

test('release/previous: a commit of this history, at the version it states, older than this tree', () => {
  const { commit, version: prev } = previousReleaseRef();
  const pkg = JSON.parse(execFileSync('git', ['show', `${commit}:package.json`], { cwd: root, encoding: 'utf8' })) as { version: string };
  assert.is(pkg.version, prev, `package.json at ${commit}`);
  assert.ok(newer(version, prev), `this tree's version ${version} is newer than the previous release's ${prev}`);
  // An ancestor of this tree: what CI builds is the history main went through, not a branch beside it.
  execFileSync('git', ['merge-base', '--is-ancestor', commit, 'HEAD'], { cwd: root });
});

test.run();
