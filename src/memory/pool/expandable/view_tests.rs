//! The view a plan keeps between plans (`blocks.rs`): used again only
//! while the arena has not changed, and even then the pins are asked
//! again (a client pins without the arena knowing).

use super::ExpandablePool;
use crate::memory::config::{PoolConfig, PoolKind};
use crate::memory::pool::FreeRoom;
use crate::storage::VirtualStorage;

const GRANULE: u64 = 2 << 20;
/// A quarter of a granule.
const QUARTER: u64 = GRANULE / 4;

/// One mapped granule filled by four allocations of 512 KiB (slots 0 to
/// 3), the first and third freed: its 1 MiB of free room lies in two
/// holes, each too small for 1 MiB.
fn holed() -> (ExpandablePool, VirtualStorage) {
    let kind = PoolKind::Expandable {
        range_size: 64 * GRANULE,
    };
    let config = PoolConfig {
        kind,
        max_alloc_size: 64 * GRANULE,
        dealloc_period: None,
    };
    let free_room = FreeRoom {
        slack_one_in: None,
        keep_peak: false,
    };
    let mut pool = ExpandablePool::new(kind, 64 * GRANULE, GRANULE, &config, free_room);
    let mut storage = VirtualStorage::new();
    let first = pool
        .reserve_new_page(
            &mut storage,
            crate::memory::pool::page::Wanted {
                size: QUARTER,
                aligned: QUARTER,
                slot: 0,
            },
        )
        .unwrap();
    let mut placements = vec![first];
    for slot in 1..4 {
        placements.push(pool.try_reserve(QUARTER, QUARTER, slot).unwrap());
    }
    let offsets: Vec<u64> = placements.iter().map(|p| p.offset).collect();
    assert_eq!(offsets, [0, QUARTER, 2 * QUARTER, 3 * QUARTER]);
    for slot in [0, 2] {
        pool.free(placements[slot], QUARTER, QUARTER, 0);
    }
    (pool, storage)
}

/// The slots a room-gathering slide for 1 MiB would move.
fn room_plan(pool: &ExpandablePool, movable: impl Fn(u32) -> bool) -> Option<Vec<u32>> {
    pool.plan_room(2 * QUARTER, GRANULE, 24, movable)
        .map(|slide| slide.slots)
}

#[test]
fn a_plan_on_an_unchanged_arena_asks_the_pins_again() {
    let (pool, _storage) = holed();
    assert_eq!(room_plan(&pool, |_| true), Some(vec![1]));
    // Nothing in the arena changed; slot 1 was pinned meanwhile.
    assert_eq!(room_plan(&pool, |slot| slot != 1), None);
    assert_eq!(room_plan(&pool, |_| true), Some(vec![1]));
}

#[test]
fn a_plan_after_the_arena_changed_sees_the_change() {
    let (mut pool, _storage) = holed();
    assert_eq!(room_plan(&pool, |_| true), Some(vec![1]));
    // One hole is carved again: the one left gathers no more than its
    // own 512 KiB, whichever it is.
    pool.try_reserve(QUARTER, QUARTER, 9).unwrap();
    assert_eq!(room_plan(&pool, |_| true), None);
}
