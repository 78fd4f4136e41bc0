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
        let mut bin = bins::round_down(size);
        while let Some(found) = self.first_class_at_least(bin) {
            let mut node = self.heads[found];
            while node != NONE {
                let block = &self.blocks[node as usize];
                if block.size >= size {
                    out.push(node);
                }
                node = block.class_next;
            }
            bin = found + 1;
        }
    }

    /// A listed free block of at least `size` bytes that lies wholly
    /// outside `page`'s bytes `avoid`: the first such in the lowest class
    /// that holds `size`, so the same arena gives the same block on every
    /// run.
    pub(crate) fn free_apart(&self, size: u64, page: u32, avoid: Range<u64>) -> Option<u32> {
        let mut probes = 0;
        let mut bin = bins::round_down(size);
        while let Some(found) = self.first_class_at_least(bin) {
            let mut node = self.heads[found];
            while node != NONE {
                let block = &self.blocks[node as usize];
                if block.size >= size && is_apart(block, page, &avoid) {
                    return Some(node);
                }
                probes += 1;
                if probes == PROBES {
                    return None;
                }
                node = block.class_next;
            }
            bin = found + 1;
        }
        None
    }
    /// Among the largest listed free blocks, one that lies wholly outside
    /// `page`'s bytes `avoid`: the first such from the highest class down
    /// (the same on every run), `None` if the look finds none.
    pub(crate) fn largest_apart(&self, page: u32, avoid: Range<u64>) -> Option<u32> {
        let mut probes = 0;
        for class in (0..BINS).rev() {
            let mut node = self.heads[class];
            while node != NONE {
                let block = &self.blocks[node as usize];
                if is_apart(block, page, &avoid) {
                    return Some(node);
                }
                probes += 1;
                if probes == PROBES {
                    return None;
                }
                node = block.class_next;
            }
        }
        None
    }
}

/// Whether `block` lies wholly outside `page`'s bytes `avoid`.
fn is_apart(block: &Block, page: u32, avoid: &Range<u64>) -> bool {
    block.page != page || block.offset + block.size <= avoid.start || block.offset >= avoid.end
}
