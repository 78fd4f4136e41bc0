//! The one place that names concurrency primitives.
//!
//! Every other module imports `crate::sync::...`. Under the crate-specific
//! cfg `streamalloc_loom` the same names resolve to loom's model-checked
//! types (`loom_impl.rs`; the production ones are in `std_impl.rs`), so the
//! loom models in `loom-tests/` exercise the real code rather than a copy
//! of it. The pattern is tokio's `src/loom/`.
//!
//! Both sides expose the same surface: `Mutex::lock` returns the guard
//! without poisoning, atomics are `std`'s API.

#[cfg(not(streamalloc_loom))]
mod std_impl;
#[cfg(not(streamalloc_loom))]
pub(crate) use std_impl::*;

#[cfg(streamalloc_loom)]
mod loom_impl;
#[cfg(streamalloc_loom)]
pub(crate) use loom_impl::*;

pub(crate) mod reply;

/// Types other crates' APIs require as they are, on both sides (cudarc
/// hands out `std` `Arc`s of its contexts and streams).
#[cfg(feature = "cuda")]
pub(crate) mod foreign {
    pub(crate) use std::sync::Arc;
}

/// State no model needs to explore, `std`'s on both sides: the manual
/// clock's time (time is not modelled: under loom it never moves, so no
/// timer fires) and the `Arc` that public configuration holds it in.
pub(crate) mod unmodelled {
    pub(crate) use std::sync::Arc;
    pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
}

/// A number no other call in this process got (the identities managers
/// stamp on their handles). A process-wide counter that no model needs to
/// explore, so `std`'s atomic on both sides.
pub(crate) fn unique_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
