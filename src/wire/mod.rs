//! Publisher payload decoders (skeleton).
