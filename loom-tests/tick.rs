//! A tick run in place never overtakes a notice sent before it.
//!
//! `Supervisor::tick` runs the coordinator's timers on its own thread
//! (`CoordinatorSeat::tick`) unless a notice waits for the coordinator's
//! thread; then the tick goes as a notice behind it. Here the supervisor's
//! side tells the coordinator a stream started and then ticks, while the
//! real coordinator runs its loop on a thread of its own; the tick asks a
//! stream holding 8 MiB it does not use to compact. Whichever way the tick
//! runs, the subscriber hears the start first and the compaction second,
//! both before the tick returns.
//!
//! Fails when `CoordinatorSeat::tick` (`service/coordinator.rs`) ticks in
//! place without looking at `notices_waiting`: the timers then run before
//! the coordinator's thread has handled the notice.

#![cfg(streamalloc_loom)]

mod common;

use common::{caching_pages, run_wide_model};
use streamalloc::memory::StreamId;
use streamalloc::service::SupervisorEvent;
use streamalloc::service::loom_support::device_compacting;

const PAGE: u64 = 8 << 20;

#[test]
fn a_tick_in_place_comes_after_the_notices_before_it() {
    run_wide_model("a tick after a notice", "LOOM_TICK_PREEMPTIONS", || {
        let mut device = device_compacting(1, caching_pages(PAGE), 4 * PAGE, 1.5);
        let (handle, mut actor) = device.streams.pop().unwrap();
        // A page cached and published: 8 MiB reserved, none in use.
        drop(actor.reserve(PAGE).unwrap());
        actor.process_and_publish();
        let events = device.supervisor.subscribe();
        let coordinator = device.coordinator;
        let thread = loom::thread::spawn(move || coordinator.run());

        device.supervisor.announce(StreamId(7));
        device.supervisor.tick();
        assert_eq!(
            events.try_next(),
            Some(SupervisorEvent::StreamStarted(StreamId(7))),
            "the notice sent before the tick is handled first"
        );
        assert_eq!(
            events.try_next(),
            Some(SupervisorEvent::CompactionScheduled(StreamId(0))),
            "the tick ran, after it"
        );

        device.stop.stop();
        thread.join().unwrap();
        drop(handle);
        actor.retire();
    });
}
