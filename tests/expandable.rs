//! Expandable arenas on host memory with real bytes: what is mapped is what
//! is reserved, free granules go back at cleanup points and before growth,
//! and compaction before growth moves bytes intact, never a pinned one.

mod common;

use common::{KIB, MIB};
use std::sync::Arc;
use streamalloc::memory::{
    Allocation, Cleanup, DeviceProperties, MemoryConfig, MemoryConfiguration, MemoryError,
    MemoryManager, PageUpdate, PoolKind, RelocationReason,
};
use streamalloc::service::StreamStats;
use streamalloc::storage::{
    BudgetedStorage, DeviceBudget, DeviceStorage, HOST_GRANULE, HostStorage, StorageError,
    VirtualStorage,
};

type Memory = MemoryManager<HostStorage>;

/// Reservations a free granule of the default layout stays mapped.
fn expandable_period() -> u64 {
    let pools = MemoryConfiguration::Expandable.pools(&DeviceProperties::default());
    pools[0]
        .dealloc_period
        .expect("the default layout unmaps idle granules")
}

/// The free room a default manager keeps mapped: one byte in this many.
fn default_slack() -> u64 {
    MemoryConfig::default()
        .free_slack_one_in
        .expect("on by default")
}

fn memory() -> Memory {
    MemoryManager::new(HostStorage::new(), MemoryConfig::default())
}

/// A manager that trims its free room after every reservation and gives
/// back all a relocation frees (`keep_peak_mapped` off: what every release
/// before it was the default did), for the tests of that mechanism.
fn trimming() -> Memory {
    MemoryManager::new(
        HostStorage::new(),
        MemoryConfig {
            keep_peak_mapped: false,
            ..MemoryConfig::default()
        },
    )
}

/// A manager that keeps no slack to trim to: free granules wait for the
/// period (the sweep's own tests).
fn untrimmed() -> Memory {
    MemoryManager::new(
        HostStorage::new(),
        MemoryConfig {
            free_slack_one_in: None,
            keep_peak_mapped: false,
            ..MemoryConfig::default()
        },
    )
}

/// Eight 1 MiB allocations packed in four granules, each filled with its
/// own byte.
fn eight(memory: &mut Memory) -> Vec<Allocation> {
    assert_eq!(
        HOST_GRANULE,
        2 * MIB,
        "the layout below assumes 2 MiB granules"
    );
    (0..8u8)
        .map(|i| {
            let a = memory.reserve(MIB, PageUpdate::Allow).unwrap();
            memory.write(&a, 0, &vec![i + 1; MIB as usize]).unwrap();
            a
        })
        .collect()
}

/// Take the pool's high-water mark of bytes in use [`HEADROOM`] higher
/// while nothing lies free (see [`laid_out_below`]).
fn raise_high_water(memory: &mut Memory) {
    drop(memory.reserve(HEADROOM, PageUpdate::Allow).unwrap());
    memory.cleanup(Cleanup::Explicit);
}

fn assert_holds(memory: &mut Memory, a: &Allocation, byte: u8) {
    let bytes = memory.read(a, 0, MIB).unwrap();
    assert!(
        bytes.iter().all(|&b| b == byte),
        "allocation of {byte} lost its bytes"
    );
}

/// Allocations of `sizes` laid out in order, the `i`th filled with byte
/// `i + 1`; those at `gaps` dropped and their releases taken.
fn laid_out<S: DeviceStorage>(
    memory: &mut MemoryManager<S>,
    sizes: &[u64],
    gaps: &[usize],
) -> Vec<Option<Allocation>> {
    laid_out_below(memory, sizes, gaps, 0)
}

/// [`laid_out`], the pool's high-water mark of bytes in use first taken
/// `headroom` higher (an allocation above the others, dropped and
/// unmapped with the gaps' free granules): a growth that stays below the
/// mark is served by the planners, one past it evacuates the pool first
/// (`a_growth_past_the_high_water_mark_compacts_the_whole_pool_first`).
fn laid_out_below<S: DeviceStorage>(
    memory: &mut MemoryManager<S>,
    sizes: &[u64],
    gaps: &[usize],
    headroom: u64,
) -> Vec<Option<Allocation>> {
    let mut all: Vec<Option<Allocation>> = sizes
        .iter()
        .zip(1u8..)
        .map(|(&bytes, byte)| {
            let a = memory.reserve(bytes, PageUpdate::Allow).unwrap();
            memory.write(&a, 0, &vec![byte; bytes as usize]).unwrap();
            Some(a)
        })
        .collect();
    if headroom > 0 {
        // Nothing lies free yet, so this growth past the mark moves nothing.
        drop(memory.reserve(headroom, PageUpdate::Allow).unwrap());
    }
    for &gap in gaps {
        all[gap] = None;
    }
    memory.process_releases();
    if headroom > 0 {
        memory.cleanup(Cleanup::Explicit);
    }
    all
}

/// Room below the high-water mark for the growths of the planners' tests.
const HEADROOM: u64 = 8 * MIB;

/// Every allocation of [`laid_out`] still left holds its byte throughout.
fn assert_all_hold<S: DeviceStorage>(memory: &mut MemoryManager<S>, all: &[Option<Allocation>]) {
    for (a, byte) in all.iter().zip(1u8..) {
        if let Some(a) = a {
            let bytes = memory.read(a, 0, a.size()).unwrap();
            assert!(bytes.iter().all(|&b| b == byte), "allocation {byte}");
        }
    }
}

