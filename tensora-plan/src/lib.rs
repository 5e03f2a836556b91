//! Pure planning for checkpoint loads.
#![forbid(unsafe_code)]

mod types;

pub use types::{Extent, FileQueue, Piece, PlanConfig, Read, TagLocation};
