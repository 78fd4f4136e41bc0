//! How the actor serves a reservation, top to bottom: from the room the
//! stream holds, within the device's headroom (`service/headroom.rs`),
//! growing, or parked while the device runs short (`short.rs`).

use super::short::RunningShort;
use super::stream::{Stream, is_out_of_memory};
use crate::memory::{AllocationMode, MemoryError, PageUpdate, RelocationReason};
use crate::service::events::SupervisorEvent;
use crate::service::headroom::MIN_ROUND_GAIN;
use crate::service::message::{LendJob, Lender, Pending, PendingState};
use crate::service::protocol::{Allocations, LendAsk};
use crate::service::shared::bump;
use crate::storage::DriverPath;

impl RunningShort {
    /// Serve a reservation, or park it if the device is short.
    pub(crate) fn serve_reserve(&mut self, stream: &mut Stream, mut pending: Pending) {
        if pending.for_cache > 0 && (stream.over_headroom(&pending) || self.round_out()) {
            // No spare allocations for a cache on a device that is tight.
            let asked = pending.sizes.len().saturating_sub(pending.for_cache);
            pending.sizes.truncate(asked);
            pending.for_cache = 0;
        }
        if pending.update != PageUpdate::Forbidden && stream.over_headroom(&pending) {
            return self.serve_within_headroom(stream, pending);
        }
        self.serve_growing(stream, pending);
    }

    /// Serve a reservation, taking pages as needed; park it if the device
    /// is short.
    pub(super) fn serve_growing(&mut self, stream: &mut Stream, pending: Pending) {
        match stream.try_reserve(&pending) {
            Ok(batch) => return stream.answer_served(pending, batch, false),
            Err(err) if !is_out_of_memory(&err) || pending.update == PageUpdate::Forbidden => {
                return pending.answer(Err(err.into()));
            }
            Err(_) => {}
        }
        // Our own cached pages (and our clients' hot allocations) and
        // fragmentation first.
        stream.on_driver_path(DriverPath::Short, |stream| {
            stream.take_back_hot();
            stream.memory.give_back_free();
            let _ = stream.memory.relocate(RelocationReason::Short);
        });
        match stream.try_reserve(&pending) {
            Ok(batch) => stream.answer_served(pending, batch, false),
            Err(err) if is_out_of_memory(&err) => self.park(stream, pending),
            Err(err) => pending.answer(Err(err.into())),
        }
    }

    /// The device holds more than its headroom above what is live: serve
    /// from the room this stream holds if it can, else trim this stream's
    /// pages and compact, else ask the others to give back before growing
    /// (see `headroom.rs`).
    ///
    /// A stream alone on its device trims but does not compact: whatever a
    /// compaction of the whole stream gathers could serve nobody else, and
    /// its growth compacts for the request itself (`pool/expandable/grow.rs`),
    /// moving only what that request needs. Against a compaction at every
    /// such reservation: a random single-stream load 39 → 20 us per event of
    /// modeled driver time (copies 30 → 16) at 1.035 → 1.031 of peak live,
    /// a held-out one 1.019 → 1.032 at 3.9 → 3.4 us (`docs/performance.md`).
    /// And whose free room is short of the request, it does not even trim:
    /// that would unmap what the growth then maps again (47 → 39 us per
    /// event, the same peak; skipping the trim always as well took the
    /// held-out load's peak to 1.044 of live).
    ///
    /// What the trim gives back stays as spare physical handles until the
    /// request is served (`DeviceStorage::hold_spares`): the growth that
    /// follows moves them where it maps, instead of creating handles for
    /// the memory the trim just released. They go once the request is
    /// answered. On a device without a budget, one parked for the others'
    /// round keeps them until its `Retry` serves it (or the stream's next
    /// request, settle, idle tick or cleanup lets them go first): its
    /// growth moves them there, beside what the others handed over.
    /// (Released before the round, the asker created as many handles
    /// afresh once served: `docs/performance.md`, "What each decision
    /// costs".) The
    /// round's lack leaves them out already (`Stream::headroom_lacks`).
    /// Under a budget they go at the park: there they are room another
    /// stream's grant may lack while the round runs (kept, a held-out
    /// serving trace needed a budget 1.3 % larger to fit).
    pub(super) fn serve_within_headroom(&mut self, stream: &mut Stream, pending: Pending) {
        if self.serve_within_headroom_holding(stream, pending) == Served::Answered {
            stream.memory.release_spares();
        }
    }