#[test]
fn the_default_layout_maps_granules_and_reserves_what_it_maps() {
    let mut memory = memory();
    let report = memory.memory_report();
    assert!(matches!(
        report.dynamic[0].kind,
        PoolKind::Expandable { .. }
    ));
    let all = eight(&mut memory);
    assert_eq!(memory.bytes_reserved(), 8 * MIB);
    assert_eq!(
        memory.bytes_allocated(),
        8 * MIB,
        "the storage maps as much"
    );
    assert!(memory.memory_report().dynamic[0].address_space >= 8 * MIB);
    drop(all);
    // Releases free no memory by themselves: the cleanup point does.
    memory.process_releases();
    assert_eq!(memory.bytes_reserved(), 8 * MIB);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_reserved(), 0);
    assert_eq!(memory.bytes_allocated(), 0);
}

#[test]
fn a_growth_unmaps_free_granules_first() {
    let mut memory = memory();
    let mut all = eight(&mut memory);
    // The last four free two whole granules.
    all.truncate(4);
    memory.process_releases();
    // Three more mebibytes than the room held: the two free granules go back
    // before one is mapped for it (it lands in the freed room anyway).
    let big = memory.reserve(5 * MIB, PageUpdate::Allow).unwrap();
    assert!(
        memory.bytes_reserved() <= 10 * MIB,
        "{}",
        memory.bytes_reserved()
    );
    memory.write(&big, 0, &[9; 16]).unwrap();
    for (i, a) in all.iter().enumerate() {
        assert_holds(&mut memory, a, i as u8 + 1);
    }
    assert_eq!(memory.bytes_reserved(), memory.bytes_allocated());
}

