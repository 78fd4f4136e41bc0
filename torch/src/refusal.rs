//! The calls the library refuses, by kind: PyTorch can get each wrong,
//! and each is counted (and the first few logged), never a crash.

/// What the library refused, by kind: each counted, the first few logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A free of a pointer the library did not hand out (never, or freed
    /// already: a double free).
    UnknownFree,
    /// A free whose size is not the size allocated (freed all the same).
    SizeMismatch,
    /// An allocation the device could not serve (out of memory, too large).
    OutOfMemory,
    /// A negative device, or a device past what the library serves.
    BadDevice,
    /// More CUDA streams on one device than it runs.
    TooManyStreams,
    /// A call after `streamalloc_shutdown`.
    AfterShutdown,
    /// A call in a child process after `fork` (a data-loader worker): the
    /// parent's memory is not the child's to use.
    ForkedChild,
    /// A panic inside, caught at the boundary.
    Panic,
    /// The environment's configuration means nothing (see the log).
    BadConfig,
    /// A memory fraction set after the device's first allocation, or one
    /// outside 0..=1.
    BadFraction,
    /// `record_stream` of a pointer the library did not hand out.
    UnknownRecord,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 11] = [
        Refusal::UnknownFree,
        Refusal::SizeMismatch,
        Refusal::OutOfMemory,
        Refusal::BadDevice,
        Refusal::TooManyStreams,
        Refusal::AfterShutdown,
        Refusal::ForkedChild,
        Refusal::Panic,
        Refusal::BadConfig,
        Refusal::BadFraction,
        Refusal::UnknownRecord,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Refusal::UnknownFree => "unknown_free",
            Refusal::SizeMismatch => "size_mismatch",
            Refusal::OutOfMemory => "out_of_memory",
            Refusal::BadDevice => "bad_device",
            Refusal::TooManyStreams => "too_many_streams",
            Refusal::AfterShutdown => "after_shutdown",
            Refusal::ForkedChild => "forked_child",
            Refusal::Panic => "panic",
            Refusal::BadConfig => "bad_config",
            Refusal::BadFraction => "bad_fraction",
            Refusal::UnknownRecord => "unknown_record_stream",
        }
    }
}
