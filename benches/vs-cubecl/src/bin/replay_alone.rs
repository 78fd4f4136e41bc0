//! One manager-alone replay of each trace named, as the `replays` bench
//! times it (`ours_alone`: the default expandable layout on
//! `VirtualStorage`), with nothing else around it: what a profiler is
//! pointed at. `cargo build --release --bin replay_alone`, then, for the
//! instructions of the replay alone,
//! `valgrind --tool=callgrind --toggle-collect='*ours_alone*'
//! target/release/replay_alone TRACE...` (`docs/performance.md`, "The
//! manager alone replaying the corpus"). `REPLAY_ALONE_TIMES=N` replays
//! each trace N times (a sampling profiler such as `perf` needs seconds).

use std::path::Path;
use streamalloc::memory::MemoryConfiguration;
use streamalloc::trace::read_trace;
use streamalloc_vs_cubecl::replays::{Steps, ours_alone};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let times: usize = match std::env::var("REPLAY_ALONE_TIMES") {
        Ok(times) => times.parse()?,
        Err(_) => 1,
    };
    for path in std::env::args().skip(1) {
        let events = read_trace(Path::new(&path), None)?;
        let steps = Steps::of(&events);
        let mut refused = 0;
        for _ in 0..times {
            refused = std::hint::black_box(ours_alone(&steps, &MemoryConfiguration::Expandable));
        }
        println!(
            "{path}: {} events, {refused} reservations refused",
            steps.events
        );
    }
    Ok(())
}