#[test]
fn compaction_before_growth_moves_bytes_intact_instead_of_mapping() {
    let mut memory = memory();
    let mut all: Vec<Option<Allocation>> = eight(&mut memory).into_iter().map(Some).collect();
    raise_high_water(&mut memory);
    // Holes of 1 MiB at 1, 3 and 5 MiB: three free mebibytes, no two together.
    for i in [1, 3, 5] {
        all[i] = None;
    }
    memory.process_releases();
    let reserved = memory.bytes_reserved();
    let two = memory.reserve(2 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(
        memory.bytes_reserved(),
        reserved,
        "served by moving, not mapping"
    );
    let (moved, bytes) = memory.moved_before_growth();
    assert_eq!((moved, bytes), (1, MIB));
    memory.write(&two, 0, &[0xAB; 2 * MIB as usize]).unwrap();
    for (i, a) in all.iter().enumerate() {
        if let Some(a) = a {
            assert_holds(&mut memory, a, i as u8 + 1);
        }
    }
    assert!(
        memory
            .read(&two, 0, 2 * MIB)
            .unwrap()
            .iter()
            .all(|&b| b == 0xAB)
    );
}

/// In MiB: keep 1, gap .5, small .5, big 1, keep 1, gap .5, keep 2,
/// gap .5, keep 2, gap .5, keep .5: five granules, full, with four
/// half-MiB holes no two of which touch, below the high-water mark.
fn small_holes(memory: &mut Memory) -> Vec<Option<Allocation>> {
    let layout = [1.0, 0.5, 0.5, 1.0, 1.0, 0.5, 2.0, 0.5, 2.0, 0.5, 0.5];
    let sizes: Vec<u64> = layout.iter().map(|mib| (mib * MIB as f64) as u64).collect();
    let all = laid_out_below(memory, &sizes, &[1, 5, 7, 9], HEADROOM);
    assert_eq!(memory.bytes_reserved(), 10 * MIB);
    all
}

#[test]
fn nothing_moves_unless_everything_on_the_window_has_somewhere_to_go() {
    let mut memory = memory();
    let all = small_holes(&mut memory);
    let reserved = memory.bytes_reserved();
    // The two keeps of 2 MiB are pinned, so no slide can gather the holes
    // above the big one. The cheapest window for 1.5 MiB is gap, small,
    // big: the small one would fit in another gap, the big one in none.
    // Moving the small one would be in vain, so nothing moves and a
    // granule is mapped.
    let pins = [6, 8].map(|i| memory.pin(all[i].as_ref().unwrap()).unwrap());
    let wanted = memory.reserve(3 * MIB / 2, PageUpdate::Allow).unwrap();
    assert_eq!(memory.moved_before_growth(), (0, 0), "no move in vain");
    assert_eq!(memory.bytes_reserved(), reserved + HOST_GRANULE);
    drop(pins);
    memory.write(&wanted, 0, &[0xEE; 64]).unwrap();
    assert_all_hold(&mut memory, &all);
}

#[test]
fn a_growth_slides_allocations_down_to_gather_holes_too_small_for_it() {
    let mut memory = memory();
    let all = small_holes(&mut memory);
    let reserved = memory.bytes_reserved();
    // No hole holds 1.5 MiB and no window's allocations fit elsewhere, but
    // sliding the two keeps of 2 MiB down over the holes below them (each
    // overlapping itself) gathers the last three holes into one block.
    let wanted = memory.reserve(3 * MIB / 2, PageUpdate::Allow).unwrap();
    assert_eq!(
        memory.bytes_reserved(),
        reserved,
        "served by sliding, not mapping"
    );
    assert_eq!(
        memory.moved_before_growth(),
        (2, 4 * MIB),
        "the cheapest run slid"
    );
    memory
        .write(&wanted, 0, &[0xEE; 3 * MIB as usize / 2])
        .unwrap();
    assert_all_hold(&mut memory, &all);
    assert!(
        memory
            .read(&wanted, 0, 3 * MIB / 2)
            .unwrap()
            .iter()
            .all(|&b| b == 0xEE)
    );
}

/// Allocations that lie one right after another slide by the same
/// distance, so one copy moves them all: in KiB, gap 1280, three of 320,
/// gap 192, keep 1664 (two granules, full). 1400 KiB fit no hole, and no
/// window's allocations fit elsewhere; sliding the three down over the
/// first gap gathers 1472 above them, with one device copy where each
/// alone took one.
#[test]
fn allocations_side_by_side_slide_in_one_copy() {
    let mut memory = memory();
    let sizes = [1280, 320, 320, 320, 192, 1664].map(|kib| kib * KIB);
    let all = laid_out(&mut memory, &sizes, &[0, 4]);
    let reserved = memory.bytes_reserved();
    let copies = memory.memory_report().driver.copies;
    let wanted = memory.reserve(1400 * KIB, PageUpdate::Allow).unwrap();
    assert_eq!(memory.memory_report().driver.copies - copies, 1);
    assert_eq!(memory.moved_before_growth(), (3, 960 * KIB));
    assert_eq!(memory.bytes_reserved(), reserved, "served by sliding");
    memory
        .write(&wanted, 0, &[0xEE; 1400 * KIB as usize])
        .unwrap();
    assert_all_hold(&mut memory, &all);
}

#[test]
fn a_pinned_address_stays_valid_while_its_neighbours_slide() {
    let mut memory = memory();
    let all = small_holes(&mut memory);
    // The keep of 2 MiB at the top stays pinned: the cheapest run that does
    // not cross it is the lower keep's alone, which gathers only two holes;
    // a run from the small one up to it gathers three.
    let pinned = memory.pin(all[8].as_ref().unwrap()).unwrap();
    let address = pinned.addr();
    let wanted = memory.reserve(3 * MIB / 2, PageUpdate::Allow).unwrap();
    // SAFETY: the pin keeps the allocation's bytes at this host address.
    let first = unsafe { *(address as *const u8) };
    assert_eq!(first, 9, "the pinned bytes are where the pin says");
    assert_eq!(pinned.addr(), address);
    assert_eq!(
        memory.moved_before_growth(),
        (4, 9 * MIB / 2),
        "the run below the pin slid"
    );
    drop(pinned);
    memory.write(&wanted, 0, &[0xEE; 64]).unwrap();
    assert_all_hold(&mut memory, &all);
}

#[test]
fn a_pinned_allocation_stays_put_while_others_move_around_it() {
    let mut memory = memory();
    let mut all: Vec<Option<Allocation>> = eight(&mut memory).into_iter().map(Some).collect();
    raise_high_water(&mut memory);
    for i in [1, 3, 5] {
        all[i] = None;
    }
    memory.process_releases();
    // The cheapest window would move the allocation after the first hole.
    let pinned = memory.pin(all[2].as_ref().unwrap()).unwrap();
    let address = pinned.addr();
    let reserved = memory.bytes_reserved();
    let two = memory.reserve(2 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(
        memory.bytes_reserved(),
        reserved,
        "another window was cleared"
    );
    assert_eq!(memory.moved_before_growth().0, 1);
    // SAFETY: the pin keeps the allocation's bytes at this host address.
    let first = unsafe { *(address as *const u8) };
    assert_eq!(first, 3, "the pinned bytes are where the pin says");
    drop(pinned);
    for (i, a) in all.iter().enumerate() {
        if let Some(a) = a {
            assert_holds(&mut memory, a, i as u8 + 1);
        }
    }
    drop(two);
}

#[test]
fn page_updates_that_keep_addresses_never_move() {
    let mut memory = memory();
    let mut all: Vec<Option<Allocation>> = eight(&mut memory).into_iter().map(Some).collect();
    for i in [1, 3, 5] {
        all[i] = None;
    }
    memory.process_releases();
    let _two = memory.reserve(2 * MIB, PageUpdate::AddOnly).unwrap();
    assert_eq!(
        memory.moved_before_growth().0,
        0,
        "AddOnly keeps every address"
    );
    assert!(memory.bytes_reserved() > 8 * MIB, "it mapped instead");
}

#[test]
fn a_storage_without_virtual_memory_gets_the_adaptive_arena() {
    let storage = VirtualStorage::with_granule(None);
    assert_eq!(storage.granule(), None);
    let mut memory = MemoryManager::new(storage, MemoryConfig::default());
    let _a = memory.reserve(3 * MIB, PageUpdate::Allow).unwrap();
    let report = memory.memory_report();
    assert!(
        matches!(report.dynamic[0].kind, PoolKind::Adaptive { .. }),
        "{:?}",
        report.dynamic[0].kind
    );
}

/// Keeps allocations 0, 3 and 7 of [`eight`]: granule 2 lies free, and
/// granules 1 and 3 are kept mapped by one allocation each.
fn three_left(memory: &mut Memory) -> Vec<(Allocation, u8)> {
    let kept: Vec<(Allocation, u8)> = eight(memory)
        .into_iter()
        .zip(1u8..)
        .filter(|(_, byte)| [1, 4, 8].contains(byte))
        .collect();
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_reserved(), 6 * MIB, "granule 2 unmapped");
    kept
}

#[test]
fn a_relocation_moves_allocations_down_out_of_granules_they_alone_keep() {
    let mut memory = trimming();
    let kept = three_left(&mut memory);
    let report = memory.compact().unwrap();
    // The top one moves into the hole after the first; the middle one has
    // no room below its granule and stays.
    assert_eq!((report.moved, report.bytes_moved), (1, MIB), "{report:?}");
    assert_eq!(memory.bytes_reserved(), 4 * MIB, "granule 3 unmapped");
    assert_eq!(memory.bytes_reserved(), memory.bytes_allocated());
    for (a, byte) in &kept {
        assert_holds(&mut memory, a, *byte);
    }
    let again = memory.compact().unwrap();
    assert_eq!(again.moved, 0, "nothing more pays: {again:?}");
}

#[test]
fn a_pinned_allocation_is_left_where_it_is_and_the_next_one_moves() {
    let mut memory = trimming();
    let kept = three_left(&mut memory);
    let pinned = memory.pin(&kept[2].0).unwrap();
    let address = pinned.addr();
    let report = memory.compact().unwrap();
    // The middle one moves instead, into the hole in granule 0.
    assert_eq!(report.moved, 1, "{report:?}");
    assert_eq!(memory.bytes_reserved(), 4 * MIB, "granule 1 unmapped");
    // SAFETY: the pin keeps the allocation's bytes at this host address.
    let first = unsafe { *(address as *const u8) };
    assert_eq!(first, 8, "the pinned bytes are where the pin says");
    drop(pinned);
    for (a, byte) in &kept {
        assert_holds(&mut memory, a, *byte);
    }
}

#[test]
fn a_relocation_for_outdated_pages_moves_nothing() {
    let mut memory = memory();
    let _kept = three_left(&mut memory);
    let report = memory.relocate(RelocationReason::Outdated).unwrap();
    assert_eq!(report.moved, 0);
    assert_eq!(memory.bytes_reserved(), 6 * MIB);
}

#[test]
fn a_growth_nothing_could_spare_evacuates_first() {
    let mut memory = memory();
    let quarter = MIB / 4;
    // Granules 0 and 1: 1.75 MiB kept, a quarter free; granule 2: a quarter
    // kept, the rest free. Too little free for a window of 4 MiB.
    let sizes = [7 * quarter, quarter, 7 * quarter, quarter, quarter];
    let all = laid_out(&mut memory, &sizes, &[1, 3]);
    assert_eq!(memory.bytes_reserved(), 6 * MIB);
    // The quarter alone in granule 2 moves into granule 0's free quarter;
    // granule 2 is then free and goes back before the growth, which maps
    // two granules from the end of granule 1 on: 8 MiB, not 10.
    let big = memory.reserve(4 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(memory.moved_before_growth(), (1, quarter));
    assert_eq!(memory.bytes_reserved(), 8 * MIB);
    memory
        .write(&big, 0, &vec![0xBB; (4 * MIB) as usize])
        .unwrap();
    assert_all_hold(&mut memory, &all);
}

#[test]
fn allocations_that_share_the_top_granule_leave_it_together() {
    let mut memory = trimming();
    let (half, quarter) = (MIB / 2, MIB / 4);
    // Granules 0 and 1: 1.5 MiB kept, half a MiB free; granule 2: two
    // quarters kept. Neither quarter frees granule 2 alone; both do.
    let sizes = [3 * half, half, 3 * half, half, quarter, quarter];
    let all = laid_out(&mut memory, &sizes, &[1, 3]);
    assert_eq!(memory.bytes_reserved(), 6 * MIB);
    let report = memory.compact().unwrap();
    assert_eq!((report.moved, report.bytes_moved), (2, half), "{report:?}");
    assert_eq!(memory.bytes_reserved(), 4 * MIB, "granule 2 unmapped");
    assert_all_hold(&mut memory, &all);
}

#[test]
fn a_relocation_slides_what_no_hole_can_take_and_gives_back_the_granule_gathered() {
    let mut memory = trimming();
    let all = small_holes(&mut memory);
    // Four half-MiB holes: no granule lies free and nothing above a hole
    // fits in another, so only sliding every allocation above the first
    // hole down gathers them, into the top granule.
    let report = memory.compact().unwrap();
    assert_eq!(
        memory.bytes_reserved(),
        8 * MIB,
        "the top granule went back: {report:?}"
    );
    assert_eq!(memory.bytes_reserved(), memory.bytes_allocated());
    assert_all_hold(&mut memory, &all);
    let again = memory.compact().unwrap();
    assert_eq!(again.moved, 0, "packed: nothing more pays: {again:?}");
}

#[test]
fn a_growth_slides_across_a_gap_it_maps_when_that_maps_less_than_growing() {
    let mut memory = memory();
    // In MiB: 1.5, 2.5, 2, 1.5, .5 in four granules; the 2.5 and the
    // second 1.5 go, and the granule 2..4 the first hole holds whole is
    // unmapped: a gap between two segments, each with a partial edge.
    let sizes = [3 * MIB / 2, 5 * MIB / 2, 2 * MIB, 3 * MIB / 2, MIB / 2];
    let all = laid_out_below(&mut memory, &sizes, &[1, 3], HEADROOM);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_reserved(), 6 * MIB);
    // 3 MiB fits no hole, and mapping for it would take two granules at the
    // top. Mapping the gap's one granule and sliding the 2 MiB allocation
    // down across it gathers 4 MiB above it.
    let wanted = memory.reserve(3 * MIB, PageUpdate::Allow).unwrap();
    assert_eq!(memory.bytes_reserved(), 8 * MIB, "one granule, not two");
    assert_eq!(memory.moved_before_growth(), (1, 2 * MIB));
    memory.write(&wanted, 0, &[0xEE; 3 * MIB as usize]).unwrap();
    assert_all_hold(&mut memory, &all);
    assert!(
        memory
            .read(&wanted, 0, 3 * MIB)
            .unwrap()
            .iter()
            .all(|&b| b == 0xEE)
    );
}

/// a .5, b 3.5, f 1, c 2, g 1 and 4 MiB in MiB, all but a and c dropped
/// and the free granules unmapped: a at 0..0.5, a gap at 2..4, c at 5..7
/// across two granules, a high-water mark of 12 MiB.
fn gap_below_the_high_water_mark<S: DeviceStorage>(
    memory: &mut MemoryManager<S>,
) -> Vec<Option<Allocation>> {
    let sizes = [MIB / 2, 7 * MIB / 2, MIB, 2 * MIB, MIB, 4 * MIB];
    let all = laid_out(memory, &sizes, &[1, 2, 4, 5]);
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_reserved(), 6 * MIB);
    all
}

