//! A reservation never takes an expandable pool higher than growing for it
//! would: whatever compaction runs before a growth (windows, slides,
//! evacuations, and the void runs their slides map for a moment), the
//! bytes mapped during one reservation stay within what the pool mapped
//! before it plus the reservation rounded up to whole granules. Checked on
//! random churn of many sizes, where a growth's planners run often.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use streamalloc::memory::{Allocation, MemoryConfig, MemoryManager, PageUpdate};
use streamalloc::storage::{
    DEFAULT_GRANULE, DeviceStorage, Resource, StorageError, StorageHandle, StorageId,
    VirtualStorage,
};

/// Virtual memory that counts the bytes mapped and the most mapped since
/// the last [`Metered::mark`].
struct Metered {
    inner: VirtualStorage,
    mapped: u64,
    most: u64,
}

impl Metered {
    fn mark(&mut self) -> u64 {
        self.most = self.mapped;
        self.mapped
    }
}

impl DeviceStorage for Metered {
    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }
    fn allocate(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        self.inner.allocate(size)
    }
    fn deallocate(&mut self, id: StorageId) {
        self.inner.deallocate(id)
    }
    fn flush(&mut self) {
        self.inner.flush()
    }
    fn resource(&mut self, handle: &StorageHandle) -> Result<Resource, StorageError> {
        self.inner.resource(handle)
    }
    fn write(&mut self, handle: &StorageHandle, data: &[u8]) -> Result<(), StorageError> {
        self.inner.write(handle, data)
    }
    fn read(&mut self, handle: &StorageHandle, out: &mut [u8]) -> Result<(), StorageError> {
        self.inner.read(handle, out)
    }
    fn copy(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        self.inner.copy(from, to)
    }
    fn slide(&mut self, from: &StorageHandle, to: &StorageHandle) -> Result<(), StorageError> {
        self.inner.slide(from, to)
    }
    fn bytes_allocated(&self) -> u64 {
        self.inner.bytes_allocated()
    }
    fn granule(&self) -> Option<u64> {
        self.inner.granule()
    }
    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, StorageError> {
        self.inner.reserve_range(size)
    }
    fn map(&mut self, range: &StorageHandle) -> Result<(), StorageError> {
        self.inner.map(range)?;
        self.mapped += range.size;
        self.most = self.most.max(self.mapped);
        Ok(())
    }
    fn unmap(&mut self, range: &StorageHandle) {
        self.inner.unmap(range);
        self.mapped -= range.size;
    }
}

/// A small deterministic generator (SplitMix64): the property runs over
/// seeds, each a long churn that proptest's shrinking need not take apart.
struct Churn(u64);

impl Churn {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 256 B to 16 MiB, about as many of each power of two (the benches'
    /// mixed sizes).
    fn size(&mut self) -> u64 {
        let shift = 8 + self.next() % 16;
        (1 << shift) + self.next() % (1 << shift)
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("tests/proptest-regressions/growth_bound.txt"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_reservation_maps_no_more_than_its_growth(seed in any::<u64>(), cap_mib in 32u64..256) {
        let storage = Metered { inner: VirtualStorage::new(), mapped: 0, most: 0 };
        let mut memory = MemoryManager::new(storage, MemoryConfig::default());
        let mut churn = Churn(seed);
        let mut live: Vec<(Allocation, u64)> = Vec::new();
        let mut held = 0;
        for _ in 0..4000 {
            // Random releases and reservations, the live bytes kept under a
            // cap: the pattern of RMM's random_allocations benchmark.
            if !live.is_empty() && (held > cap_mib << 20 || churn.next() % 100 < 48) {
                let pick = (churn.next() % live.len() as u64) as usize;
                held -= live.swap_remove(pick).1;
                continue;
            }
            let size = churn.size();
            let before = memory.storage().mark();
            live.push((memory.reserve(size, PageUpdate::Allow).unwrap(), size));
            held += size;
            let most = memory.storage().most;
            let growth = size.div_ceil(DEFAULT_GRANULE) * DEFAULT_GRANULE;
            prop_assert!(
                most <= before + growth,
                "reserving {} B mapped up to {} B over the {} B before (a growth maps {})",
                size, most - before, before, growth
            );
        }
    }
}
