//! Benchmark harness for Tensora.
#![forbid(unsafe_code)]
