use super::*;
use crate::storage::StorageId;

const GRANULE: u64 = 2 << 20;

/// Granules `run` of the range, as a handle.
fn granules(run: Range<u64>) -> StorageHandle {
    StorageHandle {
        id: StorageId(1),
        offset: run.start * GRANULE,
        size: (run.end - run.start) * GRANULE,
    }
}

/// A range of 4,096 granules with 1,024 of them mapped at once: large
/// enough for handles of 16 granules.
fn mapped_1024() -> GranuleMap {
    let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
    let created = map.map(&granules(0..1024), &[]).unwrap().created;
    assert_eq!(created.len(), 64, "1,024 granules in handles of 16");
    assert!(
        created
            .iter()
            .all(|run| run.end - run.start == 16 && run.start % 16 == 0)
    );
    map
}

#[test]
fn a_small_range_maps_a_handle_per_granule_and_a_large_one_larger_handles() {
    let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
    // 10 granules: a handle may cover at most 1/64 of the range's.
    assert_eq!(map.map(&granules(0..10), &[]).unwrap().created.len(), 10);
    // 256 more: 266 held once mapped, so handles of 4, cut at multiples
    // of 4 (10..12 first, to reach one).
    let created = map.map(&granules(10..266), &[]).unwrap().created;
    assert_eq!(created.first(), Some(&(10..12)));
    assert_eq!(created.get(1), Some(&(12..16)));
    assert_eq!(created.last(), Some(&(264..266)));
    assert_eq!(granules_in(&created), 256);
    assert_eq!(map.handle_count(), 10 + created.len() as u64);
}

#[test]
fn a_handle_goes_back_only_whole_and_its_given_back_part_waits_stranded() {
    let mut map = mapped_1024();
    assert!(map.doom(&granules(0..8), 1));
    assert_eq!(map.doomed_bytes(), 8 * GRANULE);
    assert!(
        map.unmap_doomed(&granules(0..8), 1, false).is_empty(),
        "8..16 in use"
    );
    assert_eq!((map.doomed_bytes(), map.stranded_bytes()), (0, 8 * GRANULE));
    assert_eq!(map.mapped_granules(), 1024, "the driver still holds them");
    assert!(map.check_access(&granules(0..1), 0).is_err(), "given back");
    // The rest of the handle goes in a later batch: the whole handle with it.
    assert!(map.doom(&granules(8..16), 2));
    assert_eq!(map.unmap_doomed(&granules(8..16), 2, false), vec![0..16]);
    assert_eq!((map.stranded_bytes(), map.mapped_granules()), (0, 1008));
    assert_eq!(map.handle_count(), 63);
}

#[test]
fn a_handle_waits_for_its_latest_batch() {
    let mut map = mapped_1024();
    assert!(map.doom(&granules(16..24), 1));
    assert!(map.doom(&granules(24..32), 2));
    // Batch 1's fence passed, batch 2's not yet: nothing goes.
    assert!(map.unmap_doomed(&granules(16..24), 1, false).is_empty());
    assert_eq!(map.doomed_bytes(), 8 * GRANULE, "batch 2's still wait");
    assert_eq!(map.unmap_doomed(&granules(24..32), 2, false), vec![16..32]);
    assert_eq!(map.doomed_bytes() + map.stranded_bytes(), 0);
}

#[test]
fn a_stranded_granule_mapped_again_needs_no_driver_call() {
    let mut map = mapped_1024();
    assert!(map.doom(&granules(32..40), 1));
    assert!(map.unmap_doomed(&granules(32..40), 1, false).is_empty());
    assert_eq!(map.fresh_runs(&granules(32..40), &[]).unwrap(), vec![]);
    assert_eq!(map.bytes_a_map_adds(&granules(32..40), &[]), 0);
    assert_eq!(map.map(&granules(32..40), &[]).unwrap(), Mapping::default());
    assert_eq!(map.stranded_bytes(), 0);
    assert!(map.check_access(&granules(32..40), 0).is_ok());
}

#[test]
fn whole_handles_is_the_part_that_frees_handles_whole() {
    let mut map = mapped_1024();
    // 4..40 touches handles 0..16, 16..32 and 32..48: only the middle
    // one lies inside it.
    assert_eq!(map.whole_handles(&granules(4..40)), granules(16..32));
    assert_eq!(map.whole_handles(&granules(4..12)).size, 0);
    // With 0..4 and 40..48 given back, the edges complete their
    // handles too.
    assert!(map.doom(&granules(0..4), 1));
    assert!(map.doom(&granules(40..48), 1));
    assert_eq!(map.whole_handles(&granules(4..40)), granules(4..40));
    // Unmapped granules are nobody's handle.
    assert_eq!(
        map.whole_handles(&granules(1024..1030)),
        granules(1024..1030)
    );
}

