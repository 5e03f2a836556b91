//! Checksums, manifests and integrity checks.
#![forbid(unsafe_code)]
