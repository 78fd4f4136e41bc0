//! How a device's service runs: [`ServiceConfig`] and its parts.

use super::headroom::Headroom;
use super::settle::Settle;
use crate::clock::{SharedClock, WallClock};
use crate::memory::{MemoryConfig, StreamId};
use crate::storage::{DeviceStorage, StorageError};
use crate::sync::Arc;
use crate::trace::TraceRecorder;
use std::time::Duration;

/// Makes the storage of each new stream.
pub type StorageFactory =
    Box<dyn Fn(StreamId) -> Result<Box<dyn DeviceStorage>, StorageError> + Send + Sync>;

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Each stream's manager.
    pub memory: MemoryConfig,
    /// A stream with no request for this long runs an idle cleanup
    /// (`None`: never). The supervisor tells it, on its tick.
    pub idle_tick: Option<Duration>,
    /// How a client's calls reach its stream's actor: the latency knobs.
    pub calls: Calls,
    /// How long a shutdown waits for pinned allocations to be unpinned.
    pub pin_wait: Duration,
    /// Bytes all streams together may hold (`None`: what the storages give).
    /// For a fraction of a GPU, see [`DeviceBudget::fraction_of`](crate::storage::DeviceBudget::fraction_of).
    pub budget: Option<u64>,
    /// The supervisor asks a stream to compact when its reserved bytes pass
    /// this many times its bytes in use (and at least 4 MiB would come back);
    /// `None`: it never asks. The default is the manager's own threshold
    /// (threshold, 1.5), so one number says when compaction pays, on a stream or device.
    pub compaction_threshold: Option<f64>,
    /// How often the supervisor runs its timers (settle, compaction, idle
    /// cleanups) on the wall clock; on a manual clock they run at
    /// [`Supervisor::tick`](super::Supervisor::tick).
    pub supervise_tick: Duration,
    /// A recovery round for a short stream ends when every stream asked
    /// has answered; after this long without all the answers it ends
    /// anyway (a safety net: a manual clock does not move while a replay
    /// waits, so there it never fires).
    pub recovery_timeout: Duration,
    /// The clock every time-driven policy reads: the wall clock in a
    /// server, a [`ManualClock`](crate::clock::ManualClock) in a replay or
    /// a test (see [`clock`](crate::clock)).
    pub clock: SharedClock,
    /// Whether a short stream may get memory from the others' cached pages
    /// (`false` shows what the device needs without that).
    pub cross_stream_cleanup: bool,
    /// How far the device's reserved bytes may run ahead of its live bytes
    /// before a stream that would take a new page first gets cached pages
    /// back (its own, then the others'); `None`: every stream keeps its
    /// cache until its periodic cleanup. See [`Headroom`].
    /// The default (1 %) suits the default memory; for another layout,
    /// `Some(Headroom::for_memory(&memory))`.
    pub headroom: Option<Headroom>,
    /// When a stream holds more than it needed lately (the load fell), the
    /// supervisor tells it to give the excess back; `None`: pages stay
    /// cached until each pool's periodic cleanup. See [`Settle`].
    pub settle: Option<Settle>,
    /// Record every stream's reservations, frees and failures here.
    pub recorder: Option<Arc<TraceRecorder>>,
    /// The most streams (each one actor thread) the device runs at once;
    /// [`Supervisor::stream`](super::Supervisor::stream) refuses more with
    /// [`ServiceError::TooManyStreams`](super::ServiceError::TooManyStreams), so an id from untrusted input (a
    /// trace, a request) cannot spawn threads without bound.
    pub max_streams: usize,
    /// Streams cut the physical handles of their maps at up to one in this
    /// many of the granules a range holds once mapped (`None`: 64). A
    /// larger share (a smaller number) maps and gives back in fewer driver
    /// calls, and holds more bytes: the free granules of a handle partly
    /// in use cannot go back, and after a load falls the top handle of
    /// what stays live keeps its free part (`docs/memory.md`, "Physical
    /// handles": at 16, the H200 snapshots' driver time beyond the peak
    /// once falls to a third or less at peaks within 1.02 of live;
    /// synthetic loads whose allocations outlive their neighbours held up
    /// to 1.11 of live at the peak and 1.09 after their fall). Streams
    /// that share a device take
    /// [`shared_handle_share`](Self::shared_handle_share) where it is set.
    pub handle_share: Option<u64>,
    /// Streams that share their device cut the physical handles of their
    /// later maps at up to one in this many of the most granules a range
    /// held (of what it holds, under a budget), instead of
    /// [`handle_share`](Self::handle_share)'s (64 by default). A larger
    /// share moves memory between streams in fewer driver calls, and holds
    /// more at the peak: the free granules of a handle partly in use
    /// cannot go back (`docs/memory.md`,
    /// "Physical handles": at 32, `serving_contig` 1.4-12.5 → 0.8-8.8 us
    /// per event of modeled driver time beyond the peak once, at
    /// 1.014-1.028 → 1.019-1.041 of live).
    pub shared_handle_share: Option<u64>,
    /// A stream about to grow the device past its headroom first asks the
    /// roomiest other streams to serve the request from the room they
    /// hold, before any gives memory back for it to map (`docs/service.md`,
    /// "Serving another stream"). The allocations it gets are the lender's:
    /// they count in the lender's bytes in use and go back to it when
    /// dropped; every operation of a [`StreamHandle`](super::StreamHandle)
    /// of the device takes them. Each loan is served on the thread that
    /// served the request, in the lender's turn and then the asker's (no
    /// thread hand-off). Off by default: it saves driver calls
    /// (`serving_contig` 2-3x less modeled driver time) and host time, but
    /// loans keep the lenders' room in use, and on held-out multi-stream
    /// traces some peaks rise by up to 0.03 of the live bytes
    /// (`docs/performance.md`, "Lending, as an option").
    pub lend_across_streams: bool,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            memory: MemoryConfig::default(),
            idle_tick: Some(Duration::from_millis(100)),
            calls: Calls::default(),
            pin_wait: Duration::from_millis(200),
            budget: None,
            compaction_threshold: Some(crate::memory::DEFAULT_COMPACTION_THRESHOLD),
            supervise_tick: Duration::from_millis(50),
            recovery_timeout: Duration::from_secs(1),
            clock: WallClock::shared(),
            cross_stream_cleanup: true,
            headroom: Some(Headroom::default()),
            settle: Some(Settle::default()),
            recorder: None,
            max_streams: 256,
            handle_share: None,
            shared_handle_share: None,
            lend_across_streams: false,
        }
    }
}

