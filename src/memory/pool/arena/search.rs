//! Searches of the class lists beyond a carve's: every free block that
//! holds a size (the compaction planners' holes), and one apart from a
//! span (where a slide stages an allocation whose move would overlap
//! itself, `pool/expandable/moves.rs`).

use super::{Arena, BINS, Block, NONE, bins};
use std::ops::Range;

/// Blocks looked at, all classes together, before the search gives up: a
/// bounded look keeps a slide's cost independent of how many free blocks
/// the pool holds (a miss only costs the slide its chunked copies).
const PROBES: usize = 32;

impl Arena {
    /// Push every listed free block of at least `size` bytes onto `out`,
    /// in class order: the classes at and above `size`'s, empty ones
    /// skipped through the bitmap.
    pub(crate) fn listed_at_least(&self, size: u64, out: &mut Vec<u32>) {
        out.extend(
            self.listed_upward(bins::round_down(size))
                .filter(|&node| self.blocks[node as usize].size >= size),
        );
    }

    /// A listed free block of at least `size` bytes that lies wholly
    /// outside `page`'s bytes `avoid`: the first such in the lowest class
    /// that holds `size`, so the same arena gives the same block on every
    /// run.
    pub(crate) fn free_apart(&self, size: u64, page: u32, avoid: Range<u64>) -> Option<u32> {
        self.listed_upward(bins::round_down(size))
            .take(PROBES)
            .find(|&node| {
                let block = &self.blocks[node as usize];
                block.size >= size && is_apart(block, page, &avoid)
            })
    }

    /// Among the largest listed free blocks, one that lies wholly outside
    /// `page`'s bytes `avoid`: the first such from the highest class down
    /// (the same on every run), `None` if the look finds none.
    pub(crate) fn largest_apart(&self, page: u32, avoid: Range<u64>) -> Option<u32> {
        (0..BINS)
            .rev()
            .flat_map(|class| self.class_list(class))
            .take(PROBES)
            .find(|&node| is_apart(&self.blocks[node as usize], page, &avoid))
    }

    /// The listed free blocks of every class from `bin` up, class by class,
    /// empty classes skipped through the bitmap.
    fn listed_upward(&self, bin: usize) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(self.first_class_at_least(bin), |&class| {
            self.first_class_at_least(class + 1)
        })
        .flat_map(|class| self.class_list(class))
    }

    /// The listed free blocks of class `class`, in list order.
    fn class_list(&self, class: usize) -> impl Iterator<Item = u32> + '_ {
        let listed = |node: u32| (node != NONE).then_some(node);
        std::iter::successors(listed(self.heads[class]), move |&node| {
            listed(self.blocks[node as usize].class_next)
        })
    }
}

/// Whether `block` lies wholly outside `page`'s bytes `avoid`.
fn is_apart(block: &Block, page: u32, avoid: &Range<u64>) -> bool {
    block.page != page || block.offset + block.size <= avoid.start || block.offset >= avoid.end
}