    fn serve_within_headroom_holding(&mut self, stream: &mut Stream, pending: Pending) -> Served {
        for trimmed in [false, true] {
            if trimmed {
                let alone = stream.alone();
                if alone && !stream.room_could_fit(&pending) {
                    break;
                }
                stream.on_driver_path(DriverPath::Trim, |stream| {
                    stream.memory.hold_spares();
                    stream.memory.give_back_free();
                    if !alone {
                        let _ = stream.memory.relocate(RelocationReason::Short);
                    }
                    stream.memory.flush();
                });
                stream.publish();
            }
            match stream.try_reserve_held(&pending) {
                Ok(Some(batch)) => {
                    stream.answer_served(pending, batch, false);
                    return Served::Answered;
                }
                Ok(None) => {}
                Err(err) => {
                    pending.answer(Err(err.into()));
                    return Served::Answered;
                }
            }
        }
        self.past_own_room(stream, pending, true)
    }

    /// What a request past the headroom that its stream's room cannot
    /// serve comes to: lent by another stream (`may_lend`, and lending is
    /// on: handed to whoever ends this turn, `lending.rs`), parked for the
    /// others' round, or grown for.
    pub(super) fn past_own_room(
        &mut self,
        stream: &mut Stream,
        mut pending: Pending,
        may_lend: bool,
    ) -> Served {
        if self.round_out() {
            // A round for this stream is under way: its `Retry` serves this.
            stream.park_spares();
            pending.state = PendingState::ParkedForHeadroom {
                since: stream.now(),
            };
            self.park_for_round(pending);
            return Served::Parked;
        }
        // A round is worth its wake-ups if the others hold room they do not
        // use, however much less than the request: it comes off what the
        // device holds past its headroom. (Asked for the request's worth,
        // a stream growing by 192 MiB with 169 MiB unused elsewhere grew
        // without a round, and a held-out 2-stream serving trace held
        // 1.063 of its peak live; 1.015 with the round.)
        let requested = pending.requested();
        if stream.device.has_coordinator()
            && stream.over_headroom(&pending)
            && stream.device.others_excess(stream.shared.stream) >= MIN_ROUND_GAIN
        {
            stream.park_spares();
            pending.state = PendingState::ParkedForHeadroom {
                since: stream.now(),
            };
            if may_lend && let Some(ask) = stream.lend_ask(&pending) {
                let lenders = stream.lenders(&ask);
                if !lenders.is_empty() {
                    self.lend_after_turn(LendJob {
                        asker: stream.shared.stream,
                        pending,
                        ask,
                        lenders,
                    });
                    return Served::Parked;
                }
            }
            let lacks = stream.headroom_lacks(&pending);
            self.park_for_round(pending);
            self.ask_now(stream, requested, Some(lacks));
            return Served::Parked;
        }
        pending.state = stream.growth_state(&pending);
        self.serve_growing(stream, pending);
        Served::Answered
    }
}

/// Where a request served within the headroom went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Served {
    /// Answered (served, parked as short, or refused): the spares its trim
    /// kept go.
    Answered,
    /// Parked for the others' round, or out to be lent: the spares stay
    /// for its `Retry` or its loan (`Stream::park_spares`).
    Parked,
}

impl Stream {
    /// A request is parked for the others' round: the spares its trim kept
    /// stay for its `Retry` where the device has no budget, and go now
    /// where it has one (`serve_within_headroom`).
    fn park_spares(&mut self) {
        if self.device.budget.is_some() {
            self.memory.release_spares();
        }
    }

    /// Whether the free room this stream holds is at least what `pending`
    /// asks: only then can a compaction make it fit without a growth.
    pub(super) fn room_could_fit(&self, pending: &Pending) -> bool {
        let free = self
            .memory
            .bytes_reserved()
            .saturating_sub(self.memory.bytes_in_use());
        free >= pending.requested()
    }

