//! Lending between streams: a stream about to grow its device past the
//! headroom is served from the room another stream holds, with no driver
//! call that maps or unmaps memory; what it borrows works through its own
//! handle, goes back to the lender when dropped, and a lender that stops
//! leaves typed errors behind, never memory in use by someone else.
//! (`docs/service.md`, "Serving another stream".)

use streamalloc::memory::StreamId;
use streamalloc::service::{
    Calls, Headroom, ServiceConfig, ServiceError, StreamHandle, Supervisor, SupervisorEvent,
};

mod common;
use common::MIB;

fn device(lend: bool) -> Supervisor {
    Supervisor::virtual_device(config(lend))
}

/// On host memory, for the tests that read and write.
fn host(lend: bool) -> Supervisor {
    Supervisor::host(config(lend))
}

fn config(lend: bool) -> ServiceConfig {
    ServiceConfig {
        headroom: Some(Headroom::default()),
        lend_across_streams: lend,
        ..common::quiet()
    }
}

/// Streams 0 and 1 of `device`, stream 0 holding 48 MiB of room.
fn lender_and_borrower(device: &Supervisor) -> (StreamHandle, StreamHandle) {
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    room_of_48_mib(&a);
    (a, b)
}

/// 48 MiB reserved and dropped on `stream`: its room, kept mapped.
fn room_of_48_mib(stream: &StreamHandle) {
    drop(stream.reserve_many(&[MIB; 48]).unwrap());
    stream.report().unwrap();
    assert!(stream.stats().bytes_reserved >= 48 * MIB);
    assert_eq!(stream.stats().bytes_in_use, 0);
}

#[test]
fn a_stream_past_the_headroom_is_served_from_anothers_room_with_no_map() {
    let device = device(true);
    let events = device.events();
    let (a, b) = lender_and_borrower(&device);
    let a_before = a.report().unwrap();
    let a_reserved = a.stats().bytes_reserved;

    let big = b.reserve(40 * MIB).unwrap();
    assert_eq!(big.size(), 40 * MIB);
    assert_eq!(big.id().unwrap().stream, StreamId(0), "a's allocation");
    let (a_now, b_now) = (a.report().unwrap(), b.report().unwrap());
    // Nothing moved: a holds what it held, its bytes in use are b's 40
    // MiB, and b mapped nothing.
    assert_eq!(a.stats().bytes_reserved, a_reserved);
    assert_eq!(a.stats().bytes_in_use, 40 * MIB);
    assert_eq!((a.stats().lent, b.stats().borrowed), (1, 1));
    assert_eq!(b_now.driver.granule_maps(), 0, "{:?}", b_now.driver);
    let lent = a_now.driver.since(&a_before.driver);
    assert_eq!(lent.granule_maps() + lent.unmaps, 0, "{lent:?}");
    assert_eq!(lent.stream_orders, 1, "b's work ordered after a's");
    let peak = device.device_stats().peak_bytes_reserved;
    assert!(peak <= 48 * MIB + Headroom::default().slack, "peak {peak}");
    // Told by the asker's turn as it answers.
    let lent = SupervisorEvent::Lent {
        stream: StreamId(1),
        lender: StreamId(0),
        bytes: 40 * MIB,
    };
    assert!(common::wait_for(&events, |e| *e == lent));
    drop(big);
    device.shutdown();
}

#[test]
fn what_a_stream_borrowed_works_through_its_own_handle() {
    let device = host(true);
    let (a, b) = lender_and_borrower(&device);
    let borrowed = b.reserve_many(&[20 * MIB, 20 * MIB]).unwrap();
    assert!(
        borrowed
            .iter()
            .all(|x| x.id().unwrap().stream == StreamId(0))
    );
    let (one, two) = (&borrowed[0], &borrowed[1]);
    b.write(one, 5, b"lent").unwrap();
    assert_eq!(b.read(one, 5, 4).unwrap(), b"lent");
    b.copy(one, two).unwrap();
    assert_eq!(b.read(two, 5, 4).unwrap(), b"lent");
    let pinned = b.resolve(one).unwrap();
    assert_ne!(pinned.addr(), 0);
    assert!(b.try_resolve(two).unwrap().is_some());
    drop(pinned);
    b.guard(one).unwrap();
    b.written(one, 0..4).unwrap();
    // The lender's own handles take them as any of theirs.
    assert_eq!(a.read(two, 5, 4).unwrap(), b"lent");
    // Bound only into a handle of the lender.
    let (reserved, mine) = (borrowed[1].clone(), b.unbound().unwrap());
    let refused = b.try_bind(reserved, &mine, 0).unwrap_err();
    assert!(matches!(refused.error, ServiceError::WrongStream { .. }));
    let theirs = a.unbound().unwrap();
    b.bind(refused.allocation.unwrap(), &theirs, 0).unwrap();
    assert_eq!(b.read(&theirs, 5, 4).unwrap(), b"lent");
    drop((borrowed, theirs));
    device.shutdown();
}

