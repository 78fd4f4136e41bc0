//! The block arena behind the sliced pools: free blocks of every page of a
//! pool, filed by size class, with O(1) carve and free.
//!
//! Each page is a run of blocks linked in address order (`prev`/`next`), so
//! a freed block merges with free neighbours in O(1); free blocks are also on
//! a list per size class, found through a two-level bitmap (one bit per power
//! of two, one per class inside it). The structure is TLSF's and
//! `OffsetAllocator`'s; what is ours is that one arena spans many pages, and
//! that a page can be *withdrawn* (its free blocks leave the class lists) so
//! nothing is carved from it while it is guarded, outdated or being emptied.

use super::bins::{self, BINS, LEAVES, TOPS};
use super::page::Placement;

mod search;

/// "No node": the end of a list.
pub(crate) const NONE: u32 = u32::MAX;

/// How many blocks of the class just below a request's are looked at for one
/// that fits exactly; a bounded look keeps carving O(1) while letting an
/// exact-size free block be reused instead of growing the pool.
const NEAR_FIT_PROBES: usize = 8;

/// A block: a byte range of one page, free or carved.
#[derive(Debug, Clone)]
struct Block {
    /// The page it lies in (the pool's page index).
    page: u32,
    /// Offset from the page start.
    offset: u64,
    /// Length in bytes.
    size: u64,
    /// The block before it in the page, or `NONE`.
    prev: u32,
    /// The block after it in the page, or `NONE`.
    next: u32,
    /// Neighbours on its class list (free and listed blocks only).
    class_prev: u32,
    /// See `class_prev`.
    class_next: u32,
    /// Carved (owned by an allocation) rather than free.
    used: bool,
    /// On a class list: free, and its page is not withdrawn.
    listed: bool,
    /// The slot of the allocation carved here (meaningful while `used`).
    owner: u32,
    /// On the spare list: the node names no block.
    dead: bool,
}

impl Block {
    /// A free, unlisted block between `prev` and `next`.
    fn free(page: u32, offset: u64, size: u64, prev: u32, next: u32) -> Self {
        Self {
            page,
            offset,
            size,
            prev,
            next,
            class_prev: NONE,
            class_next: NONE,
            used: false,
            listed: false,
            owner: NONE,
            dead: false,
        }
    }
}

/// Free space of a pool's pages, indexed by size class.
#[derive(Debug, Clone)]
pub(crate) struct Arena {
    /// Every block, by node index.
    blocks: Vec<Block>,
    /// Node indices free for reuse.
    spare: Vec<u32>,
    /// Head of each class's list.
    heads: Vec<u32>,
    /// Bit `t`: some class of power `t` has a listed block.
    tops: u64,
    /// Bit `l` of `leaves[t]`: class `t * LEAVES + l` has a listed block.
    leaves: [u8; TOPS],
    /// Calls that may have changed a block, so far: a planner's copy of the
    /// blocks made at the same count is still exact.
    changes: u64,
}

impl Default for Arena {
    fn default() -> Self {
        Self {
            blocks: Vec::new(),
            spare: Vec::new(),
            heads: vec![NONE; BINS],
            tops: 0,
            leaves: [0; TOPS],
            changes: 0,
        }
    }
}

impl Arena {
    /// How many calls that may change a block it has taken (see
    /// `changes`).
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// Add a page of `size` bytes as one free block; returns its first node,
    /// which stays the page's first node for the page's whole life.
    pub(crate) fn add_page(&mut self, page: u32, size: u64, listed: bool) -> u32 {
        self.changes = self.changes.wrapping_add(1);
        let node = self.new_block(Block::free(page, 0, size, NONE, NONE));
        if listed {
            self.list(node);
        }
        node
    }

    /// Remove an empty page, given its first node.
    pub(crate) fn remove_page(&mut self, first: u32) {
        self.changes = self.changes.wrapping_add(1);
        debug_assert!(self.is_empty_page(first));
        if self.blocks[first as usize].listed {
            self.unlist(first);
        }
        self.blocks[first as usize].dead = true;
        self.spare.push(first);
    }

    /// Whether the page starting at `first` is one free block.
    pub(crate) fn is_empty_page(&self, first: u32) -> bool {
        let block = &self.blocks[first as usize];
        !block.used && block.next == NONE
    }

    /// Carve `size` bytes from any listed free block that holds them.
    pub(crate) fn carve(&mut self, size: u64) -> Option<u32> {
        self.changes = self.changes.wrapping_add(1);
        let node = self.find_free(size)?;
        self.take(node, size);
        Some(node)
    }

