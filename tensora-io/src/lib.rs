//! The data plane: backends that execute a plan into a destination.

pub mod backend;
pub mod convert;

pub use backend::{
    CompletionSink, Destination, IoBackend, IoStats, Job, ReadError, ReadErrorKind, SourceFile, StopReason,
};
