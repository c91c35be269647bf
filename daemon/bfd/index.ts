// BFD liveness between tetherds (RFC 5880 asynchronous mode over RFC 5881 single-hop UDP): public surface.
export { BfdEndpoint, BFD_CONTROL_PORT, type BfdEndpointOptions, type BfdEndpointStats, type BfdDatagramEvent } from './endpoint';
export { BfdSession, REJECT_REASONS, type BfdSessionOptions, type BfdSessionStats, type BfdStateChange, type BfdRejectReason, type BfdVerdict } from './session';
export { BfdAuthType, type BfdAuthConfig } from './auth';
export { BfdState, BfdDiag, type BfdControl } from './packet';
export { realClock, type Clock } from './clock';