    /// Carve `size` bytes from the page starting at `first` (a fresh page:
    /// its first block is free and holds them).
    pub(crate) fn carve_in(&mut self, first: u32, size: u64) -> Option<u32> {
        self.changes = self.changes.wrapping_add(1);
        let block = &self.blocks[first as usize];
        (!block.used && block.size >= size).then(|| {
            self.take(first, size);
            first
        })
    }

    /// Carve `size` bytes from the free block `node` (which must hold them).
    fn take(&mut self, node: u32, size: u64) {
        if self.blocks[node as usize].listed {
            self.unlist(node);
        }
        let block = &mut self.blocks[node as usize];
        debug_assert!(!block.used && block.size >= size);
        block.used = true;
        let rest = block.size - size;
        if rest > 0 {
            block.size = size;
            let (page, offset, next) = (block.page, block.offset + size, block.next);
            let tail = self.new_block(Block::free(page, offset, rest, node, next));
            if next != NONE {
                self.blocks[next as usize].prev = tail;
            }
            self.blocks[node as usize].next = tail;
            self.list(tail);
        }
    }

    /// Free the carved block `node`, merging it with free neighbours. The
    /// merged block is listed when `listed` (its page is not withdrawn).
    pub(crate) fn free(&mut self, node: u32, listed: bool) -> u32 {
        self.changes = self.changes.wrapping_add(1);
        let mut node = node;
        self.blocks[node as usize].used = false;
        let next = self.blocks[node as usize].next;
        if next != NONE && !self.blocks[next as usize].used {
            self.absorb_next(node);
        }
        let prev = self.blocks[node as usize].prev;
        if prev != NONE && !self.blocks[prev as usize].used {
            self.absorb_next(prev);
            node = prev;
        }
        if listed && !self.blocks[node as usize].listed {
            self.list(node);
        }
        node
    }

    /// Slide the carved block `node` down over the free block right below
    /// it: the carving takes the lower block's start, and the free room
    /// lies above it, merged with a free block after and listed. The node
    /// now carved is the one below, the free one is `node`: what freeing
    /// `node` and carving the merged block's start would leave, in one
    /// step instead of a merge, a list, an unlist and a split.
    pub(crate) fn shift_down(&mut self, node: u32) -> u32 {
        self.changes = self.changes.wrapping_add(1);
        let below = self.blocks[node as usize].prev;
        debug_assert!(below != NONE && !self.blocks[below as usize].used);
        if self.blocks[below as usize].listed {
            self.unlist(below);
        }
        let (size, owner) = {
            let carved = &self.blocks[node as usize];
            (carved.size, carved.owner)
        };
        let (offset, room) = {
            let lower = &mut self.blocks[below as usize];
            let moved = (lower.offset, lower.size);
            lower.used = true;
            lower.size = size;
            lower.owner = owner;
            moved
        };
        let free = &mut self.blocks[node as usize];
        free.used = false;
        free.offset = offset + size;
        free.size = room;
        free.owner = NONE;
        let next = free.next;
        if next != NONE && !self.blocks[next as usize].used {
            self.absorb_next(node);
        }
        self.list(node);
        below
    }

    /// Merge the free block after `node` into `node`.
    fn absorb_next(&mut self, node: u32) {
        let next = self.blocks[node as usize].next;
        if self.blocks[next as usize].listed {
            self.unlist(next);
        }
        if self.blocks[node as usize].listed {
            self.unlist(node);
        }
        let (size, after) = {
            let b = &self.blocks[next as usize];
            (b.size, b.next)
        };
        let block = &mut self.blocks[node as usize];
        block.size += size;
        block.next = after;
        if after != NONE {
            self.blocks[after as usize].prev = node;
        }
        self.blocks[next as usize].dead = true;
        self.spare.push(next);
    }

    /// Take the free blocks of the page starting at `first` off the class
    /// lists (nothing is carved from it until [`relist_page`](Self::relist_page)).
    pub(crate) fn withdraw_page(&mut self, first: u32) {
        self.changes = self.changes.wrapping_add(1);
        let mut node = first;
        while node != NONE {
            if self.blocks[node as usize].listed {
                self.unlist(node);
            }
            node = self.blocks[node as usize].next;
        }
    }

    /// Put the free blocks of the page starting at `first` back on the lists.
    pub(crate) fn relist_page(&mut self, first: u32) {
        self.changes = self.changes.wrapping_add(1);
        let mut node = first;
        while node != NONE {
            let block = &self.blocks[node as usize];
            if !block.used && !block.listed {
                self.list(node);
            }
            node = self.blocks[node as usize].next;
        }
    }

