//! A forked child (a data-loader worker) and calls after shutdown are
//! refused and counted, never a crash; memory holds its bytes and a
//! fraction caps a device. One test: the process has one library, and
//! shutdown ends it.

use std::ffi::c_void;
use streamalloc_torch::{
    streamalloc_free, streamalloc_malloc, streamalloc_set_memory_fraction, streamalloc_shutdown,
};

mod common;
use common::{device, refusals, stats, stream};

/// Memory handed out holds its bytes, and a fraction set before a device's
/// first use caps it.
fn memory_handed_out_holds_its_bytes_and_a_fraction_caps_a_device() {
    const DEVICE: i32 = 3;
    // A fraction before the device's first use: a budget of an eighth of
    // the 1 TiB the library serves a device by default.
    streamalloc_set_memory_fraction(1.0 / 8.0, DEVICE);
    let a = streamalloc_malloc(1 << 20, DEVICE, stream(0)) as *mut u8;
    let b = streamalloc_malloc(3000, DEVICE, stream(1)) as *mut u8;
    assert!(!a.is_null() && !b.is_null() && a != b);
    // SAFETY: host memory this library handed out, 1 MiB and 3000 bytes.
    unsafe {
        std::ptr::write_bytes(a, 0xAB, 1 << 20);
        std::ptr::write_bytes(b, 0xCD, 3000);
        assert_eq!(*a.add((1 << 20) - 1), 0xAB);
        assert_eq!(*b.add(2999), 0xCD);
    }
    assert!(streamalloc_malloc(1 << 40, DEVICE, stream(0)).is_null());
    let dev = device(&stats(), i64::from(DEVICE));
    assert_eq!(dev["budget"], 1u64 << 37);
    assert_eq!(dev["live_allocations"], 2);
    streamalloc_free(a as *mut c_void, 1 << 20, DEVICE, stream(0));
    streamalloc_free(b as *mut c_void, 3000, DEVICE, stream(1));
    assert_eq!(device(&stats(), i64::from(DEVICE))["bytes_in_use"], 0);
}

#[test]
fn a_library_from_first_use_to_fork_and_shutdown() {
    memory_handed_out_holds_its_bytes_and_a_fraction_caps_a_device();
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
