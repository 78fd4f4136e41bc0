//! What a memory manager is built from: the device's limits, the pool layout
//! (a preset or a custom list), the persistent-memory policy, the base mode
//! and the log level, with defaults and environment overrides.

use std::fmt;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// What the device allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceProperties {
    /// The largest single page (device allocation); also the largest
    /// reservation the manager accepts.
    pub max_page_size: u64,
    /// Every allocation starts on a multiple of this (any value >= 1, not
    /// only powers of two).
    pub alignment: u64,
}

impl DeviceProperties {
    /// Properties with the given limits.
    pub const fn new(max_page_size: u64, alignment: u64) -> Self {
        Self {
            max_page_size,
            alignment,
        }
    }
}

impl Default for DeviceProperties {
    /// 1 GiB pages, 256-byte alignment (a CUDA device's texture alignment).
    fn default() -> Self {
        Self::new(1024 * MIB, 256)
    }
}

/// How a pool gets and carves its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Pages of one fixed size, carved into many allocations.
    Sliced {
        /// Size of every page.
        page_size: u64,
    },
    /// Pages carved into many allocations whose size grows with the largest
    /// allocation served; pages of an older size are *outdated*: nothing new
    /// is carved from them, and a relocation can empty them.
    Adaptive {
        /// The first (smallest) page size.
        min_page_size: u64,
    },
    /// Address space reserved in ranges of `range_size` bytes (more for a
    /// larger allocation), memory mapped behind it a granule at a time and
    /// unmapped where whole granules lie free: reserved bytes are the mapped
    /// ones. Needs a storage with virtual memory
    /// ([`DeviceStorage::granule`](crate::storage::DeviceStorage::granule));
    /// on one without, the pool is an adaptive arena.
    Expandable {
        /// Bytes of address space per range.
        range_size: u64,
    },
    /// One allocation per page, pages binned by size (at most 12.5% over).
    ExclusivePages,
    /// Exact-size pages for weights, reused only by the same size.
    Persistent,
    /// One device allocation per reservation, returned on the serial after
    /// it is freed.
    Dedicated,
}

/// One dynamic pool of a [`MemoryConfiguration::Custom`] layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// How it gets and carves pages ([`PoolKind::Sliced`], `Adaptive` or
    /// `ExclusivePages`).
    pub kind: PoolKind,
    /// The largest reservation it serves; a reservation goes to the first
    /// pool (in order of this bound) that serves its size.
    pub max_alloc_size: u64,
    /// Reservations after which an unused page goes back to the device in a
    /// periodic cleanup; `None` keeps pages until an explicit cleanup.
    pub dealloc_period: Option<u64>,
}

/// The layout of the dynamic pools.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MemoryConfiguration {
    /// Expandable arenas (see [`PoolKind::Expandable`]) where the storage
    /// has virtual memory, the [`Adaptive`](Self::Adaptive) layout where it
    /// has not. The default.
    #[default]
    Expandable,
    /// A metadata pool of 8 MiB pages for reservations up to 64 KiB, and an
    /// adaptive arena (2 MiB pages and up) for the rest.
    Adaptive,
    /// One reservation per page, size-binned.
    ExclusivePages,
    /// These pools.
    Custom(Vec<PoolConfig>),
}

/// Reservations a page may sit unused before a periodic cleanup returns it.
pub(crate) const DEFAULT_DEALLOC_PERIOD: u64 = 1000;

/// The default [`MemoryConfig::free_slack_one_in`]: about 3 % of the
/// bytes in use, as `EVACUATE_WHEN_FREE_ONE_IN`:
/// the rest of a 5 % bound on peak reserved over peak live is the granules'
/// rounding.
pub(crate) const DEFAULT_FREE_SLACK_ONE_IN: u64 = 32;

/// The default [`MemoryConfig::compaction_threshold`].
pub(crate) const DEFAULT_COMPACTION_THRESHOLD: f64 = 1.5;

/// The largest reservation the `Adaptive` preset's metadata pool serves.
pub(crate) const METADATA_MAX_ALLOC: u64 = 64 * KIB;
/// The page size of the `Adaptive` preset's metadata pool.
pub(crate) const METADATA_PAGE_SIZE: u64 = 8 * MIB;
/// The first page size of the `Adaptive` preset's arena.
pub(crate) const ADAPTIVE_MIN_PAGE_SIZE: u64 = 2 * MIB;
/// Reservations a free granule of the `Expandable` preset stays mapped
/// before a periodic cleanup unmaps it. Short, because a stream's freed
/// granules are memory every other stream could map, and a growth unmaps
/// them anyway; not zero, because a granule freed and wanted again at the
/// next reservation (a decode step's activations) should not be unmapped
/// and mapped each time. Measured in `git show d502a2e:docs/performance.md` (16 against
/// 1000 took the 4-stream serving trace, managers alone, from 1.374 to
/// 1.154 peak reserved / peak live).
pub(crate) const EXPANDABLE_DEALLOC_PERIOD: u64 = 16;
/// Bytes of address space an expandable range of the `Expandable` preset
/// reserves: far more than any stream maps, so one range serves a stream's
/// life (address space costs nothing until mapped).
pub(crate) const EXPANDABLE_RANGE_SIZE: u64 = 256 * 1024 * MIB;

