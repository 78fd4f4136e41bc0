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

/// The live pointers of one CUDA stream: each step allocates the next
/// size and frees the oldest past [`LIVE`]; what is left goes at the end.
struct Ring {
    stream: *mut c_void,
    held: VecDeque<(*mut c_void, usize)>,
    steps: usize,
}

impl Ring {
    fn on(stream: usize) -> Self {
        Self {
            stream: stream as *mut c_void,
            held: VecDeque::with_capacity(LIVE + 1),
            steps: 0,
        }
    }

    fn step(&mut self) {
        let size = 512 << (self.steps % 12);
        self.steps = self.steps.wrapping_add(1);
        let ptr = streamalloc_malloc(size, 0, self.stream);
        assert!(!ptr.is_null());
        self.held.push_back((black_box(ptr), size));
        if self.held.len() > LIVE
            && let Some((old, old_size)) = self.held.pop_front()
        {
            streamalloc_free(old, old_size, 0, self.stream);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        for (ptr, size) in self.held.drain(..) {
            streamalloc_free(ptr, size, 0, self.stream);
        }
    }
}

fn ring(c: &mut Criterion) {
    let mut group = c.benchmark_group("c_api");
    group.throughput(Throughput::Elements(1));
    let mut one = Ring::on(0);
    group.bench_function("malloc_and_free_32_live", |b| b.iter(|| one.step()));
    drop(one);
    // Two threads, each on a stream of its own: the time per call of
    // either (the wall time of both over the calls of both).
    group.bench_function("malloc_and_free_2_threads", |b| {
        b.iter_custom(|iters| {
            let each = iters.div_ceil(2).max(1);
            let start = Instant::now();
            let threads: Vec<_> = (1..=2)
                .map(|stream| {
                    std::thread::spawn(move || {
                        let mut ring = Ring::on(stream * 0x1000);
                        (0..each).for_each(|_| ring.step());
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            let wall = start.elapsed();
            Duration::from_secs_f64(wall.as_secs_f64() * iters as f64 / (2 * each) as f64)
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = ring
}
criterion_main!(benches);
