//! streamalloc as PyTorch's CUDA allocator: a shared library whose
//! functions `torch.cuda.memory.CUDAPluggableAllocator` loads by name.
//!
//! ```python
//! import torch
//! allocator = torch.cuda.memory.CUDAPluggableAllocator(
//!     "libstreamalloc_torch.so", "streamalloc_malloc", "streamalloc_free")
//! torch.cuda.memory.change_current_allocator(allocator)
//! ```
//!
//! (`python/streamalloc_torch` does this, and more, in one `enable()`.)
//! PyTorch passes raw pointers around: memory handed out stays pinned until
//! it is freed, so it never moves. No call from the host process can crash
//! it: a bad pointer, a double free, a call after shutdown or in a forked
//! child, a panic inside: each is refused, counted (`streamalloc_stats_json`)
//! and logged the first few times. `docs/torch.md` says what is supported.

#![warn(missing_docs)]

pub mod config;
mod devices;
mod fork;
mod ledger;
mod live;
mod ptr_hash;
mod refusal;
mod state;
mod streams;
#[cfg(feature = "cuda")]
mod uses;

pub use refusal::Refusal;
pub use state::Library;

use std::ffi::{CStr, CString, c_char, c_double, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

/// The one library of this process, configured from the environment at
/// its first call.
fn library() -> &'static Library {
    static LIBRARY: OnceLock<Library> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let config =
            config::Config::read(|name| std::env::var(name).ok()).map_err(|err| err.to_string());
        let record = std::env::var("STREAMALLOC_TORCH_RECORD").is_ok_and(|v| v == "1" || v == "on");
        Library::new(config, record)
    })
}

/// Run `body`; a panic inside is caught, counted and answered with `or`.
fn guarded<T>(or: T, body: impl FnOnce(&Library) -> T) -> T {
    let lib = library();
    match catch_unwind(AssertUnwindSafe(|| body(lib))) {
        Ok(value) => value,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            let _ = catch_unwind(AssertUnwindSafe(|| lib.refuse(Refusal::Panic, || message)));
            or
        }
    }
}

/// PyTorch's allocate: `size` bytes on `device`, ordered on `stream` (a
/// `cudaStream_t`). Null for 0 bytes, and when the memory cannot be had.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    guarded(0, |lib| lib.allocate(size, device, stream as usize)) as *mut c_void
}

/// PyTorch's free of `ptr` (`size` bytes on `device`, last used on `stream`).
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    guarded((), |lib| {
        lib.free(ptr as usize, size, device, stream as usize)
    });
}

/// PyTorch's `empty_cache` (`set_reset_fn`): give back what nothing holds.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_empty_cache() {
    guarded((), Library::empty_cache);
}

/// PyTorch's memory fraction (`set_memory_fraction_fn`), for a device not
/// yet used.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_set_memory_fraction(fraction: c_double, device: c_int) {
    guarded((), |lib| lib.set_memory_fraction(fraction, device));
}

/// PyTorch's `record_stream` (`set_record_stream_fn`).
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    guarded((), |lib| lib.record_stream(ptr as usize, stream as usize));
}

/// Every device's figures as a JSON string (peak live and reserved, per
/// stream, driver operations, refusals). Free it with
/// [`streamalloc_free_string`]. Null only if it could not be made.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_stats_json() -> *mut c_char {
    guarded(std::ptr::null_mut(), |lib| {
        CString::new(lib.stats().to_string()).map_or(std::ptr::null_mut(), CString::into_raw)
    })
}

/// Free a string this library returned.
///
/// # Safety
/// `text` is null or came from [`streamalloc_stats_json`], freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn streamalloc_free_string(text: *mut c_char) {
    if !text.is_null() {
        // SAFETY: the caller hands back a string `CString::into_raw` made.
        drop(unsafe { CString::from_raw(text) });
    }
}

/// Start (1) or stop (0) recording this process's allocations and frees.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_set_recording(on: c_int) {
    guarded((), |lib| lib.set_recording(on != 0));
}

/// Write the recorded trace as JSON Lines to `path` (UTF-8): the number of
/// events written, or -1 (the reason logged).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn streamalloc_dump_trace(path: *const c_char) -> i64 {
    if path.is_null() {
        return -1;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let path = unsafe { CStr::from_ptr(path) }
        .to_string_lossy()
        .into_owned();
    guarded(-1, |lib| {
        match lib.dump_trace(std::path::Path::new(&path)) {
            Ok(events) => i64::try_from(events).unwrap_or(i64::MAX),
            Err(message) => {
                eprintln!("streamalloc-torch: dump_trace: {message}");
                -1
            }
        }
    })
}

/// Give every device's memory back; later calls are refused and counted.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_shutdown() {
    guarded((), Library::shutdown);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_is_caught_counted_and_answered() {
        let before = library().stats()["refusals"]["panic"].as_u64().unwrap();
        let answer = guarded(7usize, |_| panic!("a bug inside"));
        assert_eq!(answer, 7, "the boundary answers its fallback");
        let after = library().stats()["refusals"]["panic"].as_u64().unwrap();
        assert_eq!(after, before + 1);
        // The library still serves.
        let ptr = streamalloc_malloc(64, 0, std::ptr::null_mut());
        assert!(!ptr.is_null());
        streamalloc_free(ptr, 64, 0, std::ptr::null_mut());
    }
}
