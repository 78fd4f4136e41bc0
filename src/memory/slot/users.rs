//! The streams other than its owner's that use an allocation
//! (`MemoryManager::record_use`), recorded in its slot.

use crate::storage::{UseFence, UserStream};

/// Who else uses an allocation, and, once its last handle went, the
/// fence on their work that its memory waits for before it is reused.
#[derive(Debug, Default)]
pub(crate) struct Users {
    /// The streams, each once, in the order they were recorded.
    pub(crate) streams: Vec<UserStream>,
    /// Recorded when the last handle went (`None` before, or while the
    /// storage could not record it: tried again at the next poll).
    pub(crate) fence: Option<UseFence>,
    /// Whether the last handle went: the memory waits for `fence`.
    pub(crate) released: bool,
}
