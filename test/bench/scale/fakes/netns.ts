// Fake of daemon/sys/netns.ts: "entering" a namespace runs the function here; sysctls are a Map; a pod's
// namespace exists while its stand-in file (in the simulated node's temp dir) does.
import * as fs from 'node:fs';
import { record } from './record';

const sysctls = new Map<string, string>();

export function inNetns<T>(_nsPath: string, fn: () => T): T {
  record('netns.enter');
  return fn();
}
export function isOwnNetns(): boolean {
  return false;
}
export function netnsExists(nsPath: string): boolean {
  return fs.existsSync(nsPath);
}
export function procSysNet(): string {
  return '/nonexistent/sim/proc/sys/net';
}
export function writeNetSysctl(nsPath: string | null, key: string, value: string): string {
  record('netns.writeSysctl');
  const k = `${nsPath ?? ''}:${key}`;
  const before = sysctls.get(k) ?? '0';
  sysctls.set(k, value);
  return before;
}
export function writeNetSysctls(
  nsPath: string | null,
  entries: ReadonlyArray<readonly [key: string, value: string]>,
  written: (key: string, value: string, previous: string) => void = () => undefined,
): string[] {
  return entries.map(([key, value]) => {
    const previous = writeNetSysctl(nsPath, key, value);
    written(key, value, previous);
    return previous;
  });
}
export function readNetSysctl(nsPath: string | null, key: string): string {
  return sysctls.get(`${nsPath ?? ''}:${key}`) ?? '0';
}
