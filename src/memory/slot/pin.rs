//! The pin word: one atomic word per allocation cell that counts the
//! clients' pins and carries two flags, so that pinning, claiming a move
//! and orphaning are each one CAS on the same word (they are totally
//! ordered; `loom-tests/` checks the interleavings).
//!
//! The long form: `docs/modules.md`, "`src/memory/slot/pin.rs`".

use crate::sync::atomic::{AtomicU64, Ordering};

/// The bits that count pins.
const PIN_MASK: u64 = (1 << 62) - 1;
/// Set while the owner moves the bytes.
const MOVING: u64 = 1 << 62;
/// Set once the owner retired with the cell pinned.
const ORPHANED: u64 = 1 << 63;

/// What a pin word says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PinState {
    /// No pin, no move.
    Free,
    /// This many pins are held.
    Pinned(u64),
    /// The owner is moving the bytes.
    Moving,
    /// The owner retired; this many pins still hold its pages.
    Orphaned(u64),
}

/// What dropping a pin left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unpinned {
    /// Other pins still hold it.
    Held,
    /// That was the last pin, and the owner is there.
    Last,
    /// That was the last pin of a cell whose owner retired.
    LastOrphaned,
}

/// Pins and the move and orphan flags of one allocation cell.
#[derive(Debug, Default)]
pub(crate) struct PinWord(AtomicU64);

impl PinWord {
    /// The state now.
    #[inline]
    pub(crate) fn state(&self) -> PinState {
        decode(self.0.load(Ordering::SeqCst))
    }

    /// Whether a pin is held (the one "is it pinned" test: a move is not
    /// a pin).
    #[inline]
    pub(crate) fn is_pinned(&self) -> bool {
        self.0.load(Ordering::SeqCst) & PIN_MASK != 0
    }

    /// Take a pin unless a move is under way or the owner retired.
    #[inline]
    pub(crate) fn try_pin(&self) -> bool {
        let mut word = self.0.load(Ordering::SeqCst);
        loop {
            if word & (MOVING | ORPHANED) != 0 {
                return false;
            }
            match self
                .0
                .compare_exchange_weak(word, word + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// Drop one pin.
    #[inline]
    pub(crate) fn unpin(&self) -> Unpinned {
        let before = self.0.fetch_sub(1, Ordering::SeqCst);
        match before & PIN_MASK {
            1 if before & ORPHANED != 0 => Unpinned::LastOrphaned,
            1 => Unpinned::Last,
            _ => Unpinned::Held,
        }
    }

    /// Claim a move: from no pin to moving; `false` when a pin is held.
    #[inline]
    pub(crate) fn claim_move(&self) -> bool {
        self.0
            .compare_exchange(0, MOVING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// End a move (release: a client that pins next reads the new place).
    #[inline]
    pub(crate) fn end_move(&self) {
        debug_assert_eq!(self.state(), PinState::Moving);
        self.0.store(0, Ordering::SeqCst);
    }

    /// Mark the word orphaned if a pin holds it now; `false` when none does.
    #[inline]
    pub(crate) fn orphan(&self) -> bool {
        let mut word = self.0.load(Ordering::SeqCst);
        loop {
            if word & PIN_MASK == 0 {
                return false;
            }
            match self.0.compare_exchange_weak(
                word,
                word | ORPHANED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// Back to no pin, for a cell the owner alone references (reuse).
    #[inline]
    pub(crate) fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

fn decode(word: u64) -> PinState {
    let pins = word & PIN_MASK;
    if word & ORPHANED != 0 {
        PinState::Orphaned(pins)
    } else if word & MOVING != 0 {
        PinState::Moving
    } else if pins == 0 {
        PinState::Free
    } else {
        PinState::Pinned(pins)
    }
}

#[cfg(all(test, not(streamalloc_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_move_is_refused_while_pinned_and_a_pin_while_moving() {
        let word = PinWord::default();
        assert!(word.try_pin());
        assert_eq!(word.state(), PinState::Pinned(1));
        assert!(!word.claim_move());
        assert_eq!(word.unpin(), Unpinned::Last);
        assert!(word.claim_move());
        assert_eq!(word.state(), PinState::Moving);
        assert!(!word.try_pin());
        assert!(!word.is_pinned());
        word.end_move();
        assert_eq!(word.state(), PinState::Free);
    }

    #[test]
    fn an_orphaned_word_refuses_pins_and_names_its_last_unpin() {
        let word = PinWord::default();
        assert!(!word.orphan(), "nothing to orphan without a pin");
        assert!(word.try_pin() && word.try_pin());
        assert!(word.orphan());
        assert_eq!(word.state(), PinState::Orphaned(2));
        assert!(!word.try_pin());
        assert_eq!(word.unpin(), Unpinned::Held);
        assert_eq!(word.unpin(), Unpinned::LastOrphaned);
    }
}
