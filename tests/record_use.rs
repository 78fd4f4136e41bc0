//! Memory other streams use (`record_use`, PyTorch's `record_stream`):
//! released, it stays where it is, mapped and unreused, until the work
//! those streams queued by then is done; asked at cleanup points, waited
//! for only by explicit cleanup and the end of a stream. On host memory,
//! whose modeled device runs `lag` flushes behind, so the deferred path
//! runs on every machine the same way.

mod common;

use common::{Lcg, MIB};
use proptest::prelude::*;
use streamalloc::memory::{
    Allocation, Cleanup, MAX_USER_STREAMS, MemoryConfig, MemoryError, MemoryManager, PageUpdate,
    RelocationReason, StreamId,
};
use streamalloc::service::{ServiceConfig, ServiceError, Supervisor};
use streamalloc::storage::{DeviceStorage, HostStorage, StorageHandle, UserStream};

const OTHER: UserStream = UserStream(7);

fn manager(lag: u64) -> MemoryManager<HostStorage> {
    MemoryManager::new(
        HostStorage::new().with_reclaim_lag(lag),
        MemoryConfig::default(),
    )
}

/// Reserve `size` bytes filled with `byte`.
fn filled(memory: &mut MemoryManager<HostStorage>, size: u64, byte: u8) -> Allocation {
    let allocation = memory.reserve(size, PageUpdate::Allow).unwrap();
    memory
        .write(&allocation, 0, &vec![byte; size as usize])
        .unwrap();
    allocation
}

/// Whether `handle`'s bytes, read from the storage itself, are all `byte`.
fn holds(memory: &mut MemoryManager<HostStorage>, handle: &StorageHandle, byte: u8) -> bool {
    let mut back = vec![0; handle.size as usize];
    memory.storage().read(handle, &mut back).is_ok() && back.iter().all(|&b| b == byte)
}

/// Reserve, record a use (or not), drop, and reserve the same size again:
/// where the second reservation lands, and where the first was.
fn reserve_after_release(
    record: bool,
) -> (StorageHandle, StorageHandle, MemoryManager<HostStorage>) {
    let mut memory = manager(2);
    let used = filled(&mut memory, MIB, 0xA5);
    let handle = memory.get_storage(&used).unwrap();
    if record {
        memory.record_use(&used, OTHER).unwrap();
    }
    drop(used);
    memory.flush();
    let next = filled(&mut memory, MIB, 0x11);
    let next_handle = memory.get_storage(&next).unwrap();
    std::mem::forget(next);
    (handle, next_handle, memory)
}

#[test]
fn memory_released_while_another_stream_uses_it_waits_for_that_work() {
    // Without a recorded use, the next reservation takes the same bytes.
    let (first, second, _) = reserve_after_release(false);
    assert_eq!((first.id, first.offset), (second.id, second.offset));

    let (first, second, mut memory) = reserve_after_release(true);
    assert_ne!(
        (first.id, first.offset),
        (second.id, second.offset),
        "memory another stream may still read is not reused"
    );
    assert_eq!(memory.awaiting_users(), 1);
    assert_eq!(memory.bytes_in_use(), 2 * MIB, "it still counts as used");
    // Compaction and a periodic cleanup leave it where it is, mapped.
    let _ = memory.relocate(RelocationReason::Compaction);
    memory.cleanup(Cleanup::Periodic);
    assert!(holds(&mut memory, &first, 0xA5));
    let waits = memory.storage().driver_ops().stream_waits;
    // Its fence passes two flushes behind the one that recorded it.
    for _ in 0..3 {
        memory.flush();
    }
    assert_eq!(memory.awaiting_users(), 0);
    assert_eq!(memory.bytes_in_use(), MIB);
    let ops = memory.storage().driver_ops();
    assert_eq!(ops.stream_waits, waits, "asked, never waited for");
    assert!(ops.events_recorded >= 1 && ops.events_queried >= 1);
}

#[test]
fn explicit_cleanup_waits_for_the_users_and_gives_the_memory_back() {
    let mut memory = manager(1_000);
    let used = filled(&mut memory, 3 * MIB, 1);
    memory.record_use(&used, OTHER).unwrap();
    memory.record_use(&used, UserStream(8)).unwrap();
    memory.record_use(&used, OTHER).unwrap();
    drop(used);
    memory.flush();
    memory.cleanup(Cleanup::Periodic);
    assert_eq!(memory.awaiting_users(), 1, "a thousand flushes from done");
    let waits = memory.storage().driver_ops().stream_waits;
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.awaiting_users(), 0);
    assert_eq!(memory.bytes_in_use(), 0);
    assert_eq!(memory.bytes_allocated(), 0, "everything went back");
    // Two user streams, recorded once each: two events waited for.
    assert_eq!(memory.storage().driver_ops().stream_waits, waits + 2 + 1);
}

