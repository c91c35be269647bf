// Status conditions as the Kubernetes API conventions define them (type, status, reason, message,
// lastTransitionTime kept while the status holds), shared by the status writers and the Events they raise.

export interface Condition {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  observedGeneration?: number;
  lastTransitionTime: string;
  reason: string;
  message: string;
}

/** `next` with each condition's lastTransitionTime kept from `prev` when its status did not change. */
export function mergeConditions(prev: Condition[] | undefined, next: Array<Omit<Condition, 'lastTransitionTime'>>, now = new Date()): Condition[] {
  return next.map((c) => {
    const old = prev?.find((p) => p.type === c.type);
    return { ...c, lastTransitionTime: old && old.status === c.status ? old.lastTransitionTime : now.toISOString() };
  });
}
