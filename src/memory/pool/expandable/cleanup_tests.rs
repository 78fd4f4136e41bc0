//! The periodic cleanup that runs before every reservation settles most
//! of them without a walk (`ExpandablePool::nothing_to_sweep`): these
//! check that what it passes over is only what it would not have done.

use super::ExpandablePool;
use crate::memory::config::{PoolConfig, PoolKind};
use crate::memory::pool::FreeRoom;
use crate::memory::pool::page::{Placement, Sweep, Wanted};
use crate::storage::VirtualStorage;

const GRANULE: u64 = 2 << 20;
/// A range's address space: four granules.
const RANGE: u64 = 4 * GRANULE;
/// Reservations a free granule stays mapped.
const PERIOD: u64 = 16;

/// A pool that keeps its peak mapped, with two full ranges of one
/// allocation each (slots 0 and 1), the second freed at serial 1.
fn two_ranges_one_freed() -> (ExpandablePool, VirtualStorage, Placement) {
    let kind = PoolKind::Expandable { range_size: RANGE };
    let config = PoolConfig {
        kind,
        max_alloc_size: RANGE,
        dealloc_period: Some(PERIOD),
    };
    let free_room = FreeRoom {
        slack_one_in: None,
        keep_peak: true,
    };
    let mut pool = ExpandablePool::new(kind, RANGE, GRANULE, &config, free_room);
    let mut storage = VirtualStorage::new();
    let mut grow = |pool: &mut ExpandablePool, slot| {
        let wanted = Wanted {
            size: RANGE,
            aligned: RANGE,
            slot,
        };
        pool.reserve_new_page(&mut storage, wanted).unwrap()
    };
    let kept = grow(&mut pool, 0);
    let freed = grow(&mut pool, 1);
    assert_ne!(kept.page(), freed.page(), "each fills a range of its own");
    pool.free(freed, RANGE, RANGE, 1);
    assert_eq!(pool.address_space(), 2 * RANGE);
    (pool, storage, kept)
}

fn periodic(serial: u64) -> Sweep {
    Sweep::Idle {
        serial,
        quiet: false,
    }
}

#[test]
fn a_range_a_round_emptied_goes_back_at_the_next_periodic_cleanup() {
    let (mut pool, mut storage, _kept) = two_ranges_one_freed();
    // Within its peak, nothing idle yet: nothing to do.
    assert!(!pool.cleanup(&mut storage, periodic(2)));
    assert_eq!(
        (pool.mapped(), pool.address_space()),
        (2 * RANGE, 2 * RANGE)
    );
    // A round for another stream unmaps the freed range's granules but
    // leaves its address space held.
    pool.unmap_idle_handles(&mut storage, RANGE);
    assert_eq!((pool.mapped(), pool.address_space()), (RANGE, 2 * RANGE));
    // The pool is within what it keeps, and nothing has been idle its
    // period: only the range all void can go, and it does.
    assert!(pool.cleanup(&mut storage, periodic(3)));
    assert_eq!((pool.mapped(), pool.address_space()), (RANGE, RANGE));
    assert!(!pool.cleanup(&mut storage, periodic(4)));
}

#[test]
fn a_quiet_cleanup_past_the_period_unmaps_what_sat_idle_and_its_range_goes() {
    let (mut pool, mut storage, _kept) = two_ranges_one_freed();
    let quiet = |serial| Sweep::Idle {
        serial,
        quiet: true,
    };
    // Before the period has passed nothing goes, quiet or not.
    assert!(!pool.cleanup(&mut storage, quiet(PERIOD)));
    assert_eq!(pool.mapped(), 2 * RANGE);
    // A cleanup on the way to a reservation keeps the peak mapped.
    assert!(!pool.cleanup(&mut storage, periodic(1 + PERIOD)));
    assert_eq!(pool.mapped(), 2 * RANGE);
    // An idle stream's cleanup does not: the granules idle a period are
    // unmapped, and the range they leave all void goes back with them.
    assert!(pool.cleanup(&mut storage, quiet(1 + PERIOD)));
    assert_eq!((pool.mapped(), pool.address_space()), (RANGE, RANGE));
}

#[test]
fn a_range_mapped_again_is_not_counted_as_void() {
    let (mut pool, mut storage, kept) = two_ranges_one_freed();
    pool.unmap_idle_handles(&mut storage, RANGE);
    // The freed range is all void; the next growth maps it again instead
    // of reserving a third (the void fits), and then it must stay.
    let again = pool
        .reserve_new_page(
            &mut storage,
            Wanted {
                size: GRANULE,
                aligned: GRANULE,
                slot: 2,
            },
        )
        .unwrap();
    assert_ne!(again.page(), kept.page());
    assert!(!pool.cleanup(&mut storage, periodic(3)));
    assert_eq!(
        (pool.mapped(), pool.address_space()),
        (RANGE + GRANULE, 2 * RANGE)
    );
}