#[test]
fn an_allocation_other_streams_use_stays_put() {
    let moved = |record: bool| {
        let mut memory = manager(0);
        let holes: Vec<_> = (0..6u8).map(|i| filled(&mut memory, MIB, i)).collect();
        let kept = filled(&mut memory, MIB, 0xEE);
        let before = memory.get_storage(&kept).unwrap();
        if record {
            memory.record_use(&kept, OTHER).unwrap();
        }
        drop(holes);
        let _ = memory.relocate(RelocationReason::Compaction);
        let after = memory.get_storage(&kept).unwrap();
        assert!(holds(&mut memory, &after, 0xEE));
        (before.id, before.offset) != (after.id, after.offset)
    };
    assert!(moved(false), "compaction moves it when no stream uses it");
    assert!(!moved(true), "and leaves it in place when one does");
}

/// An allocation lent to another stream's clients (`lend_to`) moves, as
/// one of the owner's own: the move's copy waits for the borrower's work
/// queued so far, and the borrower's work from then on for the copy (two
/// stream orders, no host wait). Released, it stays, waiting for its
/// fence.
#[test]
fn a_loan_moves_with_its_borrowers_work_ordered_around_the_move() {
    let mut memory = manager(0);
    let holes: Vec<_> = (0..6u8).map(|i| filled(&mut memory, MIB, i)).collect();
    let lent = filled(&mut memory, MIB, 0xEE);
    let before = memory.get_storage(&lent).unwrap();
    memory.lend_to(&lent, OTHER, 1).unwrap();
    drop(holes);
    let ops = memory.storage().driver_ops();
    let report = memory.relocate(RelocationReason::Compaction).unwrap();
    let orders = memory.storage().driver_ops().since(&ops);
    assert_eq!(orders.stream_orders, 2, "{orders:?}");
    assert_eq!(orders.stream_waits, 0);
    let after = memory.get_storage(&lent).unwrap();
    assert_ne!(
        (before.id, before.offset),
        (after.id, after.offset),
        "moved"
    );
    assert!(report.moved >= 1);
    assert!(holds(&mut memory, &after, 0xEE));
    // Released, it waits in place for the borrower's work.
    let fenced = filled(&mut memory, MIB, 0x33);
    memory.lend_to(&fenced, OTHER, 1).unwrap();
    let held = memory.get_storage(&fenced).unwrap();
    drop(fenced);
    memory.process_releases();
    assert_eq!(memory.awaiting_users(), 1);
    let _ = memory.relocate(RelocationReason::Compaction);
    assert!(holds(&mut memory, &held, 0x33), "left where it was");
}

#[test]
fn a_bad_record_is_a_typed_error() {
    let mut memory = manager(0);
    let mut other = manager(0);
    let used = memory.reserve(4096, PageUpdate::Allow).unwrap();
    let foreign = other.reserve(4096, PageUpdate::Allow).unwrap();
    assert!(matches!(
        memory.record_use(&foreign, OTHER),
        Err(MemoryError::Foreign(_))
    ));
    let unbound = memory.unbound();
    assert!(matches!(
        memory.record_use(&unbound, OTHER),
        Err(MemoryError::Uninitialized)
    ));
    for stream in 0..MAX_USER_STREAMS as u64 {
        memory.record_use(&used, UserStream(stream)).unwrap();
    }
    // Recorded already: nothing new.
    memory.record_use(&used, UserStream(0)).unwrap();
    let past = memory.record_use(&used, UserStream(u64::MAX));
    assert!(
        matches!(past, Err(MemoryError::TooManyUsers { max, .. }) if max == MAX_USER_STREAMS),
        "{past:?}"
    );
    assert!(past.unwrap_err().to_string().contains("other streams"));
    // Bound to another handle: every clone of the old one is stale.
    let stale = used.clone();
    let bound = memory.unbound();
    memory.bind(used, &bound, 0).unwrap();
    assert!(matches!(
        memory.record_use(&stale, OTHER),
        Err(MemoryError::Stale(_))
    ));
}

