// What the recording fakes saw: counts of datapath/kernel calls by name ("lb.installMappings"), shared by
// every fake in one process. The simulation reads them (and the unit test asserts one was made).
const calls: Map<string, number> = ((globalThis as Record<string, unknown>).__tetherSimCalls ??= new Map<string, number>()) as Map<string, number>;

export function record(name: string, n = 1): void {
  calls.set(name, (calls.get(name) ?? 0) + n);
}

export function recorded(): Record<string, number> {
  return Object.fromEntries(calls);
}

/** An object whose every method records `prefix.method` and returns what `answers` gives (else undefined). */
export function recorder<T extends object>(prefix: string, answers: Record<string, (...a: unknown[]) => unknown> = {}): T {
  return new Proxy({} as T, {
    get(_t, k) {
      if (typeof k !== 'string' || k === 'then') return undefined;
      return (...a: unknown[]) => {
        record(`${prefix}.${k}`);
        return answers[k]?.(...a);
      };
    },
  });
}
