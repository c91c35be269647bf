// Fake of daemon/bpf/fou.ts: FoU encap/decap attachments that only record.
import type { FouStats } from '../../../../daemon/bpf/fou-structs';
import { record } from './record';

export type { FouStats } from '../../../../daemon/bpf/fou-structs';
export const FOU_TC = {
  encap: { handle: 1, priority: 0x100, object: 'fou-encap', program: 'fou_encap' },
  decap: { handle: 1, priority: 0x101, object: 'fou-decap', program: 'fou_decap' },
} as const;

const noStats = () => ({}) as FouStats;

export function bpfObjectDir(): string {
  return '/nonexistent/sim';
}

export class FouEncap {
  stats = noStats;
  detach(): void {
    record('fou.encapDetach');
  }
}

export class FouDecap {
  setAllowedSources(sources: string[]): void {
    record('fou.setAllowedSources');
    record('fou.allowedSourceEntries', sources.length);
  }
  stats = noStats;
  detach(): void {
    record('fou.decapDetach');
  }
}

export function attachFouEncap(): FouEncap {
  record('fou.attachEncap');
  return new FouEncap();
}

export function attachFouDecap(o: { allowedSources?: string[] }): FouDecap {
  record('fou.attachDecap');
  const d = new FouDecap();
  d.setAllowedSources(o.allowedSources ?? []);
  return d;
}

export function detachFou(): boolean {
  record('fou.detach');
  return true;
}
export function setFouDestination(): void {
  record('fou.setDestination');
}
export function removeFouDestination(): boolean {
  record('fou.removeDestination');
  return true;
}
export function readFouStats(): FouStats {
  return noStats();
}
