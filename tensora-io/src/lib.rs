//! The data plane: backends that execute a plan into a destination.
