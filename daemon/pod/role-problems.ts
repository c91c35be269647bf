// Pods whose role (egress gateway or client, LB pod, LB target) could not be set up. Roles are decided
// after ADD (labels come from the API, Egresses and Services change), so their failures cannot always fail
// the ADD; they must never be a silent success either: tetherd reports them (status, /readyz) until the
// controller that owns the role retries it successfully or the pod goes.

export interface RoleProblem {
  pod: string;
  role: string;
  error: string;
  since: string;
}

export class RoleProblems {
  private readonly byKey = new Map<string, RoleProblem>();

  /** Records (or keeps, with its first time) that pod's role failed; returns true when it is new. */
  failed(pod: string, role: string, error: string): boolean {
    const k = `${pod}\u0000${role}`;
    const prev = this.byKey.get(k);
    this.byKey.set(k, { pod, role, error, since: prev?.since ?? new Date().toISOString() });
    return !prev;
  }

  /** The role is set up (or no longer wanted). */
  ok(pod: string, role: string): void {
    this.byKey.delete(`${pod}\u0000${role}`);
  }

  /** The pod is gone: none of its roles can fail any more. */
  forget(pod: string): void {
    for (const [k, p] of this.byKey) if (p.pod === pod) this.byKey.delete(k);
  }

  list(): RoleProblem[] {
    return [...this.byKey.values()].sort((a, b) => (a.pod === b.pod ? a.role.localeCompare(b.role) : a.pod.localeCompare(b.pod)));
  }
}
