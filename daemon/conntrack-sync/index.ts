// Conntrack sync between tetherds: the owner of a floating address streams its gateway's conntrack
// state to the other candidates so a standby that takes over already has every established flow.
//
// Topology: one SyncSender per (stream, candidate) on the owner, dialling one SyncReceiver server per
// candidate node. A sender per peer keeps each peer's queue, in-flight bound and resync independent, so
// a slow or dead candidate never holds back the others; the owner fans its events out with push() to
// each. The receiver is one listening socket per node serving every stream and owner.
// Protocol, framing and security: see frame.ts (wire layout) and handshake.ts (HELLO exchange).
//
// Incremental at any table size: a full transfer of a stream's table only when its connection starts,
// when the receiver asks (RESYNC_REQUEST: a new standby on that node) or when the sender's queue
// overflowed. Otherwise only events flow, plus a periodic consistency check whose cost does not grow with
// the table when nothing changed: the sender sends K bucket digests (digest.ts: the table split by a hash
// of the original tuple, per bucket the count and XOR of 64-bit hashes of what matters), the receiver
// compares them with its own table's and asks for the buckets that differ, and only those are sent again.
// Every transfer is applied while it streams and swept (what its buckets hold and it did not carry is
// deleted) only at its end, so a transfer cut off halfway deletes nothing (receiver.ts).
export { SyncSender, type Snapshot, type SyncSenderOptions, type SyncSenderStats, type SyncSenderState } from './sender';
export { SyncReceiver, type SyncReceiverOptions, type SyncReceiverStats, type SyncPeerInfo, type SyncPeerStats, type SyncRefusal } from './receiver';
export { FrameType, PROTOCOL_VERSION, MIN_PROTOCOL_VERSION, MAX_PROTOCOL_VERSION, SUPPORTED_VERSIONS, DEFAULT_MAX_FRAME, type RejectReason, type VersionRange } from './frame';
export { MIN_KEY_LEN } from './handshake';
export { applySyncedEvents, applyWireList, replaceSyncedEntries, applyInSlices, upsertSyncedEntries, sweepSyncedEntries, syncedDigests, STANDBY_MIN_TIMEOUT, STANDBY_REDIGEST_MS, StandbyDigests, DigestCache, dumpScope, dumpScopeEncoded, scopeDigests } from './table-apply';
export { Digests, KeySet, keyHash, keyHashAt, bucketOf, entryHash, inBuckets, DEFAULT_BUCKETS, MAX_BUCKETS, type BucketSet } from './digest';
export { WireList, EncodedEntries, MAX_EVENT_BYTES } from './entry-codec';
export { EntryStore } from './entry-store';
export { encodeEventAt, encodeEventPayload, encodedReplyDst, replyDstIs, type EncodedEvent } from './event-transcode';
