//! What the library reads from the environment, once, at its first call:
//! the storage, the pool layout, a budget or a fraction of it, and the
//! device-wide policies.

use streamalloc::memory::{Bytes, DeviceProperties, MemoryConfig, MemoryConfiguration};
use streamalloc::service::{Headroom, ServiceConfig, Settle};

/// Where device memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageChoice {
    /// Real host memory: pointers PyTorch could not use on a GPU, but
    /// bytes a test can read and write.
    Host,
    /// Addresses and counts only: for tracing what a program would need.
    Virtual,
    /// The GPU's memory (feature `cuda`), in the device's primary context
    /// (PyTorch's).
    Cuda,
}

/// The library's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `STREAMALLOC_TORCH_STORAGE`: `host` (the default) or `virtual`.
    pub storage: StorageChoice,
    /// `STREAMALLOC_TORCH_CONFIG`: `adaptive` (the default), `expandable`
    /// or `exclusive`. Adaptive pages by default: on an H200, PyTorch
    /// programs stepped 1.1-1.6x PyTorch's time on them against 1.7-23x on
    /// expandable arenas, which give granules back at many reservations
    /// and wait for the device each time (`docs/torch.md`; issue 43).
    pub pools: MemoryConfiguration,
    /// `STREAMALLOC_TORCH_BUDGET`: bytes a device may hold, as
    /// [`Bytes`] parses a size (`512M`, `80GB`).
    pub budget: Option<u64>,
    /// `STREAMALLOC_TORCH_HEADROOM`: a fraction, or `off`.
    pub headroom: Option<Headroom>,
    /// `STREAMALLOC_TORCH_SETTLE`: a ratio, or `off`.
    pub settle: Option<Settle>,
    /// `STREAMALLOC_TORCH_DEVICE_BYTES`: the largest allocation a device
    /// serves (1 TiB by default).
    pub device_bytes: u64,
    /// `STREAMALLOC_TORCH_HANDLE_SHARE`: expandable arenas cut physical
    /// handles at up to one in this many of the granules a range holds
    /// ([`ServiceConfig::handle_share`]; 64 by default).
    pub handle_share: Option<u64>,
}