    /// All of the sizes or none (in pages just large enough when the
    /// device is past its headroom).
    pub(super) fn try_reserve(&mut self, pending: &Pending) -> Result<Allocations, MemoryError> {
        let tight =
            pending.state == PendingState::ServingTight && pending.update == PageUpdate::Allow;
        let asked = pending.sizes.len().saturating_sub(pending.for_cache);
        let mut batch = Allocations::with_capacity(pending.sizes.len());
        for &size in &pending.sizes[..asked] {
            let reserved =
                self.memory
                    .reserve_within_caches(size, pending.update, pending.mode, tight)?;
            let allocation = match reserved {
                Some(allocation) => allocation,
                // It would grow past what the stream needed while clients'
                // caches hold room: that room first.
                None => {
                    self.take_back_hot();
                    if tight {
                        self.memory.reserve_tight(size, pending.mode)?
                    } else {
                        self.memory.reserve_in(size, pending.update, pending.mode)?
                    }
                }
            };
            batch.push(allocation);
        }
        // Spares for the caller's cache: as many as the room held has.
        for &size in &pending.sizes[asked..] {
            match self.memory.reserve_for_cache(size, pending.mode)? {
                Some(spare) => batch.push(spare),
                None => break,
            }
        }
        Ok(batch)
    }

    /// All of the sizes from the room held, or `None` (what was served
    /// goes back when the partial batch drops).
    pub(super) fn try_reserve_held(
        &mut self,
        pending: &Pending,
    ) -> Result<Option<Allocations>, MemoryError> {
        let mut batch = Allocations::with_capacity(pending.sizes.len());
        for &size in &pending.sizes {
            match self.memory.reserve_held(size, pending.mode)? {
                Some(allocation) => batch.push(allocation),
                None => return Ok(None),
            }
        }
        Ok(Some(batch))
    }

    /// The streams that may lend `ask`, in order (`registry::lenders`).
    fn lenders(&self, ask: &LendAsk) -> Vec<Lender> {
        let streams = self.device.registry.lock();
        crate::service::registry::lenders(&streams, self.shared.stream, ask)
    }

    /// What another stream may serve of `pending` from its room, past the
    /// device's headroom: its sizes, none for a client's cache (those are
    /// dropped past the headroom: `serve_reserve`).
    fn lend_ask(&mut self, pending: &Pending) -> Option<LendAsk> {
        if pending.for_cache > 0 || !self.device.lends {
            return None;
        }
        let named = self.memory.storage().stream_name();
        Some(LendAsk {
            sizes: pending.sizes.clone(),
            mode: pending.mode,
            user: self.shared.user_stream(named),
            borrower: self.memory.owner_id(),
        })
    }

    /// Answer `pending` with allocations another stream lent from its
    /// room (`lending.rs`): no growth, nothing mapped here.
    pub(super) fn answer_borrowed(&mut self, pending: Pending, lent: Allocations) {
        self.memory.release_spares();
        bump(&self.shared.borrowed, lent.len() as u64);
        self.publish();
        pending.answer(Ok(lent));
    }

    /// Answer `pending` with `batch`; `recovered`: it waited for memory.
    pub(super) fn answer_served(&mut self, pending: Pending, batch: Allocations, recovered: bool) {
        // Spares a trim kept for this request's growth go before anything
        // is published.
        self.memory.release_spares();
        bump(&self.shared.reservations, batch.len() as u64);
        if recovered {
            self.device.tell(SupervisorEvent::Recovered {
                stream: self.shared.stream,
                requested: pending.requested(),
            });
        }
        // Everything another stream's decision reads is in place before
        // the caller hears back (`docs/service.md`).
        self.trim_to_headroom();
        self.publish();
        pending.answer(Ok(batch));
    }

    /// How a request that grows the device is served: in pages just large
    /// enough while the device is past its headroom.
    pub(super) fn growth_state(&self, pending: &Pending) -> PendingState {
        if self.over_headroom(pending) {
            PendingState::ServingTight
        } else {
            PendingState::Serving
        }
    }

    /// Whether growing for `pending` would carry the device past its
    /// headroom (counting a new page for each size, the most it could take).
    pub(super) fn over_headroom(&self, pending: &Pending) -> bool {
        self.over_headroom_for(&pending.sizes, pending.mode)
    }

