//! Service configuration (skeleton).
