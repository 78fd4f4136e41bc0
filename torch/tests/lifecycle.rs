//! A forked child (a data-loader worker) and calls after shutdown are
//! refused and counted, never a crash. One test: the process has one
//! library, and shutdown ends it.

use std::ffi::{CStr, c_void};
use streamalloc_torch::{
    streamalloc_free, streamalloc_free_string, streamalloc_malloc, streamalloc_shutdown,
    streamalloc_stats_json,
};

fn refusals(kind: &str) -> u64 {
    let text = streamalloc_stats_json();
    // SAFETY: a string the library made, freed once.
    let json = unsafe { CStr::from_ptr(text) }
        .to_str()
        .unwrap()
        .to_string();
    // SAFETY: as above.
    unsafe { streamalloc_free_string(text) };
    let stats: serde_json::Value = serde_json::from_str(&json).unwrap();
    stats["refusals"][kind].as_u64().unwrap()
}

#[test]
fn a_forked_child_and_calls_after_shutdown_are_refused() {
    let stream = 0x10 as *mut c_void;
    let ptr = streamalloc_malloc(4096, 0, stream);
    assert!(!ptr.is_null());
    // SAFETY: the child touches only the library (its own locks, free at
    // the fork: no other thread of this test holds them) and exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let refused = streamalloc_malloc(64, 0, stream).is_null();
        streamalloc_free(ptr, 4096, 0, stream);
        let counted = refusals("forked_child") >= 2;
        // SAFETY: ends the child without running the parent's exit hooks.
        unsafe { libc::_exit(if refused && counted { 0 } else { 1 }) };
    }
    assert!(child > 0, "fork failed");
    let mut status = 0;
    // SAFETY: waits for the child made above.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child saw {status}"
    );
    // The parent's pointer is still the parent's: the child freed nothing.
    // SAFETY: 4096 bytes of host memory this library handed out.
    unsafe { std::ptr::write_bytes(ptr as *mut u8, 7, 4096) };
    streamalloc_free(ptr, 4096, 0, stream);
    assert_eq!(refusals("unknown_free"), 0);

    streamalloc_shutdown();
    assert!(streamalloc_malloc(64, 0, stream).is_null());
    streamalloc_free(0x1234 as *mut c_void, 8, 0, stream);
    assert!(refusals("after_shutdown") >= 2);
    // Shutting down twice is harmless.
    streamalloc_shutdown();
}
