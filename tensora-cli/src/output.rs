//! What every subcommand reports the same way: the parser's warnings on stderr, and the outcome of
//! writing its result to stdout.

use std::io;

/// Print each of the checkpoint's parser warnings on stderr, one line each: `warning: PATH: ...`.
pub fn print_warnings(ckpt: &tensora_format::Checkpoint) {
    for w in ckpt.warnings() {
        eprintln!("warning: {}: {}", w.path.display(), w.message.replace('\n', " "));
    }
}

/// The outcome of writing the result to stdout: a reader that left early (`tensora ... | head`)
/// is not an error of ours, any other failure is.
pub fn written(result: io::Result<()>) -> anyhow::Result<()> {
    match result {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("cannot write to stdout"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_success_and_other_errors_are_not() {
        assert!(written(Ok(())).is_ok());
        assert!(written(Err(io::ErrorKind::BrokenPipe.into())).is_ok());
        let e = written(Err(io::Error::other("disk full"))).unwrap_err();
        assert_eq!(format!("{e:#}"), "cannot write to stdout: disk full");
    }
}
