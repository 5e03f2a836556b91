//! The one progress bar of every subcommand: on stderr, only when stderr is a terminal (never when
//! piped or redirected), counting bytes with their rate and an ETA, and fed by the libraries'
//! `(done, total)` callbacks (`tensora_io::ProgressHook`, `tensora_verify::ProgressFn` and
//! `tensora_convert::ConvertProgress` are the same type).

use std::io::IsTerminal;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use tensora_io::ProgressHook;

/// What the bar shows after its label: bar, bytes done and total, rate, time left.
const TEMPLATE: &str =
    "{msg} [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}";

/// Whether a subcommand wants a bar at all (a terminal is needed either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    /// Draw it when stderr is a terminal.
    OnTerminal,
    /// Never draw it (e.g. `load --json`, whose output is for a machine).
    Never,
}

/// A byte progress bar, or nothing when it is not shown. Cleared when finished or dropped, so an
/// error line never lands beside a half-drawn bar.
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar labelled `label` (`loading`, `hashing`, ...) over `total_bytes` (0 when the total
    /// comes with the first callback), drawn only as `show` allows and only on a terminal.
    pub fn new(show: Show, label: &'static str, total_bytes: u64) -> Progress {
        let drawn = show == Show::OnTerminal && std::io::stderr().is_terminal();
        Progress { bar: drawn.then(|| bar(label, total_bytes)) }
    }

    /// A callback for a library's `progress` option, moving the bar to `done` of `total` bytes;
    /// `None` when no bar is drawn (the library then skips the accounting).
    pub fn hook(&self) -> Option<ProgressHook> {
        let bar = self.bar.clone()?;
        Some(Arc::new(move |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        }))
    }

    /// Clear the bar.
    pub fn finish(self) {
        drop(self);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn bar(label: &'static str, total_bytes: u64) -> ProgressBar {
    let style = ProgressStyle::with_template(TEMPLATE)
        .map_or_else(|_| ProgressStyle::default_bar(), |s| s.progress_chars("=> "));
    ProgressBar::new(total_bytes).with_style(style).with_message(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_parses() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
    }

    #[test]
    fn a_hidden_bar_has_no_hook() {
        let progress = Progress::new(Show::Never, "testing", 10);
        assert!(progress.hook().is_none());
        progress.finish();
    }

    #[test]
    fn the_hook_moves_the_bar_to_the_library_total() {
        let progress = Progress { bar: Some(ProgressBar::hidden()) };
        let hook = progress.hook().unwrap();
        hook(3, 8);
        let bar = progress.bar.as_ref().unwrap();
        assert_eq!((bar.position(), bar.length()), (3, Some(8)));
        hook(8, 8);
        assert_eq!(bar.position(), 8);
    }
}