#[test]
fn through_the_service_one_stream_records_anothers_use() {
    let supervisor = Supervisor::new(
        ServiceConfig::default(),
        Box::new(|_| {
            Ok(Box::new(HostStorage::new().with_reclaim_lag(1_000)) as Box<dyn DeviceStorage>)
        }),
    );
    let owner = supervisor.stream(StreamId(0)).unwrap();
    let reader = supervisor.stream(StreamId(1)).unwrap();
    let user = reader.user_stream().unwrap();
    assert_eq!(user, UserStream(1), "a modeled device names it by its id");
    let used = owner.reserve(2 * MIB).unwrap();
    owner.write(&used, 0, &[9; 64]).unwrap();
    owner.record_use(&used, user).unwrap();
    // Another stream's handle is refused as foreign.
    let theirs = reader.reserve(4096).unwrap();
    assert!(matches!(
        owner.record_use(&theirs, user),
        Err(ServiceError::WrongStream { .. })
    ));
    drop(used);
    owner.cleanup(Cleanup::Periodic).unwrap();
    assert_eq!(owner.report().unwrap().usage().bytes_in_use, 2 * MIB);
    owner.cleanup(Cleanup::Explicit).unwrap();
    assert_eq!(owner.report().unwrap().usage().bytes_in_use, 0);
    // A use recorded on memory still held when the stream ends: the end
    // waits for it, and nothing hangs.
    let held = owner.reserve(MIB).unwrap();
    owner.record_use(&held, user).unwrap();
    supervisor.shutdown();
    drop(held);
}

/// One step of a stream whose memory other streams use.
#[derive(Debug, Clone)]
enum Step {
    Reserve(u64),
    Record(usize, u64),
    /// Lent to another stream's clients: it may move while they hold it.
    Lend(usize, u64),
    Drop(usize),
    Flush,
    Compact,
    Periodic,
    Explicit,
}

/// A lag no sequence of steps reaches: the users' work is never done
/// unless waited for.
const NEVER: u64 = 1 << 40;

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1u64..1_500_000).prop_map(Step::Reserve),
        2 => (any::<usize>(), 0u64..3).prop_map(|(at, user)| Step::Record(at, user)),
        2 => (any::<usize>(), 0u64..3).prop_map(|(at, user)| Step::Lend(at, user)),
        3 => any::<usize>().prop_map(Step::Drop),
        2 => Just(Step::Flush),
        1 => Just(Step::Compact),
        1 => Just(Step::Periodic),
        1 => Just(Step::Explicit),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// However reservations, records, loans, releases, compactions and
    /// cleanups interleave, memory released while other streams used it
    /// keeps its bytes (mapped, unmoved, unreused) until its fence passed,
    /// and the live allocations keep theirs (a loan where it moved to). A modeled device's fences pass in
    /// the order they were recorded, so the ones still awaited are the
    /// last ones recorded; on a device that never catches up, all of them
    /// until an explicit cleanup waits.
    #[test]
    fn released_memory_in_use_elsewhere_is_never_touched(
        lag in prop_oneof![0u64..4, Just(NEVER)],
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let mut memory = manager(lag);
        let mut live: Vec<(Allocation, u8, bool)> = Vec::new();
        let mut awaited: Vec<(StorageHandle, u8)> = Vec::new();
        let mut byte = Lcg(lag + 1);
        for step in steps {
            match step.clone() {
                Step::Reserve(size) => {
                    let fill = (byte.next() % 250) as u8 + 1;
                    live.push((filled(&mut memory, size, fill), fill, false));
                }
                Step::Record(at, user) if !live.is_empty() => {
                    let at = at % live.len();
                    memory.record_use(&live[at].0, UserStream(100 + user)).unwrap();
                    live[at].2 = true;
                }
                Step::Lend(at, user) if !live.is_empty() => {
                    let at = at % live.len();
                    memory.lend_to(&live[at].0, UserStream(100 + user), 1).unwrap();
                    live[at].2 = true;
                }
                Step::Drop(at) if !live.is_empty() => {
                    let (allocation, fill, recorded) = live.swap_remove(at % live.len());
                    if recorded {
                        awaited.push((memory.get_storage(&allocation).unwrap(), fill));
                    }
                    drop(allocation);
                    // The release lands at the manager's next call.
                    memory.process_releases();
                }
                Step::Flush => memory.flush(),
                Step::Compact => { let _ = memory.relocate(RelocationReason::Compaction); }
                Step::Periodic => memory.cleanup(Cleanup::Periodic),
                Step::Explicit => memory.cleanup(Cleanup::Explicit),
                _ => {}
            }
            let waiting = memory.awaiting_users();
            if lag == NEVER {
                if matches!(step, Step::Explicit) {
                    awaited.clear();
                }
                prop_assert_eq!(waiting, awaited.len());
            }
            prop_assert!(waiting <= awaited.len());
            awaited.drain(..awaited.len() - waiting);
            for (handle, fill) in &awaited {
                prop_assert!(holds(&mut memory, handle, *fill), "released in use elsewhere: {handle:?}");
            }
            for (allocation, fill, _) in &live {
                let handle = memory.get_storage(allocation).unwrap();
                prop_assert!(holds(&mut memory, &handle, *fill));
            }
        }
        memory.cleanup(Cleanup::Explicit);
        prop_assert_eq!(memory.awaiting_users(), 0);
    }
}

