//! What every subcommand reports the same way: the parser's warnings on stderr, and the outcome of
//! writing its result to stdout.

use std::io;

/// Print each of the checkpoint's parser warnings on stderr, one line each: [`warning_line`].
pub fn print_warnings(ckpt: &tensora_format::Checkpoint) {
    for w in ckpt.warnings() {
        eprintln!("{}", warning_line(w));
    }
}

/// `warning: PATH: ...`, one line: newlines as spaces, other control characters [`printable`].
fn warning_line(w: &tensora_format::Warning) -> String {
    let message = w.message.replace('\n', " ");
    format!("warning: {}: {}", printable(&w.path.to_string_lossy()), printable(&message))
}

/// `s` with each control character replaced, so that text from a checkpoint (a name, a path, a
/// metadata value) is one line on a terminal and sends it no escape sequence.
pub fn printable(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { '\u{fffd}' } else { c }).collect()
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
    fn control_characters_do_not_break_lines_or_reach_the_terminal() {
        assert_eq!(printable("a\nb\tc\u{1b}[2J"), "a\u{fffd}b\u{fffd}c\u{fffd}[2J");
        let w = tensora_format::Warning {
            path: "/m/a\u{1b}]0;x\u{7}".into(),
            message: "two\nlines\u{1b}[2J".into(),
        };
        assert_eq!(warning_line(&w), "warning: /m/a\u{fffd}]0;x\u{fffd}: two lines\u{fffd}[2J");
    }

    #[test]
    fn a_closed_pipe_is_success_and_other_errors_are_not() {
        assert!(written(Ok(())).is_ok());
        assert!(written(Err(io::ErrorKind::BrokenPipe.into())).is_ok());
        let e = written(Err(io::Error::other("disk full"))).unwrap_err();
        assert_eq!(format!("{e:#}"), "cannot write to stdout: disk full");
    }
}
