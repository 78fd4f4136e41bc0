//! A device's CUDA streams: each gets its own streamalloc stream on its
//! first call, the same one at every later call from any thread, and a
//! stream past the most a device runs is a counted refusal (its call gets
//! null), never a crash. Its own binary: the library is the process's.

use std::ffi::c_void;
use streamalloc_torch::{streamalloc_free, streamalloc_malloc};

mod common;
use common::{device, refusals, stats, stream};

/// The most streams a device runs (the service's `max_streams`).
const MOST: usize = 256;

#[test]
fn every_cuda_stream_gets_its_own_stream_up_to_the_most_a_device_runs() {
    // Two threads asking for the same new streams at once: each made once.
    let threads: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(|| {
                (0..MOST)
                    .map(|n| (streamalloc_malloc(4096, 0, stream(n)) as usize, n))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let held: Vec<(usize, usize)> = threads
        .into_iter()
        .flat_map(|thread| thread.join().unwrap())
        .collect();
    assert!(held.iter().all(|&(ptr, _)| ptr != 0), "every stream served");
    let dev = device(&stats(), 0);
    assert_eq!(dev["streams"].as_array().unwrap().len(), MOST);
    assert_eq!(refusals("too_many_streams"), 0);

    // One more CUDA stream: refused, counted, and the others go on.
    assert!(streamalloc_malloc(4096, 0, stream(MOST)).is_null());
    assert_eq!(refusals("too_many_streams"), 1);
    let again = streamalloc_malloc(4096, 0, stream(7));
    assert!(!again.is_null());

    for (ptr, n) in held.into_iter().chain([(again as usize, 7)]) {
        streamalloc_free(ptr as *mut c_void, 4096, 0, stream(n));
    }
    let dev = device(&stats(), 0);
    assert_eq!(dev["streams"].as_array().unwrap().len(), MOST);
    assert_eq!(dev["bytes_in_use"], 0);
    assert_eq!(refusals("unknown_free"), 0);
}
