// A CRI v1 RuntimeService client for the tests, speaking to a runtime's Unix socket as kubelet does:
// @grpc/proto-loader reads our subset of the CRI api.proto (api.proto beside this file), every call is
// promise-wrapped and carries a deadline, so a runtime that hangs fails the test instead of stalling it.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import * as path from 'node:path';

export type NamespaceMode = 'POD' | 'CONTAINER' | 'NODE' | 'TARGET';
export type SandboxState = 'SANDBOX_READY' | 'SANDBOX_NOTREADY';

export interface PodSandboxMetadata {
  name: string;
  uid: string;
  namespace: string;
  attempt?: number;
}

/** The pod as kubelet describes it to the runtime (only the fields the tests set). */
export interface PodSandboxConfig {
  metadata: PodSandboxMetadata;
  hostname?: string;
  logDirectory?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  linux?: {
    cgroupParent?: string;
    securityContext?: { namespaceOptions?: { network?: NamespaceMode; pid?: NamespaceMode; ipc?: NamespaceMode }; privileged?: boolean };
    sysctls?: Record<string, string>;
  };
}

export interface PodSandboxStatus {
  id: string;
  metadata: PodSandboxMetadata;
  state: SandboxState;
  /** Nanoseconds since the epoch, as a decimal string (int64). */
  createdAt: string;
  network?: { ip: string; additionalIps: { ip: string }[] };
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

export interface PodSandboxStatusResponse {
  status: PodSandboxStatus;
  /** Only with verbose: containerd's "info" key holds JSON with the sandbox's pid and netns path. */
  info: Record<string, string>;
}

export interface PodSandbox {
  id: string;
  metadata: PodSandboxMetadata;
  state: SandboxState;
  createdAt: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

export interface VersionResponse {
  version: string;
  runtimeName: string;
  runtimeVersion: string;
  runtimeApiVersion: string;
}

/** A failed call: the gRPC status code and the runtime's message (containerd puts the CNI error there). */
export class CriError extends Error {
  constructor(
    readonly method: string,
    readonly code: grpc.status,
    readonly details: string,
  ) {
    super(`CRI ${method} failed: ${grpc.status[code] ?? code}: ${details}`);
    this.name = 'CriError';
  }
}

const PROTO = path.join(__dirname, 'api.proto');
let cachedService: grpc.ServiceClientConstructor | undefined;

function serviceCtor(): grpc.ServiceClientConstructor {
  if (cachedService) return cachedService;
  // enums as their names and int64 as strings: what the tests compare, without losing precision.
  const def = protoLoader.loadSync(PROTO, { keepCase: false, longs: String, enums: String, defaults: true, oneofs: true });
  const pkg = grpc.loadPackageDefinition(def) as unknown as { runtime: { v1: { RuntimeService: grpc.ServiceClientConstructor } } };
  cachedService = pkg.runtime.v1.RuntimeService;
  return cachedService;
}

export class CriClient {
  private readonly client: grpc.Client;

  /** `socket` is the runtime's Unix socket path; `timeoutMs` is the default deadline of each call. */
  constructor(
    readonly socket: string,
    readonly timeoutMs = 60_000,
  ) {
    const Ctor = serviceCtor();
    // kubelet's own limit is 16 MiB; our responses are small, so the default suffices.
    this.client = new Ctor(`unix://${socket}`, grpc.credentials.createInsecure());
  }

  private call<Req, Res>(method: string, req: Req, timeoutMs = this.timeoutMs): Promise<Res> {
    return new Promise((resolve, reject) => {
      const fn = (this.client as unknown as Record<string, (r: Req, o: grpc.CallOptions, cb: (e: grpc.ServiceError | null, r: Res) => void) => void>)[method];
      fn.call(this.client, req, { deadline: Date.now() + timeoutMs }, (err, res) => {
        if (err) reject(new CriError(method, err.code, err.details));
        else resolve(res);
      });
    });
  }

  version(timeoutMs?: number): Promise<VersionResponse> {
    return this.call('Version', { version: 'v1' }, timeoutMs);
  }

  /** Creates and starts the sandbox (the runtime runs the CNI ADD inside); resolves with its id. */
  async runPodSandbox(config: PodSandboxConfig, timeoutMs?: number): Promise<string> {
    const res = await this.call<unknown, { podSandboxId: string }>('RunPodSandbox', { config, runtimeHandler: '' }, timeoutMs);
    return res.podSandboxId;
  }

  /** Stops the sandbox (CNI DEL, then the pause process); idempotent on the runtime's side. */
  async stopPodSandbox(id: string, timeoutMs?: number): Promise<void> {
    await this.call('StopPodSandbox', { podSandboxId: id }, timeoutMs);
  }

  async removePodSandbox(id: string, timeoutMs?: number): Promise<void> {
    await this.call('RemovePodSandbox', { podSandboxId: id }, timeoutMs);
  }

  podSandboxStatus(id: string, verbose = false, timeoutMs?: number): Promise<PodSandboxStatusResponse> {
    return this.call('PodSandboxStatus', { podSandboxId: id, verbose }, timeoutMs);
  }

  async listPodSandbox(filter: { id?: string; state?: SandboxState; labelSelector?: Record<string, string> } = {}, timeoutMs?: number): Promise<PodSandbox[]> {
    const f = { id: filter.id ?? '', state: filter.state ? { state: filter.state } : undefined, labelSelector: filter.labelSelector ?? {} };
    const res = await this.call<unknown, { items: PodSandbox[] }>('ListPodSandbox', { filter: f }, timeoutMs);
    return res.items;
  }

  close(): void {
    this.client.close();
  }
}

/** The netns path containerd reports for a sandbox in its verbose status (runtimeSpec.linux.namespaces). */
export function sandboxNetns(res: PodSandboxStatusResponse): string | undefined {
  const raw = res.info?.info;
  if (!raw) return undefined;
  const info = JSON.parse(raw) as { runtimeSpec?: { linux?: { namespaces?: { type: string; path?: string }[] } } };
  return info.runtimeSpec?.linux?.namespaces?.find((n) => n.type === 'network')?.path;
}
