// Conntrack sync between tetherds: the owner of a floating address streams its gateway's conntrack
// state to the other candidates so a standby that takes over already has every established flow.
//
// Topology: one SyncSender per (stream, candidate) on the owner, dialling one SyncReceiver server per
// candidate node. A sender per peer keeps each peer's queue, in-flight bound and resync independent, so
// a slow or dead candidate never holds back the others; the owner fans its events out with push() to
// each. The receiver is one listening socket per node serving every stream and owner.
// Protocol, framing and security: see frame.ts (wire layout) and handshake.ts (HELLO exchange).
export { SyncSender, type SyncSenderOptions, type SyncSenderStats, type SyncSenderState } from './sender';
export { SyncReceiver, type SyncReceiverOptions, type SyncReceiverStats, type SyncPeerInfo, type SyncPeerStats } from './receiver';
export { FrameType, PROTOCOL_VERSION, DEFAULT_MAX_FRAME, type RejectReason } from './frame';
export { MIN_KEY_LEN } from './handshake';
export { applySyncedEvents, replaceSyncedEntries, applyInSlices } from './table-apply';
export { encodeEventPayload, type EncodedEvent } from './event-transcode';