#[test]
fn a_larger_share_cuts_larger_handles_from_the_next_map() {
    let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
    // 256 granules held once mapped: one in 64 is 4 a handle.
    let created = map.map(&granules(0..256), &[]).unwrap().created;
    assert!(created.iter().all(|run| run.end - run.start == 4));
    // One in 16 of 512 is 32, so the handle size (16) bounds it.
    map.set_handle_cut(HandleCut {
        share_one_in: 16,
        ..HandleCut::default()
    });
    let created = map.map(&granules(256..512), &[]).unwrap().created;
    assert!(created.iter().all(|run| run.end - run.start == 16));
    // Those mapped before keep their cuts.
    assert_eq!(map.first_handle_end(&granules(0..256)), 4 * GRANULE);
}

/// Cut of the most a range held, the handles a map cuts after the range
/// shrank have the lengths they had at its most: those given back fit
/// them again. Cut of what it holds now, they shrink with it.
#[test]
fn a_cut_of_the_most_held_keeps_its_lengths_when_the_range_shrinks() {
    for of_most_held in [false, true] {
        let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
        map.set_handle_cut(HandleCut {
            of_most_held,
            ..HandleCut::default()
        });
        // 256 granules held once mapped: one in 64 is 4 a handle.
        let created = map.map(&granules(0..256), &[]).unwrap().created;
        assert!(created.iter().all(|run| run.end - run.start == 4));
        // All but the first 16 go back.
        assert!(map.doom(&granules(16..256), 1));
        assert_eq!(map.unmap_doomed(&granules(16..256), 1, false).len(), 60);
        assert_eq!(map.mapped_granules(), 16);
        // 32 granules again: 48 held once mapped, one in 64 of which is
        // less than a granule; of the most held (256), 4.
        let created = map.map(&granules(16..48), &[]).unwrap().created;
        let length = if of_most_held { 4 } else { 1 };
        assert!(
            created.iter().all(|run| run.end - run.start == length),
            "of the most held: {of_most_held}; {created:?}"
        );
    }
}

#[test]
fn first_handle_end_walks_a_run_a_physical_handle_at_a_time() {
    let map = mapped_1024();
    let end = |run: Range<u64>| map.first_handle_end(&granules(run)) / GRANULE;
    // Handles of 16 granules: 20..100 is cut at 32, 48, ..., and the
    // last piece ends with the run.
    assert_eq!(end(20..100), 32);
    assert_eq!(end(32..100), 48);
    assert_eq!(end(96..100), 100);
    // Unmapped granules are nobody's handle: one at a time.
    assert_eq!(end(1024..1030), 1025);
}

/// A small range (handles of one granule) with granules 0..8 mapped,
/// and 0..3 given back and past their fence while spares are held.
fn three_spares() -> GranuleMap {
    let mut map = GranuleMap::new(GRANULE, 64 * GRANULE, HandleSize::new(16)).unwrap();
    assert_eq!(map.map(&granules(0..8), &[]).unwrap().created.len(), 8);
    assert!(map.doom(&granules(0..3), 1));
    assert!(
        map.unmap_doomed(&granules(0..3), 1, true).is_empty(),
        "kept"
    );
    assert_eq!(map.stranded_bytes(), 3 * GRANULE, "still held");
    map
}

#[test]
fn a_map_moves_spares_before_it_creates_any() {
    let mut map = three_spares();
    let mapping = map.map(&granules(8..10), &[]).unwrap();
    let moved: Vec<_> = mapping
        .moved
        .iter()
        .map(|m| (m.from.clone(), m.to.clone()))
        .collect();
    assert_eq!(moved, vec![(0..1, 8..9), (1..2, 9..10)]);
    assert!(mapping.created.is_empty() && mapping.released.is_empty());
    assert_eq!(map.mapped_granules(), 8, "5 live, 2 moved, 1 spare");
    assert!(map.check_access(&granules(8..10), 0).is_ok());
    // The spare left and the two it cannot cover: moved, then created.
    let mapping = map.map(&granules(10..13), &[]).unwrap();
    assert_eq!(mapping.moved.len(), 1);
    assert_eq!(mapping.created, vec![11..12, 12..13]);
    assert_eq!(map.release_spares(), vec![], "none left");
    assert_eq!(map.mapped_granules(), 10);
    assert_eq!(map.stranded_bytes(), 0);
}

