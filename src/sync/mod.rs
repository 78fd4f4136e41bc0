//! The one place that names concurrency primitives.
//!
//! Every other module imports `crate::sync::...`. Under the crate-specific
//! cfg `streamalloc_loom` the same names resolve to loom's model-checked
//! types (see `loom.rs`), so the loom models in `loom-tests/` exercise the
//! real code rather than a copy of it. The pattern is tokio's `src/loom/`.
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