#[test]
fn a_relocation_slides_across_a_gap_below_the_high_water_mark() {
    let mut memory = trimming();
    // In MiB: a .5, b 3.5, f 1, c 2, g 1, then 4 more to raise the high-water
    // mark to 12; all but a and c go. The granule 2..4 and the top ones are
    // unmapped: a at 0..0.5, a gap, c at 5..7 across two granules. No hole
    // below holds c, but sliding it down across the gap (mapped first: the
    // pool has been that large) packs both into two granules.
    let all = gap_below_the_high_water_mark(&mut memory);
    let report = memory.compact().unwrap();
    assert_eq!(
        (report.moved, report.bytes_moved),
        (1, 2 * MIB),
        "{report:?}"
    );
    assert_eq!(memory.bytes_reserved(), 4 * MIB, "two granules, not three");
    assert_eq!(memory.bytes_reserved(), memory.bytes_allocated());
    assert_all_hold(&mut memory, &all);
}

#[test]
fn a_stream_asked_to_give_back_maps_no_gap_to_do_it() {
    // The same layout, relocated because the device is short (or past its
    // headroom): mapping the gap, even for a moment, is memory the device
    // does not have to spare, however large this pool once was.
    let mut memory = memory();
    let all = gap_below_the_high_water_mark(&mut memory);
    let report = memory.relocate(RelocationReason::Short).unwrap();
    assert_eq!(report.moved, 0, "{report:?}");
    assert_eq!(memory.bytes_reserved(), 6 * MIB);
    assert_eq!(memory.memory_report().peak_bytes_reserved, 12 * MIB);
    assert_all_hold(&mut memory, &all);
}