#[test]
fn a_map_that_must_create_releases_the_spares_it_cannot_move_first() {
    let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
    map.map(&granules(0..1024), &[]).unwrap();
    // One spare of 16 granules; a map of 4 cannot take it.
    assert!(map.doom(&granules(0..16), 1));
    assert!(map.unmap_doomed(&granules(0..16), 1, true).is_empty());
    assert_eq!(
        map.bytes_a_map_adds(&granules(1024..1028), &[]),
        4 * GRANULE
    );
    let mapping = map.map(&granules(1024..1028), &[]).unwrap();
    assert_eq!(mapping.released, vec![0..16]);
    assert_eq!(mapping.created, vec![1024..1028]);
    assert_eq!(map.mapped_granules(), 1024 - 16 + 4);
    assert!(map.check_access(&granules(0..1), 0).is_err());
}

#[test]
fn a_spare_inside_a_map_is_revived_whole_and_one_reaching_out_is_released() {
    let mut map = GranuleMap::new(GRANULE, 4096 * GRANULE, HandleSize::new(16)).unwrap();
    map.map(&granules(0..1024), &[]).unwrap();
    assert!(map.doom(&granules(0..32), 1));
    assert!(map.unmap_doomed(&granules(0..32), 1, true).is_empty());
    // 0..16 lies inside: revived where it is, no driver call.
    assert_eq!(map.map(&granules(0..16), &[]).unwrap(), Mapping::default());
    // 16..32 reaches past 16..20: released, and 16..20 mapped fresh.
    let mapping = map.map(&granules(16..20), &[]).unwrap();
    assert_eq!(mapping.released, vec![16..32]);
    assert_eq!(mapping.created, vec![16..20]);
    assert_eq!(map.mapped_granules(), 1024 - 12);
    assert_eq!(map.stranded_bytes(), 0, "nothing left half held");
}

#[test]
fn spares_go_when_released_and_none_are_kept_unless_asked() {
    let mut map = three_spares();
    assert_eq!(map.release_spares(), vec![0..1, 1..2, 2..3]);
    assert_eq!((map.mapped_granules(), map.stranded_bytes()), (5, 0));
    assert!(map.doom(&granules(3..4), 2));
    assert_eq!(map.unmap_doomed(&granules(3..4), 2, false), vec![3..4]);
    assert_eq!(map.release_spares(), vec![]);
}

#[test]
fn a_map_takes_adopted_handles_of_its_pieces_lengths_before_spares_or_new_ones() {
    let mut map = three_spares();
    // Pieces of one granule (a small range): two adopted handles of one
    // granule map there; the one of two fits no piece.
    let mapping = map.map(&granules(8..11), &[1, 2, 1]).unwrap();
    assert_eq!(mapping.adopted, vec![8..9, 9..10]);
    assert_eq!(mapping.moved.len(), 1, "then a spare");
    assert!(mapping.created.is_empty());
    assert_eq!(mapping.loose_released, (0, 0), "kept: nothing was created");
    assert!(map.check_access(&granules(8..11), 0).is_ok());
    assert_eq!(map.first_handle_end(&granules(8..11)), 9 * GRANULE);
    // More than they cover: the rest is created, and what is left of
    // them (the spares and the two-granule handle) is released first.
    let mapping = map.map(&granules(11..14), &[2]).unwrap();
    assert!(mapping.adopted.is_empty());
    assert_eq!(mapping.moved.len(), 2);
    assert_eq!(mapping.created, vec![13..14]);
    assert_eq!(mapping.loose_released, (1, 2));
    assert_eq!(mapping.held_after(10 * GRANULE, GRANULE), 9 * GRANULE);
}

#[test]
fn a_storage_maps_what_it_adopted_as_many_granules_as_it_would_create() {
    let mut map = mapped_1024();
    // Handles of 16 here: an adopted 16 is mapped whole, the 8 fits no
    // piece, and a map of 20 creates its last 4 (and releases the 8).
    assert_eq!(
        map.bytes_a_map_adds(&granules(1024..1044), &[8, 16]),
        4 * GRANULE
    );
    let mapping = map.map(&granules(1024..1044), &[8, 16]).unwrap();
    assert_eq!(mapping.adopted, vec![1024..1040]);
    assert_eq!(mapping.created, vec![1040..1044]);
    assert_eq!(mapping.loose_released, (1, 8));
    assert_eq!(map.mapped_granules(), 1044);
}

#[test]
fn spares_handed_over_leave_their_granules_unmapped() {
    let mut map = three_spares();
    assert_eq!(map.hand_over_spares(), vec![0..1, 1..2, 2..3]);
    assert_eq!((map.mapped_granules(), map.stranded_bytes()), (5, 0));
    assert!(map.check_access(&granules(0..1), 0).is_err());
    assert_eq!(map.hand_over_spares(), vec![], "each once");
}