/// A value the environment gave that means nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Config {
    /// Read from `get` (the environment, or a test's map).
    pub fn read(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let bad =
            |name: &str, value: &str, what: &str| ConfigError(format!("{name}={value:?}: {what}"));
        let storage = match get("STREAMALLOC_TORCH_STORAGE").as_deref() {
            None | Some("host") => StorageChoice::Host,
            Some("virtual") => StorageChoice::Virtual,
            Some("cuda") if cfg!(feature = "cuda") => StorageChoice::Cuda,
            Some(other) => {
                return Err(bad(
                    "STREAMALLOC_TORCH_STORAGE",
                    other,
                    if cfg!(feature = "cuda") {
                        "host, virtual or cuda"
                    } else {
                        "host or virtual (cuda needs a build with --features cuda)"
                    },
                ));
            }
        };
        let pools = match get("STREAMALLOC_TORCH_CONFIG").as_deref() {
            Some("expandable") => MemoryConfiguration::Expandable,
            None | Some("adaptive") => MemoryConfiguration::Adaptive,
            Some("exclusive") => MemoryConfiguration::ExclusivePages,
            Some(other) => {
                return Err(bad(
                    "STREAMALLOC_TORCH_CONFIG",
                    other,
                    "adaptive, expandable or exclusive",
                ));
            }
        };
        let bytes = |name: &str| -> Result<Option<u64>, ConfigError> {
            get(name)
                .map(|value| {
                    value
                        .parse::<Bytes>()
                        .map(|bytes| bytes.0)
                        .ok()
                        .ok_or_else(|| bad(name, &value, "a size (512M, 80GB, ...)"))
                })
                .transpose()
        };
        let budget = bytes("STREAMALLOC_TORCH_BUDGET")?;
        let device_bytes = bytes("STREAMALLOC_TORCH_DEVICE_BYTES")?.unwrap_or(1 << 40);
        let handle_share = get("STREAMALLOC_TORCH_HANDLE_SHARE")
            .map(|value| match value.parse::<u64>() {
                Ok(one_in) if one_in > 0 => Ok(one_in),
                _ => Err(bad(
                    "STREAMALLOC_TORCH_HANDLE_SHARE",
                    &value,
                    "a whole number of at least 1",
                )),
            })
            .transpose()?;
        let number_or_off = |name: &str, least: f64| -> Result<Option<Option<f64>>, ConfigError> {
            match get(name) {
                None => Ok(None),
                Some(value) if value == "off" => Ok(Some(None)),
                Some(value) => match value.parse::<f64>() {
                    Ok(v) if v.is_finite() && v >= least => Ok(Some(Some(v))),
                    _ => Err(bad(
                        name,
                        &value,
                        &format!("a number of at least {least}, or off"),
                    )),
                },
            }
        };
        let defaults = ServiceConfig::default();
        let headroom = match number_or_off("STREAMALLOC_TORCH_HEADROOM", 0.0)? {
            None => defaults.headroom,
            Some(fraction) => fraction.map(|fraction| Headroom {
                fraction,
                ..Headroom::default()
            }),
        };
        let settle = match number_or_off("STREAMALLOC_TORCH_SETTLE", 1.0)? {
            None => defaults.settle,
            Some(ratio) => ratio.map(|ratio| Settle {
                ratio,
                ..Settle::default()
            }),
        };
        Ok(Self {
            storage,
            pools,
            budget,
            headroom,
            settle,
            device_bytes,
            handle_share,
        })
    }

    /// The service of one device under this configuration, with `budget`
    /// (this configuration's, or a fraction PyTorch set).
    pub fn service(&self, budget: Option<u64>) -> ServiceConfig {
        ServiceConfig {
            memory: MemoryConfig {
                name: "torch".into(),
                device: DeviceProperties::new(self.device_bytes, 512),
                ..MemoryConfig::with_pools(self.pools.clone())
            },
            budget,
            headroom: self.headroom,
            settle: self.settle,
            handle_share: self.handle_share,
            ..ServiceConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::read(|name| map.get(name).cloned())
    }

    #[test]
    fn the_environment_is_read_and_checked() {
        let config = read(&[]).unwrap();
        assert_eq!(config.storage, StorageChoice::Host);
        assert_eq!(config.pools, MemoryConfiguration::Adaptive);
        assert_eq!(config.budget, None);
        assert_eq!(config.service(None).handle_share, None);
        let config = read(&[
            ("STREAMALLOC_TORCH_STORAGE", "virtual"),
            ("STREAMALLOC_TORCH_BUDGET", "512M"),
            ("STREAMALLOC_TORCH_HEADROOM", "off"),
            ("STREAMALLOC_TORCH_HANDLE_SHARE", "16"),
        ])
        .unwrap();
        assert_eq!(config.service(None).handle_share, Some(16));
        assert_eq!(config.storage, StorageChoice::Virtual);
        assert_eq!(config.budget, Some(512 << 20));
        assert!(config.headroom.is_none());
        for (name, value) in [
            ("STREAMALLOC_TORCH_STORAGE", "gpu"),
            ("STREAMALLOC_TORCH_BUDGET", "lots"),
            ("STREAMALLOC_TORCH_SETTLE", "0.5"),
            ("STREAMALLOC_TORCH_CONFIG", "x"),
            ("STREAMALLOC_TORCH_HANDLE_SHARE", "0"),
            ("STREAMALLOC_TORCH_HANDLE_SHARE", "a lot"),
        ] {
            let err = read(&[(name, value)]).unwrap_err();
            assert!(err.0.contains(name), "{err}");
        }
    }
}
