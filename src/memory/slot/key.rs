//! The slot key: `(slot, generation)` packed into one word, so a handle's
//! cell can hold it in one atomic and a lookup can check the generation
//! without a lock. 0 means "unbound" (generations skip 0).

/// Names a slot of the table and the generation it had when handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SlotKey(u64);

impl SlotKey {
    /// The key of an unbound handle.
    pub(crate) const UNBOUND: Self = Self(0);

    #[inline]
    pub(crate) fn new(slot: u32, generation: u32) -> Self {
        Self((u64::from(slot) << 32) | u64::from(generation))
    }

    /// The word a cell stores.
    #[inline]
    pub(crate) fn from_word(word: u64) -> Self {
        Self(word)
    }

    #[inline]
    pub(crate) fn word(self) -> u64 {
        self.0
    }

    #[inline]
    pub(crate) fn slot(self) -> u32 {
        (self.0 >> 32) as u32
    }

    #[inline]
    pub(crate) fn generation(self) -> u32 {
        self.0 as u32
    }

    #[inline]
    pub(crate) fn is_bound(self) -> bool {
        self != Self::UNBOUND
    }
}