#[test]
fn a_relocation_maps_no_gap_when_the_streams_share_a_budget() {
    // Whether the mapping succeeded would depend on what the other streams
    // hold at that moment: a replay's figures would depend on timing.
    let budget = Arc::new(DeviceBudget::new(64 * MIB));
    let storage = BudgetedStorage::new(HostStorage::new(), budget);
    let mut memory = MemoryManager::new(storage, MemoryConfig::default());
    let all = gap_below_the_high_water_mark(&mut memory);
    let report = memory.compact().unwrap();
    assert_eq!(report.moved, 0, "{report:?}");
    assert_eq!(memory.bytes_reserved(), 6 * MIB);
    assert_all_hold(&mut memory, &all);
}

#[test]
fn a_growth_past_the_high_water_mark_compacts_the_whole_pool_first() {
    let mut memory = memory();
    let (half, quarter) = (MIB / 2, MIB / 4);
    // In MiB: a 1.5, x .5 | b .5, y 1.5 | c .5, z 1.5, six in use at the
    // high-water mark; x, y and z go. Holes of .5, 1.5 and 1.5, no whole
    // granule free.
    let sizes = [3 * half, half, half, 3 * half, half, 3 * half];
    let all = laid_out(&mut memory, &sizes, &[1, 3, 5]);
    assert_eq!(memory.bytes_reserved(), 6 * MIB);
    // 1.75 MiB fits no hole, and a growth would take the pool to 8 MiB,
    // past its high-water mark: the pool is evacuated first. c, alone in
    // the top granule, moves into the hole after a, and the room above b
    // becomes one block of 3.5 MiB that serves the reservation. (Room for
    // this reservation alone, as the planners find it below the mark, cost
    // three moves here and left the rest of the holes apart.)
    let first = memory.reserve(7 * quarter, PageUpdate::Allow).unwrap();
    assert_eq!(memory.moved_before_growth(), (1, half));
    assert_eq!(memory.bytes_reserved(), 6 * MIB, "nothing mapped");
    // So the next one fits as well, with nothing moved or mapped.
    let second = memory.reserve(7 * quarter, PageUpdate::Allow).unwrap();
    assert_eq!(memory.moved_before_growth(), (1, half));
    assert_eq!(memory.bytes_reserved(), 6 * MIB);
    for (a, byte) in [(&first, 0xF1u8), (&second, 0xF2)] {
        memory.write(a, 0, &vec![byte; a.size() as usize]).unwrap();
    }
    assert_all_hold(&mut memory, &all);
    for (a, byte) in [(&first, 0xF1u8), (&second, 0xF2)] {
        let bytes = memory.read(a, 0, a.size()).unwrap();
        assert!(bytes.iter().all(|&b| b == byte));
    }
}

