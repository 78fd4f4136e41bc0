//! A reserved range of host address space whose granules are mapped and
//! unmapped as a GPU's would be (`mprotect`, `madvise`), with the physical
//! handles a GPU's driver would have made for them counted.

use super::super::{GranuleMap, HandleSize, Mapping, StorageError, StorageHandle, StorageId};
use std::ops::Range;
use std::ptr::NonNull;

/// The largest range of address space a host storage reserves (128 TiB).
const MAX_HOST_RANGE: u64 = 1 << 47;

/// A reserved range of address space: `mmap(PROT_NONE)`, its granules made
/// accessible with `mprotect` as they are mapped and emptied with
/// `madvise(MADV_DONTNEED)` (their memory goes back to the kernel) as they
/// are unmapped.
#[derive(Debug)]
pub(super) struct HostRange {
    /// Start of the reservation; valid address space for `map.size()` bytes.
    ptr: NonNull<u8>,
    /// What is mapped.
    pub(super) map: GranuleMap,
}

impl HostRange {
    pub(super) fn reserve(
        size: u64,
        granule: u64,
        handle_size: HandleSize,
    ) -> Result<Self, StorageError> {
        // No process has more address space than this (x86-64 and arm64
        // give user space 2^47 or 2^48 bytes): checked before the bitmap of
        // its granules is allocated.
        if size > MAX_HOST_RANGE {
            return Err(StorageError::OutOfMemory {
                requested: size,
                held: 0,
                capacity: MAX_HOST_RANGE,
            });
        }
        let map = GranuleMap::new(granule, size, handle_size)?;
        let bytes = usize::try_from(size).map_err(|_| StorageError::InvalidSize(size))?;
        // No `MAP_NORESERVE`: the kernel does not count address space no
        // one may touch, but with the flag it would not count the granules
        // made writable either, so a map of more than the machine holds
        // would succeed and the first write to it end the process. Without
        // it a map is weighed as an allocation is (the kernel's overcommit
        // policy), and one the host cannot back is refused.
        //
        // SAFETY: an anonymous private reservation of a non-zero length with
        // no access: nothing can touch it until a granule is made accessible.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(StorageError::OutOfMemory {
                requested: size,
                held: 0,
                capacity: 0,
            });
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(StorageError::InvalidSize(size))?;
        Ok(Self { ptr, map })
    }

    /// The first byte of `handle`'s granules (checked against the range).
    pub(super) fn at(&self, handle: &StorageHandle) -> *mut u8 {
        // SAFETY: callers checked the handle against `map`, whose size is
        // the reservation's.
        unsafe { self.ptr.as_ptr().add(handle.offset as usize) }
    }

    pub(super) fn protect(
        &self,
        handle: &StorageHandle,
        prot: libc::c_int,
    ) -> Result<(), StorageError> {
        // SAFETY: whole granules inside our own reservation (checked by the
        // granule map before every call).
        let rc = unsafe { libc::mprotect(self.at(handle).cast(), handle.size as usize, prot) };
        if rc == 0 {
            Ok(())
        } else {
            Err(StorageError::OutOfMemory {
                requested: handle.size,
                held: self.map.mapped_bytes(),
                capacity: 0,
            })
        }
    }

    /// Map `handle`'s granules: those given back and not yet gone are
    /// taken back as they are; the others are made accessible. The
    /// physical handles a GPU would have created for them.
    ///
    /// A spare handle moved or released gives its old granules back to the
    /// kernel as a release does (host memory cannot follow it; what a GPU
    /// would call is counted all the same).
    /// Refused, the spare handles it had given back already went: they are
    /// returned with the error.
    pub(super) fn map(
        &mut self,
        handle: &StorageHandle,
        loose: &[u64],
    ) -> Result<Mapping, (StorageError, Vec<Range<u64>>)> {
        let mapping = (self.map.plan(handle, loose)).map_err(|err| (err, Vec::new()))?;
        let granule = self.map.granule();
        // Old places first: a spare released may lie partly in `handle`.
        let old: Vec<Range<u64>> = (mapping.released.iter().cloned())
            .chain(mapping.moved.iter().map(|moved| moved.from.clone()))
            .collect();
        for run in &old {
            self.give_to_kernel(&self.run(handle, run, granule));
        }
        // One protection a run, as a map of it is weighed whole (the
        // kernel's overcommit policy refuses a run it cannot back).
        let mut new: Vec<Range<u64>> = (mapping.created.iter().cloned())
            .chain(mapping.adopted.iter().cloned())
            .chain(mapping.moved.iter().map(|moved| moved.to.clone()))
            .collect();
        new.sort_by_key(|run| run.start);
        let runs = new
            .into_iter()
            .fold(Vec::<Range<u64>>::new(), |mut runs, piece| {
                match runs.last_mut() {
                    Some(run) if run.end == piece.start => run.end = piece.end,
                    _ => runs.push(piece),
                }
                runs
            });
        for run in &runs {
            let run = self.run(handle, run, granule);
            if let Err(err) = self.protect(&run, libc::PROT_READ | libc::PROT_WRITE) {
                self.map.forget_spares(&old);
                return Err((err, old));
            }
        }
        self.map.apply(handle, &mapping);
        Ok(mapping)
    }

    /// Give whole granules no allocation holds back to the kernel.
    pub(super) fn give_to_kernel(&self, run: &StorageHandle) {
        // SAFETY: whole granules of our reservation that no allocation
        // holds (the manager unmaps only free granules); their pages go
        // back to the kernel and read as zero if mapped again.
        unsafe { libc::madvise(self.at(run).cast(), run.size as usize, libc::MADV_DONTNEED) };
        let _ = self.protect(run, libc::PROT_NONE);
    }

    /// Give every spare handle back to the kernel; the handles (released,
    /// or handed over to another storage: host memory cannot follow a
    /// handle, so both give the granules back and differ only in what a
    /// GPU would be asked).
    pub(super) fn release_spares(&mut self, id: StorageId) -> Vec<std::ops::Range<u64>> {
        let granule = self.map.granule();
        let whole = StorageHandle::whole(id, self.map.size());
        let released = self.map.release_spares();
        for run in &released {
            self.give_to_kernel(&self.run(&whole, run, granule));
        }
        released
    }

    /// The granules `run` numbers, as a handle of the range `of` belongs to.
    pub(super) fn run(
        &self,
        of: &StorageHandle,
        run: &std::ops::Range<u64>,
        granule: u64,
    ) -> StorageHandle {
        StorageHandle {
            id: of.id,
            offset: run.start.saturating_mul(granule),
            size: run.end.saturating_sub(run.start).saturating_mul(granule),
        }
    }

    /// Give the granules of `handle` still waiting in `batch` back to the
    /// kernel, a whole physical handle at a time; the handles.
    /// `keep`: whole handles stay as spares (`GranuleMap::unmap_doomed`).
    pub(super) fn unmap_doomed(
        &mut self,
        handle: &StorageHandle,
        batch: u64,
        keep: bool,
    ) -> Vec<std::ops::Range<u64>> {
        let granule = self.map.granule();
        let gone = self.map.unmap_doomed(handle, batch, keep);
        for run in &gone {
            self.give_to_kernel(&self.run(handle, run, granule));
        }
        gone
    }
}

impl Drop for HostRange {
    fn drop(&mut self) {
        // SAFETY: the reservation is ours and unmapped once; no reference
        // into it outlives the range.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map.size() as usize) };
    }
}

// SAFETY: as `HostPage`: the range owns its reservation exclusively.
unsafe impl Send for HostRange {}
