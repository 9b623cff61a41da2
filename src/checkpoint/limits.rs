//! The one set of limits a checkpoint must meet, shared by the writer and the reader (card P2:
//! publish accepts only what load accepts).
//!
//! [`Limits::DEFAULT`] is defined here and nowhere else. `publish` checks every limit before
//! anything durable is written (names, depth and the number of files while it walks the
//! staging area, and an upper bound of the manifest's size before the first blob), and `load`
//! refuses a manifest past any of them, so a checkpoint that was acknowledged always loads.
//! None of the limits is about descriptors: every walk of the store holds a fixed number of
//! them whatever the depth (see `tree`), so the same `RLIMIT_NOFILE` that lets a publish run
//! lets the load run.

/// Limits of one checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Files in one checkpoint.
    pub max_entries: u64,
    /// Components of one entry name (`a/b/c` has 3): how deep a staging area may nest.
    pub max_depth: usize,
    /// Bytes of one entry name (PATH_MAX on Linux).
    pub max_name_len: usize,
    /// Bytes of one name component (NAME_MAX on Linux).
    pub max_component_len: usize,
    /// Bytes of one manifest file.
    pub max_manifest_bytes: u64,
}

impl Limits {
    /// The limits of every store unless a test asks for smaller ones: large enough for real
    /// workloads (a million small files, node_modules-deep trees, any name the kernel allows)
    /// while bounding what a hostile manifest can make a reader do.
    pub const DEFAULT: Limits = Limits {
        max_entries: 4_000_000,
        max_depth: 256,
        max_name_len: 4096,
        max_component_len: 255,
        max_manifest_bytes: 1 << 30,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// The longest line of a manifest (format 2) a reader accepts. Every line a writer can produce
/// under [`Limits::DEFAULT`] is shorter: an entry line is at most [`ENTRY_LINE_OVERHEAD`] plus
/// the JSON-escaped name (at most 6 bytes per byte of a 4,096-byte name).
pub const MAX_LINE: usize = 32 * 1024;

/// The bytes of an entry line besides its escaped name, with the largest size (20 digits) and
/// mode (3 digits): `{"name":"","size":,"sha256":"<64>","mode":}` and the newline.
pub const ENTRY_LINE_OVERHEAD: u64 = 127;

/// The largest manifest of format 1 (written by earlier versions as one JSON document) that is
/// still read. Such a manifest is parsed whole, so it keeps a bound of its own.
pub const LEGACY_MAX_MANIFEST_BYTES: u64 = 64 << 20;
