//! Per-context prefix indexes (skeleton).
