//! The planners' searches over a [`RangeView`] against the plain walks they
//! replaced (a walk from every start, asking about each allocation on the
//! way), on random layouts of free blocks, allocations (some pinned) and
//! void runs: the same plan, or none, every time. The walks share with the
//! planners only how a run becomes a slide (`Slide::of`); what sliding a
//! run releases is `gain` in the walk and the view's run ends
//! (`RangeView::run_end`) in the planner; where a run may start is
//! defined here
//! (`run_starts`), and the planners' own loops over the allocations are
//! checked against it.

use super::blocks::{Block, RangeView};
use super::holes::Hole;
use super::slide::{Slide, best_run, gain, room_in};
use super::window::{Candidate, WINDOWS_TRIED, windows_in};
use proptest::prelude::*;

const GRANULE: u64 = 2 << 20;

/// What a block is, before it is laid out.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Free,
    Owner { pinned: bool },
    Void,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        4 => Just(Kind::Free),
        6 => Just(Kind::Owner { pinned: false }),
        1 => Just(Kind::Owner { pinned: true }),
        1 => Just(Kind::Void),
    ]
}

/// Blocks laid out one after another from offset 0, sizes in 256-byte
/// steps up to 4 MiB (voids whole granules); and each slot's movability.
fn layout() -> impl Strategy<Value = (Vec<Block>, Vec<bool>)> {
    prop::collection::vec((kind(), 1u64..16_384, 1u64..3), 0..40).prop_map(|specs| {
        let (mut blocks, mut movable) = (Vec::new(), Vec::new());
        let mut offset = 0;
        for (node, (kind, steps, granules)) in specs.into_iter().enumerate() {
            let size = match kind {
                Kind::Void => granules * GRANULE,
                _ => steps * 256,
            };
            let owner = match kind {
                Kind::Owner { pinned } => {
                    movable.push(!pinned);
                    Some(movable.len() as u32 - 1)
                }
                _ => None,
            };
            blocks.push(Block {
                node: node as u32,
                offset,
                size,
                owner,
                void: matches!(kind, Kind::Void),
            });
            offset += size;
        }
        (blocks, movable)
    })
}

fn view_of(blocks: &[Block]) -> RangeView {
    let mut view = RangeView::default();
    view.rebuild(0, blocks.to_vec(), GRANULE);
    view
}

/// `plan_room`'s walk before the view.
fn room_walk(
    blocks: &[Block],
    aligned: u64,
    growth: u64,
    per_byte: u64,
    movable: &dyn Fn(u32) -> bool,
) -> Option<(u64, u64, Slide)> {
    let mut best: Option<(u64, u64, Slide)> = None;
    for (base, first) in run_starts(blocks) {
        let (mut live, mut room, mut voids) = (0u64, 0u64, 0u64);
        for below in &blocks[base..first] {
            room += below.size;
            voids += below.void_bytes();
        }
        for (last, block) in blocks.iter().enumerate().skip(first) {
            let Some(slot) = block.owner else {
                room += block.size;
                voids += block.void_bytes();
                continue;
            };
            live += block.size;
            if voids >= growth || !movable(slot) {
                break;
            }
            let spared = growth - voids;
            let dearer = best
                .as_ref()
                .is_some_and(|(cost, mapped, _)| (live, voids) >= (*cost, *mapped));
            if live > spared.saturating_mul(per_byte) || dearer {
                break;
            }
            let above = blocks.get(last + 1).filter(|above| above.is_free());
            if room + above.map_or(0, |above| above.size) >= aligned {
                best = Some((live, voids, Slide::of(&blocks[base..=last], 0)));
                break;
            }
        }
    }
    best
}

/// `plan_run`'s walk before the view (no bound on the search).
fn run_walk(
    blocks: &[Block],
    per_byte: u64,
    may_map: u64,
    movable: &dyn Fn(u32) -> bool,
) -> Option<Slide> {
    let mut best: Option<(u64, u64, usize, usize)> = None;
    for (base, first) in run_starts(blocks) {
        let below = &blocks[base..first];
        let mut live = 0u64;
        let mut already: u64 = below.iter().map(|block| block.released(GRANULE)).sum();
        let mut voids: u64 = below.iter().map(Block::void_bytes).sum();
        for (last, block) in blocks.iter().enumerate().skip(first) {
            let Some(slot) = block.owner else {
                already += block.released(GRANULE);
                voids += block.void_bytes();
                continue;
            };
            if !movable(slot) || voids > may_map {
                break;
            }
            live += block.size;
            let gained = gain(blocks, base, last, live, already, GRANULE);
            let better = best
                .is_none_or(|(most, cost, _, _)| gained > most || (gained == most && live < cost));
            if gained > 0 && gained.saturating_mul(per_byte) >= live && better {
                best = Some((gained, live, base, last));
            }
        }
    }
    let (gained, _, base, last) = best?;
    Some(Slide::of(&blocks[base..=last], gained))
}

