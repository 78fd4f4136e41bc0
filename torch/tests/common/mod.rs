//! What the C interface's tests share: the statistics as JSON, a device's
//! part of them, and stream pointers as PyTorch passes them.

#![allow(dead_code)]

use std::ffi::{CStr, c_void};
use streamalloc_torch::{streamalloc_free_string, streamalloc_stats_json};

/// The library's statistics.
pub fn stats() -> serde_json::Value {
    let text = streamalloc_stats_json();
    assert!(!text.is_null());
    // SAFETY: a string the library made, freed once below.
    let json = unsafe { CStr::from_ptr(text) }
        .to_str()
        .unwrap()
        .to_string();
    // SAFETY: as above.
    unsafe { streamalloc_free_string(text) };
    serde_json::from_str(&json).unwrap()
}

/// Device `id`'s part of `stats`.
pub fn device(stats: &serde_json::Value, id: i64) -> serde_json::Value {
    stats["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no device {id} in {stats}"))
}

/// How many refusals of `kind` were counted.
pub fn refusals(kind: &str) -> u64 {
    stats()["refusals"][kind].as_u64().unwrap()
}

/// A stream pointer, as PyTorch passes `cudaStream_t`.
pub fn stream(n: usize) -> *mut c_void {
    (0x1000 + n * 0x10) as *mut c_void
}