impl MemoryConfiguration {
    /// The pools this layout stands for on a device with `properties`, in
    /// routing order.
    pub fn pools(&self, properties: &DeviceProperties) -> Vec<PoolConfig> {
        let max = properties.max_page_size;
        let mut pools = match self {
            Self::Expandable => vec![PoolConfig {
                kind: PoolKind::Expandable {
                    range_size: EXPANDABLE_RANGE_SIZE,
                },
                max_alloc_size: max,
                dealloc_period: Some(EXPANDABLE_DEALLOC_PERIOD),
            }],
            Self::Adaptive => vec![
                PoolConfig {
                    kind: PoolKind::Sliced {
                        page_size: METADATA_PAGE_SIZE.min(max),
                    },
                    max_alloc_size: METADATA_MAX_ALLOC.min(max),
                    dealloc_period: Some(DEFAULT_DEALLOC_PERIOD),
                },
                PoolConfig {
                    kind: PoolKind::Adaptive {
                        min_page_size: ADAPTIVE_MIN_PAGE_SIZE.min(max),
                    },
                    max_alloc_size: max,
                    dealloc_period: Some(DEFAULT_DEALLOC_PERIOD),
                },
            ],
            Self::ExclusivePages => vec![PoolConfig {
                kind: PoolKind::ExclusivePages,
                max_alloc_size: max,
                dealloc_period: Some(DEFAULT_DEALLOC_PERIOD),
            }],
            Self::Custom(pools) => pools.clone(),
        };
        pools.sort_by_key(|pool| pool.max_alloc_size);
        pools
    }
}

/// How the persistent pool takes part in reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PersistentMemory {
    /// Only inside a persistent window.
    #[default]
    Enabled,
    /// Inside a window, and outside one for a size the pool already holds
    /// (weights reloaded, training steps).
    SizeMatch,
    /// Never: a persistent window keeps the base mode.
    Disabled,
    /// Always: the base mode is persistent.
    Enforced,
}

/// Where a reservation goes, as the innermost open window says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum AllocationMode {
    /// The dynamic pools (the persistent pool too under `SizeMatch`).
    #[default]
    Auto,
    /// The persistent pool.
    Persistent,
    /// The dedicated pool.
    Dedicated,
}

/// How much the manager logs through `tracing` (the seed's levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum MemoryLogLevel {
    /// Nothing.
    #[default]
    Disabled,
    /// Mode changes, new pages, cleanups (at `debug`).
    Basic,
    /// Every reservation too (at `trace`).
    Full,
}

/// A value an environment variable may not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?} is not one of {expected}")]
pub struct ConfigError {
    /// The variable.
    pub variable: &'static str,
    /// What it held.
    pub value: String,
    /// What it may hold.
    pub expected: &'static str,
}

/// Everything a [`MemoryManager`](super::MemoryManager) is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryConfig {
    /// A name for logs and reports.
    pub name: String,
    /// The device's limits.
    pub device: DeviceProperties,
    /// The dynamic pools.
    pub pools: MemoryConfiguration,
    /// The persistent-memory policy.
    pub persistent: PersistentMemory,
    /// A mode forced as the base, whatever `persistent` says.
    pub mode: Option<AllocationMode>,
    /// Log level.
    pub log: MemoryLogLevel,
    /// Deallocation period of the persistent pool (`None`: explicit cleanup only).
    pub persistent_dealloc_period: Option<u64>,
    /// When a sliced pool's pages hold more than this many times the bytes
    /// carved from them (and at least a page's worth more),
    /// [`relocation_need`](super::MemoryManager::relocation_need) asks for a
    /// compaction. `None`: only outdated pages are relocated unasked.
    pub compaction_threshold: Option<f64>,
    /// The free room an expandable pool keeps mapped after a reservation
    /// that may change pages: one in this many of the bytes its
    /// allocations hold (and a granule). Past that, whole free granules
    /// are unmapped at once, the longest idle first, instead of after the
    /// pool's deallocation period; `Some(0)` keeps a granule. A manager
    /// acts only when called: what its stream freed just before going
    /// quiet would stay mapped, a period's worth, while the other streams
    /// of the device peak (in a service too, until its supervisor asked).
    /// A pool that trims does not also evacuate for free room before a
    /// growth (`Evacuate::MostlyFree`): the trim keeps that room at the
    /// slack, and what it leaves, parts of granules, every growth would
    /// evacuate again. The price is mapping again what a churning stream
    /// wants back soon: on the benches' mixed ring, 1.04 times the
    /// instructions (`git show d502a2e:docs/performance.md`). `None`: free granules wait
    /// for the period, and growths evacuate.
    pub free_slack_one_in: Option<u64>,
    /// An expandable pool keeps free granules mapped up to the most its
    /// allocations have held at once (and its slack): a stream that rises
    /// to its peak again maps nothing, and the trim, the periodic sweep and
    /// the unmapping before a growth stop at that level (nor does the pool
    /// want a compaction below it).
    /// Memory below it goes back only when asked for: an explicit cleanup
    /// (a give-back round, the headroom, settle, the caller), a relocation
    /// or compaction the caller asks for, or the stream going quiet (the
    /// service's idle tick); the service's compaction timer asks such a
    /// stream only when its pools want compacting (`relocation_need`). On by default, with the service's 1 % headroom
    /// (`Headroom::for_memory`): the modeled driver time of the placement
    /// corpus falls 2-700x at the same peaks (`docs/performance.md`,
    /// "What each decision costs"). `false`: the trim after every
    /// reservation keeps only `free_slack_one_in` free.
    pub keep_peak_mapped: bool,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            name: "memory".into(),
            device: DeviceProperties::default(),
            pools: MemoryConfiguration::Expandable,
            persistent: PersistentMemory::Enabled,
            mode: None,
            log: MemoryLogLevel::Disabled,
            persistent_dealloc_period: None,
            compaction_threshold: Some(DEFAULT_COMPACTION_THRESHOLD),
            free_slack_one_in: Some(DEFAULT_FREE_SLACK_ONE_IN),
            keep_peak_mapped: true,
        }
    }
}