/// How a client's calls reach its stream's actor. Each trades a little
/// memory or CPU for latency; the defaults suit a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calls {
    /// Requests a stream's inbox holds before senders wait.
    pub inbox_capacity: usize,
    /// The most receive attempts a waiting thread (an actor for its next
    /// request, a caller for its answer) spins before it parks; each
    /// learns how many of them pay from its recent waits (`sync/reply.rs`,
    /// `docs/service.md`, "Waiting"). 0: park at once.
    pub spin: u32,
    /// Client handles keep hot caches: a reserve of a size the client
    /// asked for lately is served on its own thread, with no round trip
    /// (`service/hot.rs`). Off by default: the spares change where later
    /// allocations land, and on the placement corpus that cost up to 1.9 %
    /// more peak memory on some families (`git show d502a2e:docs/performance.md`); turn it
    /// on for decode loops that repeat their sizes. Ignored while a trace
    /// is recorded (spares are reserved ahead of their hits). A hit that
    /// leaves a size running low asks the actor for more without waiting,
    /// except on a manual clock (a replay: there a cache refills only in
    /// a miss's round trip, so that what it holds at each reserve does not
    /// depend on when the actor ran) and when clients serve in place (a
    /// miss is then served in place, and a refill queued for the actor's
    /// thread would send the next miss through it).
    pub hot_cache: bool,
    /// A client whose stream's actor is free serves its own reservation or
    /// operation on its own thread, under the lock the actor's thread takes
    /// for each of its turns, instead of a round trip to that thread
    /// (`docs/service.md`, "Serving in place"). The cost of a lock rather
    /// than of two thread handoffs, which a busy machine makes 5-10 us.
    /// Async calls, shutdowns and barriers always go through the inbox.
    /// `false`: every request goes to the actor's thread.
    pub serve_in_place: bool,
}

impl Default for Calls {
    fn default() -> Self {
        Self {
            inbox_capacity: 1024,
            spin: 2000,
            hot_cache: false,
            serve_in_place: true,
        }
    }
}