    /// [`over_headroom`](Self::over_headroom) for reserving `sizes` in
    /// `mode`.
    pub(super) fn over_headroom_for(&self, sizes: &[u64], mode: AllocationMode) -> bool {
        if self.device.headroom.is_none() {
            return false;
        }
        let requested = crate::service::message::requested(sizes);
        // The test only turns true as the pages grow: within the headroom
        // with the most they could take, it is within; past it with none,
        // past. Only between does the exact page count matter (it searches
        // an expandable pool's voids).
        // Spare handles a growth moves rather than adds to.
        let spare = self.memory.bytes_spare();
        if !(self.device).over_headroom(requested, self.pages_for(sizes, mode, false), spare) {
            return false;
        }
        if self.device.over_headroom(requested, 0, spare) {
            return true;
        }
        (self.device).over_headroom(requested, self.pages_for(sizes, mode, true), spare)
    }

    /// The bytes the device would hold past its headroom with `pending`
    /// grown: what a round asks the others to give back.
    pub(super) fn headroom_lacks(&self, pending: &Pending) -> u64 {
        let requested = pending.requested();
        let pages = self.pages_for(&pending.sizes, pending.mode, true);
        let spare = self.memory.bytes_spare();
        self.device.headroom_excess(requested, pages, spare)
    }

    /// The bytes of new pages reserving `sizes` in `mode` would take:
    /// `exact`, or at most that without searching an expandable pool.
    ///
    /// Each size's page depends on the stream's state alone, the same for
    /// the whole batch, so a run of equal sizes (what `reserve_many` of
    /// one shape asks) is worked out once: the exact answer searches an
    /// expandable pool's voids, a twelfth of an item's time when it was
    /// searched for each.
    fn pages_for(&self, sizes: &[u64], mode: AllocationMode, exact: bool) -> u64 {
        let mut last: Option<(u64, u64)> = None;
        (sizes.iter())
            .map(|&size| match last {
                Some((asked, page)) if asked == size => page,
                _ => {
                    let page = if exact {
                        self.memory.new_page_size(size, mode)
                    } else {
                        self.memory.new_page_size_at_most(size, mode)
                    };
                    let page = page.unwrap_or(size);
                    last = Some((size, page));
                    page
                }
            })
            .fold(0u64, u64::saturating_add)
    }

    /// The device holds more than its headroom above what is live, and this
    /// stream holds more than its share of that excess: give back its empty
    /// pages now. The cheap half of the headroom policy (no round, no
    /// wake-up): streams that keep serving keep themselves trim, and a
    /// growing stream asks the others only for what is left. A stream alone
    /// on its device keeps its room: nobody could use it. So does one whose
    /// arenas keep their peak's room mapped, on a device without a budget:
    /// what it holds free goes to the stream that grows when that one asks
    /// (a round hands its whole physical handles over: an unmap here and a
    /// map there), where a trim gave it to the driver for that stream to
    /// create again (a release here, a create there, besides). Trimming
    /// took `serve_two_streams` 4.19 → 4.61 us per event of driver time
    /// beyond the peak once, at 1.009 → 1.012 of live (`docs/performance.md`,
    /// "What each decision costs"). Under a budget they trim: room kept free is
    /// reused in part later, and a handle partly in use cannot go back
    /// when another stream's grant lacks it (without the trim,
    /// `serve_two_streams` needed a budget 1.6 % larger to fit). Pages,
    /// which a round cannot hand over, always trim (without it the
    /// adaptive layout's peaks rose by up to 0.05).
    pub(super) fn trim_to_headroom(&mut self) {
        let Some(headroom) = self.device.headroom else {
            return;
        };
        if self.memory.keeps_peak_mapped() && self.device.budget.is_none() {
            return;
        }
        // The stream's own pools, against what its clients hold now.
        let in_use = self.shared.bytes_in_use();
        let excess = self.memory.bytes_reserved().saturating_sub(in_use);
        if excess < headroom.share(in_use) || !self.device.over_headroom(0, 0, 0) || self.alone() {
            return;
        }
        self.on_driver_path(DriverPath::Trim, |stream| {
            stream.take_back_hot();
            stream.memory.give_back_free();
            stream.memory.flush();
        });
        self.publish();
    }
}
