//! Reserve, write, read back, fragment, compact, read back again, and print
//! the report: the manager end to end on host memory.

use streamalloc::memory::{MemoryConfig, MemoryError, MemoryManager, PageUpdate};
use streamalloc::storage::HostStorage;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut memory = MemoryManager::new(HostStorage::new(), MemoryConfig::default());

    let greeting = memory.reserve(64, PageUpdate::Allow)?;
    memory.write(&greeting, 0, b"hello, device memory")?;
    let back = memory.read(&greeting, 0, 20)?;
    println!("read back: {:?}", String::from_utf8_lossy(&back));

    // A fragmenting sequence: fill arena pages, then free three in four.
    let all: Vec<_> = (0..64u64)
        .map(|i| {
            let a = memory.reserve(300 * 1024 + i * 512, PageUpdate::Allow)?;
            memory.write(&a, 0, &i.to_le_bytes())?;
            Ok::<_, MemoryError>((a, i))
        })
        .collect::<Result<_, _>>()?;
    let kept: Vec<_> = all.into_iter().filter(|(_, i)| i % 4 == 0).collect();
    memory.process_releases();

    let before = memory.memory_report().usage();
    let relocation = memory.compact()?;
    let after = memory.memory_report().usage();
    println!("before compaction: {before}");
    println!("after compaction:  {after}");
    println!(
        "moved {} allocations ({} bytes), returned {} pages",
        relocation.moved, relocation.bytes_moved, relocation.pages_released
    );
    for (a, i) in &kept {
        assert_eq!(
            memory.read(a, 0, 8)?,
            i.to_le_bytes(),
            "bytes kept through the move"
        );
    }
    println!("all {} surviving allocations read back intact", kept.len());
    println!("\n{memory}");
    Ok(())
}