/// `plan_window`'s candidate walk before the view (the trailing void run
/// left in: a window reaching it is refused, as one reaching the end).
fn windows_walk(
    blocks: &[Block],
    aligned: u64,
    budget: u64,
    movable: &dyn Fn(u32) -> bool,
) -> (Vec<Candidate>, Vec<Hole>) {
    let (mut candidates, mut holes): (Vec<Candidate>, Vec<Hole>) = (Vec::new(), Vec::new());
    for (at, block) in blocks.iter().enumerate() {
        if !block.is_free() {
            continue;
        }
        holes.push((block.size, 0, block.offset, block.node as usize));
        let limit = match candidates.last() {
            Some(dearest) if candidates.len() == WINDOWS_TRIED => dearest.cost.saturating_sub(1),
            _ => budget,
        };
        let (mut covered, mut cost, mut largest, mut refused) = (0u64, 0u64, 0u64, false);
        let mut next = at;
        while covered < aligned {
            let Some(block) = blocks.get(next) else {
                refused = true;
                break;
            };
            if block.void || block.owner.is_some_and(|slot| !movable(slot)) {
                refused = true;
                break;
            }
            if block.owner.is_some() {
                cost += block.size;
                largest = largest.max(block.size);
                if cost > limit {
                    refused = true;
                    break;
                }
            }
            covered += block.size;
            next += 1;
        }
        if refused {
            continue;
        }
        let candidate = Candidate {
            cost,
            largest,
            range: 0,
            start: block.offset,
            anchor: block.node,
            end: block.offset + covered,
        };
        candidate.rank_among(&mut candidates);
    }
    (candidates, holes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn a_room_gathering_run_is_the_one_the_walk_finds(
        (blocks, movable) in layout(),
        aligned_steps in 1u64..40_000,
        growth_granules in 1u64..4,
        per_byte in prop_oneof![Just(4u64), Just(24), 1u64..64],
    ) {
        let aligned = aligned_steps * 256;
        let growth = aligned.div_ceil(GRANULE).max(growth_granules) * GRANULE;
        let can_move = |slot: u32| movable[slot as usize];
        let view = view_of(&blocks);
        let mut found = None;
        room_in(&view, aligned, growth, per_byte, &can_move, &mut found);
        // Both over the range less its last void run, as the walk was.
        prop_assert_eq!(found, room_walk(view.blocks(), aligned, growth, per_byte, &can_move));
    }

    #[test]
    fn a_relocation_slide_is_the_one_the_walk_finds(
        (blocks, movable) in layout(),
        per_byte in prop_oneof![Just(24u64), 1u64..64],
        may_map_granules in 0u64..4,
    ) {
        let can_move = |slot: u32| movable[slot as usize];
        let view = view_of(&blocks);
        let may_map = may_map_granules * GRANULE;
        prop_assert_eq!(
            best_run(&view, GRANULE, per_byte, may_map, &can_move),
            run_walk(view.blocks(), per_byte, may_map, &can_move)
        );
    }

    #[test]
    fn windows_are_the_ones_the_walk_finds(
        (blocks, movable) in layout(),
        aligned_steps in 0u64..40_000,
        budget_steps in 0u64..100_000,
    ) {
        let (aligned, budget) = (aligned_steps * 256, budget_steps * 256);
        let can_move = |slot: u32| movable[slot as usize];
        let view = view_of(&blocks);
        let (mut candidates, mut holes) = (Vec::new(), Vec::new());
        windows_in(&view, aligned, budget, &can_move, &mut candidates, &mut holes);
        let (walked, walked_holes) = windows_walk(&blocks, aligned, budget, &can_move);
        prop_assert_eq!(candidates, walked);
        prop_assert_eq!(holes, walked_holes);
    }
}

/// Where a run may start in `blocks`: (the first block of the room below
/// it, its first allocation), for every allocation right above free room,
/// mapped or not. The run slides down to the start of that room.
fn run_starts(blocks: &[Block]) -> impl Iterator<Item = (usize, usize)> + '_ {
    blocks.iter().enumerate().filter_map(move |(first, block)| {
        block.owner?;
        let base = blocks[..first]
            .iter()
            .rposition(|below| below.owner.is_some())
            .map_or(0, |at| at + 1);
        (base < first).then_some((base, first))
    })
}
