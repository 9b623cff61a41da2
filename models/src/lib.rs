//! Formal models of the tenure lifecycle. They drive the real `tenure::machine`; they never restate
//! its rules.
