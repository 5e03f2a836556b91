//! Python bindings (being built).
