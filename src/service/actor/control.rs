//! What a stream actor does with the coordinator's control traffic
//! (`Control`, on an unbounded channel that never blocks the sender):
//! give back for another stream's recovery round, retry what is parked
//! when its own round ends, settle, compact.

use super::StreamActor;
use super::stream::Stream;
use crate::memory::{RelocationNeed, RelocationReason};
use crate::service::device::Notice;
use crate::service::protocol::{Allocations, Control, LendAsk};
use crate::service::shared::bump;
use crate::storage::DriverPath;

/// A stream that gives back for another growing past the headroom gives
/// this many times what the other lacks, when it holds that much free:
/// enough that the other's next reservations need no round of their own,
/// little enough that the giver keeps most of its room mapped. Against
/// giving back everything free (`streamalloc replay F --json`, modeled
/// driver time beyond mapping the peak once): `serving_contig-h101` 2.31
/// → 1.90 us per event at 1.041 → 1.037 of live, `serve_two_streams` 5.13
/// → 4.79, `serving-s1` 0.51 → 0.41, `cnn_multi` up to +0.016 of live at
/// the peak; once, `cnn_multi-h101` 6.27 → 6.43; four times,
/// `serving_contig-h101` 1.83 at 1.052 of live (`docs/performance.md`,
/// "What each decision costs").
pub(crate) const ROUND_GIVES_LACK_TIMES: u64 = 2;

impl StreamActor {
    /// Serve what the coordinator sent.
    pub(crate) fn handle_control(&mut self, control: Control) {
        let stream = &mut self.stream;
        match control {
            Control::GiveBack {
                episode,
                short,
                wanted,
            } => {
                let path = if short {
                    DriverPath::Short
                } else {
                    DriverPath::Round
                };
                stream.on_driver_path(path, |stream| stream.give_back(episode, short, wanted));
            }
            Control::Retry => {
                // What the givers passed on maps where this growth would
                // create handles; what it leaves is released once served.
                stream.memory.take_passed_on();
                self.short.round_over(stream);
                stream.memory.release_spares();
            }
            Control::Settle { keep } => {
                stream.on_driver_path(DriverPath::Settle, |stream| stream.settle(keep));
            }
            Control::Idle => stream.on_driver_path(DriverPath::Idle, Stream::idle_tick),
            // The coordinator reads the stream's totals; where the pools
            // keep their peak's room mapped, they decide (that room is no
            // fragmentation, and a compaction would give it back).
            Control::Compact
                if !stream.memory.keeps_peak_mapped()
                    || stream.memory.relocation_need() != RelocationNeed::None =>
            {
                if let Ok(report) = stream.memory.relocate(RelocationReason::Compaction) {
                    bump(&stream.shared.relocated, report.moved);
                }
            }
            Control::Compact => {}
        }
        stream.publish();
    }

    /// Another stream past the headroom asks this one, in a turn its
    /// lending job took (`lending.rs`), to serve `ask` from the room it
    /// holds (`docs/service.md`, "Serving another stream").
    pub(crate) fn lend(&mut self, ask: &LendAsk) -> Option<Allocations> {
        let stream = &mut self.stream;
        let lent = stream.on_driver_path(DriverPath::Lend, |stream| stream.lend_from_room(ask));
        if let Some(lent) = &lent {
            bump(&stream.shared.lent, lent.len() as u64);
        }
        stream.publish();
        lent
    }
}

impl Stream {
    /// `ask`'s sizes, all from the room this stream holds (never a growth,
    /// a trim or a move: no driver call maps or unmaps anything), each
    /// recorded as used by the asker's stream, which is ordered after this
    /// one's work; `None` where the room does not hold them all.
    ///
    /// What its clients dropped and the fences passed since its last turn
    /// are room too: a flush first (a cleanup point: the storage's work so
    /// far sealed, the fences asked again). A lender that idles while the
    /// asker peaks would otherwise hold, behind fences nobody asked, what
    /// the asker released of an earlier loan: `cnn_multi-h101` held 1.512
    /// of its live bytes at the peak that way in the prototype
    /// (`docs/cross-stream-serving.md`).
    ///
    /// The asker's work may touch the bytes only after what this stream
    /// queued on them before (the event `order_for` records), and this
    /// stream may reuse them once released only after the asker's work is
    /// done (the use fence `record_use` asks for at the release); recorded
    /// users also keep them in place.
    fn lend_from_room(&mut self, ask: &LendAsk) -> Option<Allocations> {
        self.memory.flush();
        let mut lent = Allocations::with_capacity(ask.sizes.len());
        for &size in &ask.sizes {
            // Dropped on a refusal, what was served goes back at once: no
            // user is recorded yet.
            lent.push(self.memory.reserve_held(size, ask.mode).ok().flatten()?);
        }
        let recorded = (lent.iter()).all(|allocation| {
            (self.memory)
                .lend_to(allocation, ask.user, ask.borrower)
                .is_ok()
        });
        if !recorded || self.memory.storage().order_for(ask.user).is_err() {
            // Released as any, each waits for the asker's work recorded
            // so far (none: it never had them).
            return None;
        }
        Some(lent)
    }

    /// Another stream's recovery round (`episode`) asks: give back, then
    /// tell the coordinator how much went. Past the headroom, the asker
    /// lacks `wanted` bytes: a stream that holds that much free gives
    /// back [`ROUND_GIVES_LACK_TIMES`] as much, the longest idle first, and
    /// keeps the rest of its room mapped for its own next reservations
    /// (`docs/service.md`, "Headroom"). Otherwise, and for a stream
    /// `short` of memory, every cached page goes and the stream compacts;
    /// what went back is waited for where the asker is short (its last
    /// try), and goes in stream order past the headroom.
    ///
    /// The whole physical handles that go are passed on, unmapped and not
    /// released, for the asker's growth to map (`storage/loose.rs`): a
    /// create and a release fewer a handle than giving them to the driver
    /// and taking new ones from it.
    fn give_back(&mut self, episode: u64, short: bool, wanted: u64) {
        self.take_back_hot();
        self.memory.free_used_by_others();
        let before = self.memory.bytes_allocated();
        self.memory.hold_spares();
        let partial = !short
            && self
                .memory
                .give_back_up_to(wanted.saturating_mul(ROUND_GIVES_LACK_TIMES))
                >= wanted;
        if !partial {
            self.memory.give_back_free();
            if let Ok(report) = self.memory.relocate(RelocationReason::Short) {
                bump(&self.shared.relocated, report.moved);
            }
        }
        self.memory.flush();
        self.memory.pass_spares_on();
        if short {
            self.memory.drain();
        }
        let freed = before.saturating_sub(self.memory.bytes_allocated());
        self.publish();
        if !partial {
            self.shared.gave_back_all();
        }
        self.device.notify(Notice::GaveBack {
            stream: self.shared.stream,
            episode,
            freed,
        });
    }
}
