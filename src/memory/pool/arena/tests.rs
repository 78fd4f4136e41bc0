//! The arena's carve, merge, withdraw and class lookups.

use super::*;

#[test]
fn carve_split_and_merge_back() {
    let mut arena = Arena::default();
    let first = arena.add_page(0, 1024, true);
    let a = arena.carve(100).unwrap();
    let b = arena.carve(200).unwrap();
    let c = arena.carve(300).unwrap();
    assert_eq!(
        (arena.offset(a), arena.offset(b), arena.offset(c)),
        (0, 100, 300)
    );
    assert_eq!(arena.largest_free(first), 424);
    arena.free(b, true);
    // The hole of 200 serves an exact fit rather than the tail.
    let d = arena.carve(200).unwrap();
    assert_eq!(arena.offset(d), 100);
    arena.free(a, true);
    arena.free(d, true);
    arena.free(c, true);
    assert!(arena.is_empty_page(first));
    assert_eq!(arena.largest_free(first), 1024);
    assert!(arena.carve(2000).is_none());
}

#[test]
fn a_withdrawn_page_is_not_carved() {
    let mut arena = Arena::default();
    let p0 = arena.add_page(0, 1024, true);
    arena.withdraw_page(p0);
    assert!(arena.carve(10).is_none());
    let p1 = arena.add_page(1, 1024, true);
    let x = arena.carve(10).unwrap();
    assert_eq!(arena.blocks[x as usize].page, 1);
    arena.relist_page(p0);
    arena.free(x, true);
    assert!(arena.is_empty_page(p1));
    arena.remove_page(p1);
    let y = arena.carve(1024).unwrap();
    assert_eq!(arena.blocks[y as usize].page, 0);
}

proptest::proptest! {
    /// A slide in one step leaves the arena as freeing the block and
    /// carving the merged room's start did: the same blocks under the
    /// same nodes, the same spare nodes, and class lists that serve the
    /// same carvings.
    #[test]
    fn shifting_down_is_a_free_then_a_carve(
        sizes in proptest::collection::vec(1u64..64, 2..24),
        freed in proptest::collection::vec(proptest::bool::ANY, 24),
        pick in 0usize..24,
        later in proptest::collection::vec(1u64..128, 1..8),
    ) {
        let mut arena = Arena::default();
        // Sizes in whole 256-byte steps, as the pools align them.
        let first = arena.add_page(0, 1 << 20, true);
        let carved: Vec<u32> = sizes
            .iter()
            .enumerate()
            .map(|(slot, &size)| {
                let node = arena.carve(size * 256).expect("room for every size");
                arena.set_owner(node, slot as u32);
                node
            })
            .collect();
        for (&node, &free) in carved.iter().zip(&freed) {
            if free {
                arena.free(node, true);
            }
        }
        // Still carved (a freed node may be merged away), free below.
        let movable: Vec<u32> = carved
            .iter()
            .zip(&freed)
            .filter(|&(&node, &free)| {
                let below = arena.prev(node);
                !free && below != NONE && arena.is_free(below)
            })
            .map(|(&node, _)| node)
            .collect();
        let Some(&node) = movable.get(pick % movable.len().max(1)) else {
            // Nothing to slide in this layout.
            return Ok(());
        };
        let (size, slot) = (arena.size(node), arena.owner(node));
        let mut stepwise = arena.clone();
        let merged = stepwise.free(node, true);
        stepwise.carve_at(merged, size);
        stepwise.set_owner(merged, slot);
        let shifted = arena.shift_down(node);
        proptest::prop_assert_eq!(shifted, merged);
        let chain = |arena: &Arena| {
            arena
                .chain(first)
                .map(|(node, offset, size, owner)| (node, offset, size, owner, arena.blocks[node as usize].listed))
                .collect::<Vec<_>>()
        };
        proptest::prop_assert_eq!(chain(&arena), chain(&stepwise));
        proptest::prop_assert_eq!(&arena.spare, &stepwise.spare);
        for size in later {
            proptest::prop_assert_eq!(arena.carve(size * 256), stepwise.carve(size * 256));
        }
    }
}
