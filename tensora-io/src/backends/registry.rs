//! Every built-in backend, by name. Adding a backend is one file implementing
//! [`IoBackend`] plus one line in `REGISTRY`; a backend defined outside this
//! crate is passed as [`BackendChoice::Custom`](crate::BackendChoice::Custom) instead (see
//! `examples/custom_backend.rs`).
//!
//! ```
//! let names = tensora_io::registry::names();
//! assert!(names.contains(&"sync"));
//! let b = tensora_io::registry::by_name("sync").unwrap();
//! assert_eq!(b.name(), "sync");
//! assert!(tensora_io::registry::by_name("nope").is_none());
//! ```

use crate::seam::IoBackend;

/// One registered backend: its `--backend` name and a constructor.
type Entry = (&'static str, fn() -> Box<dyn IoBackend>);

/// The registry: one line per backend.
const REGISTRY: &[Entry] = &[
    ("sync", || Box::new(super::sync::SyncBackend::default())),
    ("mmap", || Box::new(super::mmap::MmapBackend::default())),
    ("io-uring", || Box::new(super::uring::UringBackend::default())),
    #[cfg(feature = "async")]
    ("async", || Box::new(super::async_tokio::AsyncBackend::default())),
];

/// The names of every registered backend, in registry order.
pub fn names() -> &'static [&'static str] {
    const NAMES: [&str; REGISTRY.len()] = {
        let mut out = [""; REGISTRY.len()];
        let mut i = 0;
        while i < REGISTRY.len() {
            out[i] = REGISTRY[i].0;
            i += 1;
        }
        out
    };
    &NAMES
}

/// A fresh instance of every registered backend.
pub fn backends() -> Vec<Box<dyn IoBackend>> {
    REGISTRY.iter().map(|(_, make)| make()).collect()
}

/// The backend registered as `name`.
pub fn by_name(name: &str) -> Option<Box<dyn IoBackend>> {
    REGISTRY.iter().find(|(n, _)| *n == name).map(|(_, make)| make())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_instances_and_are_unique() {
        let backends = backends();
        assert_eq!(backends.len(), names().len());
        for (b, n) in backends.iter().zip(names()) {
            assert_eq!(b.name(), *n);
            assert_eq!(by_name(n).map(|b| b.name()), Some(*n));
        }
        let mut sorted = names().to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names().len());
    }
}
