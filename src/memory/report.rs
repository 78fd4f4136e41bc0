//! What the pools hold: usage per pool, peaks, a total, and a human form.

use super::bytes::Bytes;
use super::config::PoolKind;
use crate::storage::{DriverOps, DriverPaths};
use std::fmt;

/// Usage of memory at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryUsage {
    /// Live allocations.
    pub number_allocs: u64,
    /// Bytes the live allocations asked for.
    pub bytes_in_use: u64,
    /// Bytes lost to alignment behind live allocations.
    pub bytes_padding: u64,
    /// Bytes of the pages held.
    pub bytes_reserved: u64,
}

impl MemoryUsage {
    /// The sum of two usages.
    pub fn combine(self, other: Self) -> Self {
        Self {
            number_allocs: self.number_allocs + other.number_allocs,
            bytes_in_use: self.bytes_in_use + other.bytes_in_use,
            bytes_padding: self.bytes_padding + other.bytes_padding,
            bytes_reserved: self.bytes_reserved + other.bytes_reserved,
        }
    }
}

impl fmt::Display for MemoryUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ratio = if self.bytes_in_use == 0 {
            0.0
        } else {
            self.bytes_reserved as f64 / self.bytes_in_use as f64
        };
        write!(
            f,
            "{} {}, {} in use, {} reserved ({ratio:.2}x), {} padding",
            self.number_allocs,
            if self.number_allocs == 1 {
                "allocation"
            } else {
                "allocations"
            },
            Bytes(self.bytes_in_use),
            Bytes(self.bytes_reserved),
            Bytes(self.bytes_padding),
        )
    }
}

/// One pool's shape, usage and high-water marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReport {
    /// What kind of pool.
    pub kind: PoolKind,
    /// The size new pages get now (sliced and adaptive pools).
    pub page_size: Option<u64>,
    /// The largest reservation it serves.
    pub max_alloc_size: u64,
    /// Pages held.
    pub pages: u64,
    /// Outdated pages held (adaptive pools).
    pub outdated_pages: u64,
    /// The most pages held at once.
    pub pages_peak: u64,
    /// Usage now.
    pub usage: MemoryUsage,
    /// The most bytes in use at once.
    pub peak_bytes_in_use: u64,
    /// The most bytes reserved at once.
    pub peak_bytes_reserved: u64,
    /// The largest allocation served.
    pub largest_alloc: u64,
    /// Bytes of address space an expandable pool holds (its reserved bytes
    /// are the mapped part); 0 for pools of pages.
    pub address_space: u64,
}

impl fmt::Display for PoolReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} {} (peak {}), {}; peaks {} in use, {} reserved; largest {}",
            self.kind,
            self.pages,
            if self.pages == 1 { "page" } else { "pages" },
            self.pages_peak,
            self.usage,
            Bytes(self.peak_bytes_in_use),
            Bytes(self.peak_bytes_reserved),
            Bytes(self.largest_alloc),
        )?;
        if self.outdated_pages > 0 {
            write!(f, "; {} outdated", self.outdated_pages)?;
        }
        if self.address_space > 0 {
            write!(f, "; {} of address space", Bytes(self.address_space))?;
        }
        Ok(())
    }
}

/// Everything a manager holds, pool by pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryReport {
    /// The dynamic pools, in routing order.
    pub dynamic: Vec<PoolReport>,
    /// The persistent pool.
    pub persistent: PoolReport,
    /// The dedicated pool.
    pub dedicated: PoolReport,
    /// The most bytes reserved by all pools at once.
    pub peak_bytes_reserved: u64,
    /// The most bytes in use across all pools at once.
    pub peak_bytes_in_use: u64,
    /// What the storage asked of the device's driver so far.
    pub driver: DriverOps,
    /// The same, by the path that asked.
    pub driver_paths: DriverPaths,
}

impl MemoryReport {
    /// Every pool, persistent and dedicated first.
    pub fn pools(&self) -> impl Iterator<Item = &PoolReport> {
        [&self.persistent, &self.dedicated]
            .into_iter()
            .chain(self.dynamic.iter())
    }

    /// The sum over all pools.
    pub fn usage(&self) -> MemoryUsage {
        self.pools().fold(MemoryUsage::default(), |total, pool| {
            total.combine(pool.usage)
        })
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for pool in self.pools() {
            writeln!(f, "  {pool}")?;
        }
        write!(
            f,
            "  total: {}; peaks {} in use, {} reserved",
            self.usage(),
            Bytes(self.peak_bytes_in_use),
            Bytes(self.peak_bytes_reserved)
        )
    }
}

/// Running usage of one pool with its peaks.
#[derive(Debug, Clone, Default)]
pub(crate) struct PoolStats {
    /// Usage now.
    pub(crate) usage: MemoryUsage,
    /// Pages now.
    pub(crate) pages: u64,
    /// Most pages at once.
    pub(crate) pages_peak: u64,
    /// Most bytes in use at once.
    pub(crate) peak_in_use: u64,
    /// Most bytes reserved at once.
    pub(crate) peak_reserved: u64,
    /// Largest allocation served.
    pub(crate) largest_alloc: u64,
}

impl PoolStats {
    /// A report of a pool of `kind` with these stats: no fixed page size,
    /// no outdated pages, no address space beyond its pages (each pool
    /// kind sets what it has).
    pub(crate) fn report(&self, kind: PoolKind, max_alloc_size: u64) -> PoolReport {
        PoolReport {
            kind,
            page_size: None,
            max_alloc_size,
            pages: self.pages,
            outdated_pages: 0,
            pages_peak: self.pages_peak,
            usage: self.usage,
            peak_bytes_in_use: self.peak_in_use,
            peak_bytes_reserved: self.peak_reserved,
            largest_alloc: self.largest_alloc,
            address_space: 0,
        }
    }

    pub(crate) fn allocated(&mut self, size: u64, aligned: u64) {
        self.usage.number_allocs += 1;
        self.usage.bytes_in_use += size;
        self.usage.bytes_padding += aligned - size;
        self.largest_alloc = self.largest_alloc.max(size);
        self.peak_in_use = self.peak_in_use.max(self.usage.bytes_in_use);
    }

    pub(crate) fn freed(&mut self, size: u64, aligned: u64) {
        self.usage.number_allocs -= 1;
        self.usage.bytes_in_use -= size;
        self.usage.bytes_padding -= aligned - size;
    }

    pub(crate) fn page_added(&mut self, size: u64) {
        self.pages += 1;
        self.usage.bytes_reserved += size;
        self.pages_peak = self.pages_peak.max(self.pages);
        self.peak_reserved = self.peak_reserved.max(self.usage.bytes_reserved);
    }

    /// Every page is gone (shutdown); the peaks stay.
    pub(crate) fn clear_usage(&mut self) {
        self.usage = MemoryUsage::default();
        self.pages = 0;
    }

    pub(crate) fn page_removed(&mut self, size: u64) {
        self.pages -= 1;
        self.usage.bytes_reserved -= size;
    }

    /// A range of address space (no bytes until mapped).
    pub(crate) fn range_added(&mut self) {
        self.page_added(0);
    }

    pub(crate) fn range_removed(&mut self) {
        self.page_removed(0);
    }

    /// Bytes mapped in a range: reserved from now on.
    pub(crate) fn mapped(&mut self, bytes: u64) {
        self.usage.bytes_reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.usage.bytes_reserved);
    }

    pub(crate) fn unmapped(&mut self, bytes: u64) {
        self.usage.bytes_reserved -= bytes;
    }
}
