//! Streaming conversion between checkpoint layouts, with bounded memory.