/// Reserve `count` MiB, record `users(i)` as using the `i`th, drop them
/// all and flush (the device `lag` flushes behind, so no fence passes
/// yet); then one reservation's poll: the events it queried. Checks that
/// every fence passes once the device caught up.
fn events_one_poll_asks(count: u8, users: impl Fn(usize) -> Vec<UserStream>) -> u64 {
    let mut memory = manager(3);
    let used: Vec<Allocation> = (0..count)
        .map(|byte| filled(&mut memory, MIB, byte))
        .collect();
    for (at, allocation) in used.iter().enumerate() {
        for user in users(at) {
            memory.record_use(allocation, user).unwrap();
        }
    }
    drop(used);
    memory.flush();
    assert_eq!(memory.awaiting_users(), usize::from(count));
    let before = memory.storage().driver_ops().events_queried;
    let next = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    let asked = memory.storage().driver_ops().events_queried - before;
    assert_eq!(
        memory.awaiting_users(),
        usize::from(count),
        "nothing passed yet"
    );
    drop(next);
    for _ in 0..4 {
        memory.flush();
    }
    assert_eq!(memory.awaiting_users(), 0, "every fence passed");
    asked
}

/// Fences on the same streams pass in the order they were recorded, so a
/// poll asks the oldest waiting one and no later one while it has not
/// passed.
#[test]
fn a_poll_asks_no_fence_behind_one_not_passed_on_the_same_streams() {
    // One query for the eight (it was eight, one each).
    let asked = events_one_poll_asks(8, |_| vec![OTHER]);
    assert_eq!(asked, 1, "a fence behind one not passed was asked");
}

/// Fences on other streams are not held back by one that has not passed:
/// a poll asks the oldest waiting on each set of streams.
#[test]
fn a_fence_not_passed_holds_back_only_the_fences_on_the_same_streams() {
    const THIRD: UserStream = UserStream(8);
    let asked = events_one_poll_asks(6, |at| match at {
        5 => vec![THIRD, OTHER],
        at if at % 2 == 0 => vec![OTHER],
        _ => vec![THIRD],
    });
    // The oldest on 7, the oldest on 8, and the one on 8 and 7 (whose
    // first event, not passed, ends its asking): one query a set of
    // streams, where it was one an allocation (six).
    assert_eq!(asked, 3, "one fence asked per set of streams");
}

/// A reservation the room held serves asks no fence: only one that would
/// otherwise grow (or a cleanup point) asks whether what waits for other
/// streams is free. The bytes are the same: nothing grows while a fence
/// that passed holds room.
#[test]
fn only_a_reservation_that_would_grow_asks_the_fences() {
    let mut memory = manager(0);
    let room: Vec<_> = (0..4u8).map(|i| filled(&mut memory, MIB, i)).collect();
    let used = filled(&mut memory, MIB, 9);
    memory.record_use(&used, OTHER).unwrap();
    drop(room);
    drop(used);
    memory.process_releases();
    // The device's work passes the fence (the storage's flush alone: the
    // manager asks nothing).
    memory.storage().flush();
    assert_eq!(memory.awaiting_users(), 1, "passed, not asked yet");
    let reserved = memory.bytes_reserved();
    let asked =
        |memory: &mut MemoryManager<HostStorage>| memory.storage().driver_ops().events_queried;
    let mut held = Vec::new();
    loop {
        let free = memory.bytes_reserved() - memory.bytes_in_use();
        let before = asked(&mut memory);
        held.push(filled(&mut memory, MIB, 5));
        if free >= MIB {
            assert_eq!(
                asked(&mut memory),
                before,
                "served from the room held: no query"
            );
            assert_eq!(memory.awaiting_users(), 1);
            continue;
        }
        // This one would grow: the fence is asked first, and the memory
        // it held serves.
        assert!(asked(&mut memory) > before);
        assert_eq!(memory.awaiting_users(), 0);
        assert_eq!(memory.bytes_reserved(), reserved, "nothing grew");
        break;
    }
    assert!(held.len() >= 5);
}
