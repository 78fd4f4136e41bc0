//! What travels between a stream's parts besides requests: where an
//! answer goes, the shapes of a reservation's sizes and answer, what a
//! shutdown reports, and the coordinator's control traffic to an actor.

use super::error::ServiceError;
use crate::memory::Allocation;
use crate::sync::channel;
use crate::sync::reply::ReplyTo;

/// Where an answer goes: a blocking caller's reply cell (it spins, then
/// parks until the answer unparks it; `sync/reply.rs`), a channel nobody
/// waits on yet, or an async caller's channel. Sending never blocks, and an
/// answer to a caller that went away is dropped, which releases whatever it
/// held; a reply dropped unanswered tells its caller no answer will come.
#[derive(Debug)]
pub(crate) enum Reply<T> {
    /// A blocking caller waits for this.
    Waiter(ReplyTo<T>),
    /// Read later, perhaps on another thread (a detached shutdown's, a
    /// model's submitted reservation).
    Channel(channel::Sender<T>),
    /// An async caller awaits this.
    #[cfg(not(streamalloc_loom))]
    Async(crate::sync::async_channel::Sender<T>),
}

impl<T> Reply<T> {
    pub(crate) fn send(self, value: T) {
        match self {
            Reply::Waiter(to) => to.send(value),
            Reply::Channel(tx) => {
                let _ = tx.try_send(value);
            }
            #[cfg(not(streamalloc_loom))]
            Reply::Async(tx) => {
                let _ = tx.try_send(value);
            }
        }
    }
}

/// The answer to most requests.
pub(crate) type Answer<T> = Reply<Result<T, ServiceError>>;

/// The sizes of one reservation request; one is held inline, so a plain
/// `reserve` puts nothing on the heap for the actor's thread to free.
pub(crate) type Sizes = smallvec::SmallVec<[u64; 1]>;
/// The allocations that answer one (one inline, likewise).
pub(crate) type Allocations = smallvec::SmallVec<[Allocation; 1]>;

/// What the service sends to shut a stream down, and what it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// The stream.
    pub stream: crate::memory::StreamId,
    /// Requests answered with `StreamStopped` while draining.
    pub rejected: u64,
    /// Allocations still pinned when the wait for pins ran out.
    pub pinned_at_exit: usize,
    /// Allocations lent to other streams' clients that they still held
    /// when the wait for pins (which waits for them too) ran out: freed
    /// with the stream, their handles answer `StreamStopped` from then on
    /// (`docs/service.md`, "Serving another stream").
    pub lent_at_exit: usize,
    /// Bytes the storage still held after freeing every page (0 unless a
    /// storage failed to free).
    pub bytes_left: u64,
}

/// A reservation a stream past the device's headroom asks another stream
/// of the device to serve from the room it holds (`docs/service.md`,
/// "Serving another stream").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LendAsk {
    /// The sizes, all or none.
    pub(crate) sizes: Sizes,
    /// The asker's caller's mode.
    pub(crate) mode: crate::memory::AllocationMode,
    /// How the asker's storage names its device stream: the lender records
    /// it as a user of what it serves, and orders it after its own work.
    pub(crate) user: crate::storage::UserStream,
    /// The asker's manager, whose handles take what is lent as theirs.
    pub(crate) borrower: u64,
}

/// Control traffic from the supervisor's coordinator to a stream actor, on
/// an unbounded channel (a send never blocks), each followed by a `Wake`.
#[derive(Debug)]
pub(crate) enum Control {
    /// Another stream is short: return every page nothing holds, compact,
    /// and say how much went back.
    GiveBack {
        /// The recovery episode this answers.
        episode: u64,
        /// The asker is short of memory, not only past the headroom: this
        /// is its last try before `OutOfMemory`, so what goes back is
        /// waited for (`MemoryManager::drain`) rather than left behind a
        /// fence.
        short: bool,
        /// Past the headroom only: the bytes the asker lacks, which is
        /// what a giver with that much free gives back (the rest stays
        /// mapped for its own next reservations).
        wanted: u64,
    },
    /// The recovery round for this stream is over: retry what is parked.
    Retry,
    /// Reserved / in use passed the threshold: compact.
    Compact,
    /// No request for the idle tick: tidy up as an idle stream does.
    Idle,
    /// The stream holds more than it needed lately: return empty pages and
    /// compact, down towards `keep` bytes (see `settle.rs`).
    Settle {
        /// Bytes the stream should hold at most.
        keep: u64,
    },
}

impl Control {
    /// Sent by the coordinator's timers (a tick), not by a recovery round
    /// that a parked request waits for.
    pub(crate) fn is_timer(&self) -> bool {
        matches!(
            self,
            Control::Compact | Control::Idle | Control::Settle { .. }
        )
    }
}
