//! What a load decides before it reads: the residence, the backend and buffered or direct I/O,
//! as the caller named them or as `auto` chose them from the facts, with the one-line reason.

use std::sync::Arc;

use tensora_format::Checkpoint;

use super::{BackendChoice, LoadOptions, Residence};
use crate::auto::{self, Delivery};
use crate::error::LoadError;
use crate::seam::{IoBackend, Reading};

/// The residence, backend and I/O mode of one load, and the one-line reason.
pub(super) struct Decided {
    pub(super) residence: Residence,
    pub(super) backend: Arc<dyn IoBackend>,
    pub(super) backend_name: String,
    pub(super) reading: Reading,
    pub(super) reason: String,
}

impl Decided {
    /// What the caller named, or what `auto` chose from the facts.
    pub(super) fn for_load(
        ckpt: &Checkpoint,
        opts: &LoadOptions,
        selected: &[usize],
        delivery: Delivery,
        pieces: auto::Pieces,
    ) -> Result<Decided, LoadError> {
        let (backend, reason) = match &opts.backend {
            BackendChoice::Auto => {
                let asked = auto::Asked {
                    delivery,
                    residence: opts.residence,
                    io_mode: opts.io_mode,
                    budget_bytes: opts.budget_bytes,
                    pieces,
                };
                let choice = auto::choose(&auto::gather(ckpt, selected, asked));
                let backend = by_name(choice.backend)?;
                let backend_name = backend.name().to_owned();
                return Ok(Decided {
                    residence: choice.residence,
                    backend,
                    backend_name,
                    reading: choice.reading,
                    reason: choice.reason,
                });
            }
            BackendChoice::Named(n) => (by_name(n)?, format!("backend {n} requested")),
            BackendChoice::Custom(b) => (Arc::clone(b), "custom backend".to_owned()),
        };
        let backend_name = backend.name().to_owned();
        Ok(match opts.residence {
            // Mapped views never run a backend: name what actually serves the bytes.
            Residence::Mapped(promise) => Decided {
                residence: Residence::Mapped(promise),
                backend,
                backend_name: "mmap".to_owned(),
                reading: auto::READ_AHEAD_COLD,
                reason: format!("mapped: residence \"mapped\" (views run no backend; {reason})"),
            },
            Residence::Owned => Decided {
                residence: Residence::Owned,
                backend,
                backend_name,
                reading: auto::READ_AHEAD_COLD,
                reason,
            },
            Residence::Auto(_) => Decided {
                residence: Residence::Owned,
                backend,
                backend_name,
                reading: auto::READ_AHEAD_COLD,
                reason: format!("owned: a backend was named (it copies into the arena); {reason}"),
            },
        })
    }
}

/// The registered backend `name`, or [`LoadError::UnknownBackend`] listing the known ones.
fn by_name(name: &str) -> Result<Arc<dyn IoBackend>, LoadError> {
    crate::registry::by_name(name).map(Arc::from).ok_or_else(|| LoadError::UnknownBackend {
        name: name.to_owned(),
        known: crate::registry::names().join(", "),
    })
}