    /// The carved blocks of the page starting at `first`, in address order.
    pub(crate) fn used_blocks(&self, first: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut node = first;
        while node != NONE {
            if self.blocks[node as usize].used {
                out.push(node);
            }
            node = self.blocks[node as usize].next;
        }
        out
    }

    /// Split the block `node` at `at` bytes from its start (`0 < at <
    /// size`); the second part, a block of the same kind, is returned. A free
    /// block's two parts are listed as it was.
    pub(crate) fn split(&mut self, node: u32, at: u64) -> u32 {
        self.changes = self.changes.wrapping_add(1);
        let listed = self.blocks[node as usize].listed;
        if listed {
            self.unlist(node);
        }
        let block = &mut self.blocks[node as usize];
        debug_assert!(at > 0 && at < block.size);
        let (page, offset, size, next, used, owner) = (
            block.page,
            block.offset,
            block.size,
            block.next,
            block.used,
            block.owner,
        );
        block.size = at;
        let tail = self.new_block(Block {
            used,
            owner,
            ..Block::free(page, offset + at, size - at, node, next)
        });
        if next != NONE {
            self.blocks[next as usize].prev = tail;
        }
        self.blocks[node as usize].next = tail;
        if listed {
            self.list(node);
            self.list(tail);
        }
        tail
    }

    /// Make the free block `node` carved, owned by `owner` (what marks
    /// address space with no memory behind it: see `pool/expandable.rs`).
    pub(crate) fn occupy(&mut self, node: u32, owner: u32) {
        self.changes = self.changes.wrapping_add(1);
        if self.blocks[node as usize].listed {
            self.unlist(node);
        }
        let block = &mut self.blocks[node as usize];
        debug_assert!(!block.used);
        block.used = true;
        block.owner = owner;
    }

    /// Merge the carved block after `node` into the carved block `node`
    /// (two neighbouring runs of unmapped address space become one).
    pub(crate) fn merge_carved_next(&mut self, node: u32) {
        self.changes = self.changes.wrapping_add(1);
        let next = self.blocks[node as usize].next;
        debug_assert!(
            next != NONE && self.blocks[node as usize].used && self.blocks[next as usize].used
        );
        self.absorb_next(node);
    }

    /// The block before `node` in its page, or `NONE`.
    pub(crate) fn prev(&self, node: u32) -> u32 {
        self.blocks[node as usize].prev
    }

