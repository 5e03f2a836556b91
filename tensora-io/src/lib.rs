//! The data plane: backends that execute a plan into a destination.

pub mod arena;
pub mod async_load;
pub mod auto;
pub mod backend;
pub mod convert;
pub mod dest;
pub mod error;
pub mod fault;
pub mod load;
pub mod mmap;
pub mod probe;
pub mod registry;
pub mod report;
pub mod sync;
pub mod uring;

pub use backend::{
    CompletionSink, Destination, IoBackend, IoStats, Job, ReadError, ReadErrorKind, SourceFile, StopReason,
};
pub use error::{BoxError, LoadError, ViewError};
pub use report::{LoadReport, Phases};
pub use load::{
    BackendChoice, Element, IoMode, LoadOptions, Loaded, ProgressHook, Residence, TensorHook, TensorRef, load,
    load_path, load_streaming,
};