#[test]
fn another_streams_allocation_not_lent_here_is_still_refused() {
    let device = host(true);
    let a = device.stream(StreamId(0)).unwrap();
    let b = device.stream(StreamId(1)).unwrap();
    let own = a.reserve(MIB).unwrap();
    for refused in [
        b.read(&own, 0, 1).map(|_| ()),
        b.write(&own, 0, b"x"),
        b.try_resolve(&own).map(|_| ()),
        b.record_use(&own, b.user_stream().unwrap()),
    ] {
        assert!(
            matches!(refused, Err(ServiceError::WrongStream { .. })),
            "{refused:?}"
        );
    }
    drop(own);
    device.shutdown();
}

#[test]
fn a_borrowed_allocation_goes_back_to_its_lender() {
    let device = device(true);
    let (a, b) = lender_and_borrower(&device);
    let reserved = a.stats().bytes_reserved;
    for _ in 0..4 {
        let big = b.reserve(40 * MIB).unwrap();
        assert_eq!(big.id().unwrap().stream, StreamId(0));
        drop(big);
        assert_eq!(a.stats().bytes_in_use, 0, "released at once");
    }
    // Each loan came back to a's room (after b's work, its fence) before
    // the next: a lent four times from the same room, and grew for none.
    assert_eq!(a.stats().lent, 4);
    a.report().unwrap();
    assert_eq!(a.stats().bytes_reserved, reserved);
    assert_eq!(b.stats().bytes_reserved, 0);
    device.shutdown();
}

#[test]
fn with_lending_off_the_others_give_back_instead() {
    let device = device(false);
    let (a, b) = lender_and_borrower(&device);
    let big = b.reserve(40 * MIB).unwrap();
    assert_eq!(big.id().unwrap().stream, StreamId(1));
    assert_eq!((a.stats().lent, b.stats().borrowed), (0, 0));
    assert!(b.report().unwrap().driver.granule_maps() > 0);
    drop(big);
    device.shutdown();
}

#[test]
fn a_lender_that_stops_leaves_typed_errors_behind() {
    let device = host(true);
    let (_lender, b) = lender_and_borrower(&device);
    let big = b.reserve(40 * MIB).unwrap();
    b.write(&big, 0, b"data").unwrap();
    // On a manual clock the stop looks once for pins and loans, then
    // frees them: it says how many it freed under another's clients.
    let report = device.remove_stream(StreamId(0)).unwrap();
    assert_eq!(report.lent_at_exit, 1);
    assert_eq!(report.bytes_left, 0);
    assert!(matches!(
        b.read(&big, 0, 4),
        Err(ServiceError::StreamStopped(StreamId(0)))
    ));
    drop(big);
    // The borrower goes on with memory of its own.
    let next = b.reserve(MIB).unwrap();
    assert_eq!(next.id().unwrap().stream, StreamId(1));
    drop(next);
    device.shutdown();
}

#[test]
fn a_loan_is_served_as_well_through_the_askers_own_thread() {
    // Every request a round trip to the actor's thread: that thread runs
    // the loan once its turn is over, in the lender's turn.
    let device = Supervisor::virtual_device(ServiceConfig {
        calls: Calls {
            serve_in_place: false,
            ..Calls::default()
        },
        ..config(true)
    });
    let (a, b) = lender_and_borrower(&device);
    let big = b.reserve(40 * MIB).unwrap();
    assert_eq!(big.id().unwrap().stream, StreamId(0), "a's allocation");
    drop(big);
    // And from an async caller, whose request always goes to the thread.
    let again = pollster::block_on(b.reserve_async(40 * MIB)).unwrap();
    assert_eq!(again.id().unwrap().stream, StreamId(0));
    assert_eq!((a.stats().lent, b.stats().borrowed), (2, 2));
    drop(again);
    device.shutdown();
}

#[test]
fn streams_lending_to_each_other_at_once_all_get_an_answer() {
    // Two streams with room each, each client asking past its own room
    // again and again on its own thread, so that each one's loans are
    // taken in the other's turn while the other's are taken in its own
    // (`loom-tests/lend.rs` checks every interleaving of one such ask on
    // each side; this runs many on real threads, and a hang fails it at
    // the harness's timeout).
    let device = device(true);
    let streams = [StreamId(0), StreamId(1)].map(|id| device.stream(id).unwrap());
    // 48 MiB of room each, made at once (made in turn, the second would
    // borrow the first's).
    let made = streams
        .each_ref()
        .map(|s| s.reserve_many(&[MIB; 48]).unwrap());
    drop(made);
    std::thread::scope(|scope| {
        for stream in &streams {
            scope.spawn(move || {
                // Each reservation made while the one before is still
                // held: past the stream's own room, so it asks the other.
                let mut held = None;
                for round in 0..200u64 {
                    let size = (40 + round % 7) * MIB;
                    let got = stream.reserve(size).unwrap();
                    assert_eq!(got.size(), size);
                    held = Some(got);
                }
                drop(held);
            });
        }
    });
    let lent: u64 = streams.iter().map(|s| s.stats().lent).sum();
    let borrowed: u64 = streams.iter().map(|s| s.stats().borrowed).sum();
    assert_eq!(lent, borrowed, "every loan counted at both ends");
    for stream in &streams {
        stream.report().unwrap();
        assert_eq!(stream.stats().bytes_in_use, 0, "every loan came back");
    }
    device.shutdown();
}
