//! PLACEHOLDER criterion bench: replaced by the issue that owns it.
fn main() {}