/// A forward pass of 64 activations of 2 MiB, each filled with its byte,
/// then the backward pass: each step's gradient is taken, then the step's
/// activation and the gradient are freed. The free room grows down and is
/// merged, carved and merged again at every step, so no free block stays
/// the same block; what lies at its top was let go long ago.
fn training_pass(memory: &mut Memory) {
    let mut activations: Vec<_> = (0..64u8)
        .map(|i| {
            let a = memory.reserve(2 * MIB, PageUpdate::Allow).unwrap();
            memory.write(&a, 0, &[i; 64]).unwrap();
            a
        })
        .collect();
    while let Some(activation) = activations.pop() {
        let gradient = memory.reserve(2 * MIB, PageUpdate::Allow).unwrap();
        memory.write(&gradient, 0, &[0xFF; 64]).unwrap();
        let byte = activations.len() as u8;
        assert_eq!(memory.read(&activation, 0, 64).unwrap(), vec![byte; 64]);
        drop((activation, gradient));
    }
}

#[test]
fn granules_idle_for_a_period_go_back_while_the_blocks_around_them_churn() {
    let period = expandable_period();
    let mut memory = untrimmed();
    training_pass(&mut memory);
    // At its last call the stream holds what it let go within a period
    // (and the sweep's spacing), not the whole pass.
    let recent = (period + period / 4 + 2) * 2 * MIB;
    assert!(
        memory.bytes_reserved() <= recent,
        "{} MiB still mapped",
        memory.bytes_reserved() / MIB
    );
    assert_eq!(memory.bytes_reserved(), memory.bytes_allocated());
}

#[test]
fn a_manager_alone_gives_back_what_its_stream_let_go_at_its_next_reservation() {
    let slack_one_in = default_slack();
    let mut memory = trimming();
    let kept: Vec<Allocation> = (0..8)
        .map(|_| memory.reserve(4 * MIB, PageUpdate::Allow).unwrap())
        .collect();
    // The end of a backward pass: 96 MiB of activations let go at once,
    // then the stream's last call before another stream's turn.
    let activations: Vec<Allocation> = (0..24)
        .map(|i| {
            let a = memory.reserve(4 * MIB, PageUpdate::Allow).unwrap();
            memory.write(&a, 0, &[i; 64]).unwrap();
            a
        })
        .collect();
    drop(activations);
    let last = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    // What it holds free now is its slack (and a granule past it), not the
    // 96 MiB: a period's wait would keep them mapped until its next call.
    let in_use = memory.bytes_in_use();
    let slack = (in_use / slack_one_in).max(HOST_GRANULE);
    assert!(
        memory.bytes_reserved() <= in_use + slack + HOST_GRANULE,
        "{} MiB mapped for {} MiB in use",
        memory.bytes_reserved() / MIB,
        in_use / MIB
    );
    assert_eq!(memory.bytes_reserved(), memory.bytes_allocated());
    for a in kept.iter().chain([&last]) {
        memory.write(a, 0, &[7; 64]).unwrap();
        assert_eq!(memory.read(a, 0, 64).unwrap(), vec![7; 64]);
    }
}

#[test]
fn a_service_stream_gives_back_what_it_let_go_at_its_next_reservation() {
    use streamalloc::clock::ManualClock;
    use streamalloc::memory::StreamId;
    let slack_one_in = default_slack();
    use streamalloc::service::{ServiceConfig, Supervisor};
    // No policy and no idle tick: only the stream's own trim can give
    // the room back before the period.
    let device = Supervisor::host(ServiceConfig {
        clock: ManualClock::shared(),
        idle_tick: None,
        headroom: None,
        settle: None,
        memory: MemoryConfig {
            keep_peak_mapped: false,
            ..MemoryConfig::default()
        },
        ..ServiceConfig::default()
    });
    let stream = device.stream(StreamId(0)).unwrap();
    let kept: Vec<Allocation> = (0..8).map(|_| stream.reserve(4 * MIB).unwrap()).collect();
    let activations: Vec<Allocation> = (0..24).map(|_| stream.reserve(4 * MIB).unwrap()).collect();
    drop(activations);
    let last = stream.reserve(MIB).unwrap();
    let in_use = 33 * MIB;
    let slack = (in_use / slack_one_in).max(HOST_GRANULE);
    let reserved = device.device_stats().bytes_reserved;
    assert!(
        reserved <= in_use + slack + HOST_GRANULE,
        "{} MiB reserved for {} MiB in use",
        reserved / MIB,
        in_use / MIB
    );
    drop((kept, last));
    device.shutdown();
}