    /// The blocks of a page from `first` up, in address order: (node,
    /// offset, size, the owner of a carved block). One look at each node:
    /// a planner copies every block of a range this way.
    pub(crate) fn chain(
        &self,
        first: u32,
    ) -> impl Iterator<Item = (u32, u64, u64, Option<u32>)> + '_ {
        let mut node = first;
        std::iter::from_fn(move || {
            // `NONE` ends the chain: no block has that index.
            let block = self.blocks.get(node as usize)?;
            let at = node;
            node = block.next;
            Some((
                at,
                block.offset,
                block.size,
                block.used.then_some(block.owner),
            ))
        })
    }

    /// The block after `node` in its page, or `NONE`.
    pub(crate) fn next(&self, node: u32) -> u32 {
        self.blocks[node as usize].next
    }

    /// Whether `node` names a free (not carved) block: false for a node
    /// that names no block any more (merged away, or its page removed).
    pub(crate) fn is_free(&self, node: u32) -> bool {
        let block = &self.blocks[node as usize];
        !block.used && !block.dead
    }

    /// Whether `node` names a carved block owned by `owner`.
    pub(crate) fn is_carved_by(&self, node: u32, owner: u32) -> bool {
        let block = &self.blocks[node as usize];
        block.used && !block.dead && block.owner == owner
    }

    /// Bytes of the block `node`.
    pub(crate) fn size(&self, node: u32) -> u64 {
        self.blocks[node as usize].size
    }

    /// Carve `size` bytes from the start of the free block `node` (which
    /// holds them).
    pub(crate) fn carve_at(&mut self, node: u32, size: u64) {
        self.changes = self.changes.wrapping_add(1);
        self.take(node, size);
    }

    /// Take a free block off its class list, or put it back, one at a time
    /// (a compaction keeps the room it is clearing from being carved).
    pub(crate) fn set_listed(&mut self, node: u32, listed: bool) {
        self.changes = self.changes.wrapping_add(1);
        let block = &self.blocks[node as usize];
        if block.used || block.listed == listed {
            return;
        }
        if listed {
            self.list(node);
        } else {
            self.unlist(node);
        }
    }

    /// Record which slot owns the carved block `node`.
    /// One more guard on the page whose first block is `first`, which
    /// `guards` counts: the first withdraws the page's free blocks.
    #[inline]
    pub(crate) fn add_guard(&mut self, first: u32, guards: &mut u32) {
        *guards += 1;
        if *guards == 1 {
            self.withdraw_page(first);
        }
    }

    /// Give the carved block `node` to `slot`: where the allocation lies.
    #[inline]
    pub(crate) fn hand_to(&mut self, node: u32, slot: u32) -> Placement {
        self.set_owner(node, slot);
        Placement::new(self.page(node), node, self.offset(node))
    }

    pub(crate) fn set_owner(&mut self, node: u32, slot: u32) {
        self.changes = self.changes.wrapping_add(1);
        self.blocks[node as usize].owner = slot;
    }

    /// The slot that owns the carved block `node`.
    pub(crate) fn owner(&self, node: u32) -> u32 {
        self.blocks[node as usize].owner
    }

    /// The page a block lies in.
    pub(crate) fn page(&self, node: u32) -> u32 {
        self.blocks[node as usize].page
    }

    /// Offset of a block in its page.
    pub(crate) fn offset(&self, node: u32) -> u64 {
        self.blocks[node as usize].offset
    }

    /// Bytes of the largest free block of the page starting at `first`.
    #[cfg(test)]
    pub(crate) fn largest_free(&self, first: u32) -> u64 {
        let mut best = 0;
        let mut node = first;
        while node != NONE {
            let block = &self.blocks[node as usize];
            if !block.used {
                best = best.max(block.size);
            }
            node = block.next;
        }
        best
    }

    fn find_free(&mut self, size: u64) -> Option<u32> {
        // A block in the class just below may still hold `size`.
        let below = bins::round_down(size);
        let mut node = self.heads[below];
        for _ in 0..NEAR_FIT_PROBES {
            if node == NONE {
                break;
            }
            if self.blocks[node as usize].size >= size {
                return Some(node);
            }
            node = self.blocks[node as usize].class_next;
        }
        let bin = self.first_class_at_least(bins::round_up(size))?;
        Some(self.heads[bin])
    }

    /// The lowest class `>= bin` with a listed block.
    fn first_class_at_least(&self, bin: usize) -> Option<usize> {
        let (top, leaf) = (bin / LEAVES, bin % LEAVES);
        if top >= TOPS {
            return None;
        }
        let leaf_bits = u32::from(self.leaves[top]) & (u32::MAX << leaf);
        if leaf_bits != 0 {
            return Some(top * LEAVES + leaf_bits.trailing_zeros() as usize);
        }
        let higher = if top + 1 >= TOPS {
            0
        } else {
            self.tops & (u64::MAX << (top + 1))
        };
        if higher == 0 {
            return None;
        }
        let top = higher.trailing_zeros() as usize;
        Some(top * LEAVES + self.leaves[top].trailing_zeros() as usize)
    }

    fn new_block(&mut self, block: Block) -> u32 {
        match self.spare.pop() {
            Some(node) => {
                self.blocks[node as usize] = block;
                node
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn list(&mut self, node: u32) {
        let bin = bins::round_down(self.blocks[node as usize].size);
        let head = self.heads[bin];
        {
            let block = &mut self.blocks[node as usize];
            block.listed = true;
            block.class_prev = NONE;
            block.class_next = head;
        }
        if head != NONE {
            self.blocks[head as usize].class_prev = node;
        }
        self.heads[bin] = node;
        self.tops |= 1 << (bin / LEAVES);
        self.leaves[bin / LEAVES] |= 1 << (bin % LEAVES);
    }

    fn unlist(&mut self, node: u32) {
        let (bin, prev, next) = {
            let block = &mut self.blocks[node as usize];
            block.listed = false;
            (
                bins::round_down(block.size),
                block.class_prev,
                block.class_next,
            )
        };
        if prev != NONE {
            self.blocks[prev as usize].class_next = next;
        } else {
            self.heads[bin] = next;
            if next == NONE {
                self.leaves[bin / LEAVES] &= !(1 << (bin % LEAVES));
                if self.leaves[bin / LEAVES] == 0 {
                    self.tops &= !(1 << (bin / LEAVES));
                }
            }
        }
        if next != NONE {
            self.blocks[next as usize].class_prev = prev;
        }
    }
}

#[cfg(test)]
mod tests;