/// The environment variable for [`MemoryConfig::persistent`].
pub const ENV_PERSISTENT_MEMORY: &str = "STREAMALLOC_PERSISTENT_MEMORY";
/// The environment variable for [`MemoryConfig::log`].
pub const ENV_MEMORY_LOG: &str = "STREAMALLOC_MEMORY_LOG";

impl MemoryConfig {
    /// The defaults with the pool layout `pools`.
    pub fn with_pools(pools: MemoryConfiguration) -> Self {
        Self {
            pools,
            ..Self::default()
        }
    }

    /// These settings overridden by the environment, as CubeCL reads its
    /// global runtime config: `STREAMALLOC_PERSISTENT_MEMORY` (`enabled`,
    /// `size-match`, `disabled`, `enforced`) and `STREAMALLOC_MEMORY_LOG`
    /// (`disabled`, `basic`, `full`). Unset variables leave the setting alone.
    pub fn from_env(mut self) -> Result<Self, ConfigError> {
        self.apply_env(|name| std::env::var(name).ok())?;
        Ok(self)
    }

    /// [`from_env`](Self::from_env) over any lookup (testable without
    /// touching the process environment).
    pub fn apply_env(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        if let Some(value) = lookup(ENV_PERSISTENT_MEMORY) {
            self.persistent = match value.trim().to_ascii_lowercase().as_str() {
                "enabled" => PersistentMemory::Enabled,
                "size-match" | "size_match" => PersistentMemory::SizeMatch,
                "disabled" => PersistentMemory::Disabled,
                "enforced" => PersistentMemory::Enforced,
                _ => {
                    return Err(ConfigError {
                        variable: ENV_PERSISTENT_MEMORY,
                        value,
                        expected: "enabled, size-match, disabled, enforced",
                    });
                }
            };
        }
        if let Some(value) = lookup(ENV_MEMORY_LOG) {
            self.log = match value.trim().to_ascii_lowercase().as_str() {
                "disabled" | "off" => MemoryLogLevel::Disabled,
                "basic" => MemoryLogLevel::Basic,
                "full" => MemoryLogLevel::Full,
                _ => {
                    return Err(ConfigError {
                        variable: ENV_MEMORY_LOG,
                        value,
                        expected: "disabled, basic, full",
                    });
                }
            };
        }
        Ok(())
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sliced { page_size } => {
                write!(f, "sliced ({} pages)", super::bytes::Bytes(*page_size))
            }
            Self::Adaptive { min_page_size } => {
                write!(
                    f,
                    "adaptive (from {} pages)",
                    super::bytes::Bytes(*min_page_size)
                )
            }
            Self::Expandable { range_size } => write!(
                f,
                "expandable ({} ranges)",
                super::bytes::Bytes(*range_size)
            ),
            Self::ExclusivePages => f.write_str("exclusive pages"),
            Self::Persistent => f.write_str("persistent"),
            Self::Dedicated => f.write_str("dedicated"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_overrides_and_rejects() {
        let mut config = MemoryConfig::default();
        config
            .apply_env(|name| (name == ENV_PERSISTENT_MEMORY).then(|| "size-match".into()))
            .unwrap();
        assert_eq!(config.persistent, PersistentMemory::SizeMatch);
        let err = config
            .apply_env(|name| (name == ENV_MEMORY_LOG).then(|| "loud".into()))
            .unwrap_err();
        assert_eq!(err.variable, ENV_MEMORY_LOG);
        assert!(err.to_string().contains("loud"));
    }
}