/// A decode step's activations, `4 * period` times: 8 MiB freed and wanted
/// again every few reservations, never idle for a period.
fn decode_steps(memory: &mut Memory, period: u64) {
    for _ in 0..4 * period {
        drop(memory.reserve(8 * MIB, PageUpdate::Allow).unwrap());
        small_reservations(memory, period / 4);
    }
}

/// `count` reservations of 256 bytes, each dropped at once.
fn small_reservations(memory: &mut Memory, count: u64) {
    for _ in 0..count {
        drop(memory.reserve(256, PageUpdate::Allow).unwrap());
    }
}

#[test]
fn a_granule_wanted_again_within_the_period_stays_mapped() {
    let period = expandable_period();
    let mut memory = untrimmed();
    let held = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    decode_steps(&mut memory, period);
    assert_eq!(memory.bytes_reserved(), 10 * MIB, "nothing was given back");
    // Left alone a period, it goes.
    small_reservations(&mut memory, 2 * period);
    assert_eq!(memory.bytes_reserved(), 2 * MIB);
    assert_holds_first(&mut memory, &held);
}

/// A manager that keeps free granules mapped up to its peak
/// (`MemoryConfig::keep_peak_mapped`), with `slack_one_in` as its slack.
fn keeping(slack_one_in: Option<u64>) -> Memory {
    MemoryManager::new(
        HostStorage::new(),
        MemoryConfig {
            keep_peak_mapped: true,
            free_slack_one_in: slack_one_in,
            ..MemoryConfig::default()
        },
    )
}

/// Granules the pool has mapped so far (what a device's driver created).
fn granules_mapped(memory: &mut Memory) -> u64 {
    memory.storage().driver_ops().granules_mapped()
}

#[test]
fn a_second_pass_to_the_same_peak_maps_nothing() {
    let mut memory = keeping(None);
    training_pass(&mut memory);
    let (mapped, peak) = (granules_mapped(&mut memory), memory.bytes_reserved());
    // The room the pass needed stays mapped, however long it sits free...
    small_reservations(&mut memory, 4 * expandable_period());
    assert_eq!(memory.bytes_reserved(), peak, "kept for the next pass");
    // ... so the next pass to the same peak maps nothing.
    training_pass(&mut memory);
    assert_eq!(
        granules_mapped(&mut memory),
        mapped,
        "no granule mapped again"
    );
    assert_eq!(memory.bytes_reserved(), peak);
    // Asked (a give-back, a settle, the caller), it goes.
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_reserved(), 0);
    assert_eq!(memory.bytes_reserved(), memory.bytes_allocated());
}

#[test]
fn a_manager_alone_keeps_the_room_its_peak_needed_and_no_more() {
    let slack_one_in = default_slack();
    let mut memory = keeping(Some(default_slack()));
    let kept: Vec<Allocation> = (0..8)
        .map(|_| memory.reserve(4 * MIB, PageUpdate::Allow).unwrap())
        .collect();
    // The end of a backward pass: 96 MiB of activations let go at once.
    let activations = |memory: &mut Memory| -> Vec<Allocation> {
        (0..24)
            .map(|i| {
                let a = memory.reserve(4 * MIB, PageUpdate::Allow).unwrap();
                memory.write(&a, 0, &[i; 64]).unwrap();
                a
            })
            .collect()
    };
    drop(activations(&mut memory));
    let peak = 128 * MIB;
    let last = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    // What it holds is what its peak needed, with the peak's slack: no more.
    let slack = (peak / slack_one_in).max(HOST_GRANULE);
    assert!(
        memory.bytes_reserved() <= peak + slack,
        "{} MiB mapped for a peak of {} MiB",
        memory.bytes_reserved() / MIB,
        peak / MIB
    );
    for a in kept.iter().chain([&last]) {
        memory.write(a, 0, &[7; 64]).unwrap();
        assert_eq!(memory.read(a, 0, 64).unwrap(), vec![7; 64]);
    }
    // The next pass to the same peak maps nothing.
    drop(last);
    let mapped = granules_mapped(&mut memory);
    drop(activations(&mut memory));
    assert_eq!(granules_mapped(&mut memory), mapped);
    assert_eq!(memory.bytes_reserved(), memory.bytes_allocated());
}

