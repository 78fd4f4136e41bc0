//! What PyTorch pays the library for each allocation: `streamalloc_malloc`
//! and `streamalloc_free` as its allocator calls them, on host memory (the
//! library's default without `enable()`), a ring of 32 live pointers of
//! 512 B to 1 MiB, the oldest freed at each step: one thread, and two
//! threads on two CUDA streams at once (a program's main thread and its
//! autograd thread), timed per call of either. Host time only: on a GPU
//! the driver's time comes on top when memory must move.
//! `cargo bench -p streamalloc-torch --bench c_api`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::collections::VecDeque;
use std::ffi::c_void;
use std::hint::black_box;
use std::time::{Duration, Instant};
use streamalloc_torch::{streamalloc_free, streamalloc_malloc};

const LIVE: usize = 32;

/// `calls` steps of the ring on CUDA stream `stream`, everything freed
/// at the end.
fn ring_on(stream: usize, calls: u64) {
    let stream = stream as *mut c_void;
    let mut held: VecDeque<(*mut c_void, usize)> = VecDeque::new();
    for step in 0..calls {
        let size = 512 << (step % 12);
        let ptr = streamalloc_malloc(size, 0, stream);
        assert!(!ptr.is_null());
        held.push_back((black_box(ptr), size));
        if held.len() > LIVE
            && let Some((old, old_size)) = held.pop_front()
        {
            streamalloc_free(old, old_size, 0, stream);
        }
    }
    for (ptr, size) in held {
        streamalloc_free(ptr, size, 0, stream);
    }
}

fn ring(c: &mut Criterion) {
    let stream = std::ptr::null_mut::<c_void>();
    let sizes: Vec<usize> = (0..64).map(|i| 512 << (i % 12)).collect();
    let mut held: VecDeque<(*mut c_void, usize)> = VecDeque::new();
    let mut step = 0usize;
    let mut group = c.benchmark_group("c_api");
    group.throughput(Throughput::Elements(1));
    group.bench_function("malloc_and_free_32_live", |b| {
        b.iter(|| {
            let size = sizes[step % sizes.len()];
            step = step.wrapping_add(1);
            let ptr = streamalloc_malloc(size, 0, stream);
            assert!(!ptr.is_null());
            held.push_back((black_box(ptr), size));
            if held.len() > LIVE
                && let Some((old, old_size)) = held.pop_front()
            {
                streamalloc_free(old, old_size, 0, stream);
            }
        });
    });
    // Two threads, each on a stream of its own: the time per call of
    // either (the wall time of both over the calls of both).
    group.bench_function("malloc_and_free_2_threads", |b| {
        b.iter_custom(|iters| {
            let each = iters.div_ceil(2).max(1);
            let start = Instant::now();
            let threads: Vec<_> = (1..=2)
                .map(|stream| std::thread::spawn(move || ring_on(stream * 0x1000, each)))
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            let wall = start.elapsed();
            Duration::from_secs_f64(wall.as_secs_f64() * iters as f64 / (2 * each) as f64)
        });
    });
    group.finish();
    for (ptr, size) in held.drain(..) {
        streamalloc_free(ptr, size, 0, stream);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = ring
}
criterion_main!(benches);