/// Stream 0 keeps the room of its 128 MiB peak, then stream 1 needs as
/// much: the room goes to stream 1 before the device maps its own. With
/// `lend`, stream 0 serves stream 1 from it; without, it gives it back for
/// stream 1 to map. The figures after: stream 0's reserved bytes before,
/// and both streams' stats.
fn room_kept_for_a_peak_serves_another(lend: bool) -> (u64, StreamStats, StreamStats) {
    use streamalloc::clock::ManualClock;
    use streamalloc::memory::StreamId;
    use streamalloc::service::{ServiceConfig, Supervisor};
    // The default headroom; no settle and no idle tick: only the headroom's
    // round can win back the room stream 0 keeps for its peak.
    let device = Supervisor::host(ServiceConfig {
        clock: ManualClock::shared(),
        idle_tick: None,
        settle: None,
        memory: MemoryConfig {
            keep_peak_mapped: true,
            ..MemoryConfig::default()
        },
        lend_across_streams: lend,
        ..ServiceConfig::default()
    });
    let (s0, s1) = (
        device.stream(StreamId(0)).unwrap(),
        device.stream(StreamId(1)).unwrap(),
    );
    let kept: Vec<Allocation> = (0..8).map(|_| s0.reserve(4 * MIB).unwrap()).collect();
    drop(
        (0..24)
            .map(|_| s0.reserve(4 * MIB).unwrap())
            .collect::<Vec<_>>(),
    );
    // Stream 0 keeps its 96 MiB free; stream 1 now needs as much.
    let before = s0.stats().bytes_reserved;
    assert!(before >= 128 * MIB, "kept for stream 0's peak");
    let taken: Vec<Allocation> = (0..24).map(|_| s1.reserve(4 * MIB).unwrap()).collect();
    for allocation in &taken {
        s1.write(allocation, 0, &[3; 64]).unwrap();
        assert_eq!(s1.read(allocation, 0, 64).unwrap(), vec![3; 64]);
    }
    let stats = device.device_stats();
    // The device never held much more than its peak live (128 MiB): stream
    // 0's room went to stream 1 before stream 1 mapped its own.
    assert!(
        stats.peak_bytes_reserved <= 128 * MIB + 128 * MIB / 25 + 2 * HOST_GRANULE,
        "{} MiB at the peak for 128 MiB live",
        stats.peak_bytes_reserved / MIB
    );
    let figures = (before, s0.stats(), s1.stats());
    drop((kept, taken));
    device.shutdown();
    figures
}

#[test]
fn room_one_stream_keeps_for_its_peak_goes_to_another_that_grows() {
    let (before, s0, s1) = room_kept_for_a_peak_serves_another(false);
    assert!(s0.bytes_reserved < before, "stream 0 gave back");
    assert_eq!((s0.lent, s1.borrowed), (0, 0));
}

#[test]
fn room_one_stream_keeps_for_its_peak_serves_another_in_place() {
    let (before, s0, s1) = room_kept_for_a_peak_serves_another(true);
    assert_eq!(s0.bytes_reserved, before, "stream 0 kept its room");
    assert!(s1.borrowed > 0 && s0.lent == s1.borrowed, "{s0:?} {s1:?}");
    // What it lent counts in its bytes in use, not in stream 1's.
    assert!(s0.bytes_in_use >= 32 * MIB + s0.lent * 4 * MIB);
    assert!(s1.bytes_reserved < 24 * 4 * MIB);
}

#[test]
fn a_granule_wanted_again_stays_mapped_until_asked_for() {
    let period = expandable_period();
    let mut memory = keeping(None);
    let held = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    decode_steps(&mut memory, period);
    assert_eq!(memory.bytes_reserved(), 10 * MIB, "nothing was given back");
    // Left alone for periods, it stays: the stream's peak needed it.
    small_reservations(&mut memory, 2 * period);
    assert_eq!(memory.bytes_reserved(), 10 * MIB);
    // Asked, it goes.
    memory.cleanup(Cleanup::Explicit);
    assert_eq!(memory.bytes_reserved(), 2 * MIB);
    assert_holds_first(&mut memory, &held);
}

fn assert_holds_first(memory: &mut Memory, a: &Allocation) {
    memory.write(a, 0, &[7; 16]).unwrap();
    assert_eq!(memory.read(a, 0, 16).unwrap(), vec![7; 16]);
}

/// Linux's overcommit accounting is what refuses (other kernels may back
/// any map and fail at the first touch).
#[cfg(target_os = "linux")]
#[test]
fn a_map_the_host_cannot_back_is_refused_with_a_typed_error() {
    // Where the kernel backs every map, however large (overcommit policy
    // 1), there is no refusal to see.
    if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|p| p.trim() == "1") {
        eprintln!("the kernel backs every map (vm.overcommit_memory = 1): nothing to refuse");
        return;
    }
    let mut memory = MemoryManager::new(
        HostStorage::new(),
        MemoryConfig {
            device: streamalloc::memory::DeviceProperties::new(1 << 46, 256),
            ..MemoryConfig::default()
        },
    );
    let small = memory.reserve(MIB, PageUpdate::Allow).unwrap();
    memory.write(&small, 0, &[7; 16]).unwrap();
    // 32 TiB: more than any machine this runs on holds, in one map.
    let err = memory.reserve(1 << 45, PageUpdate::Allow).unwrap_err();
    assert!(
        matches!(
            err,
            MemoryError::Storage(StorageError::OutOfMemory { requested, .. }) if requested >= 1 << 45
        ),
        "a refusal, typed: {err:?}"
    );
    assert_eq!(memory.bytes_reserved(), HOST_GRANULE, "nothing more held");
    let next = memory.reserve(3 * MIB, PageUpdate::Allow).unwrap();
    memory.write(&next, 3 * MIB - 1, &[9]).unwrap();
    assert_eq!(memory.read(&small, 0, 16).unwrap(), vec![7; 16]);
}
