//! The checkpoint store: content-addressed blobs, a digest-checked manifest per checkpoint and a
//! durable `CURRENT` pointer (cards G3, G4, L1, H5).
//!
//! # Layout (all under `<state dir>/checkpoints/`, directories 0700, files 0600 or 0400)
//! ```text
//! CURRENT                    "<20-digit id> <sha256 of the manifest file>\n"
//! manifests/<id>.json        format 2: a header line (id, parent id, writing epoch, created-at,
//!                            number of files), then one line per file (name/size/sha256/mode)
//! blobs/sha256/<hex>         file contents, named by their sha256, read-only (0400)
//! staging/<random>/          scratch areas a writer fills for the next publish
//! views/<random>/            read-only copies of a checkpoint's files for a reader
//! failed/<epoch>             the staged output of a failed publish, kept (newest `keep`)
//! ```
//!
//! # Limits, streaming and descriptors (cards P1 and P2)
//! One set of [`Limits`] is checked by publish before anything durable and by every load, so
//! what publish acknowledges always loads. Manifests are written and read a line at a time
//! ([`ManifestReader`]); a million-file checkpoint publishes and loads in memory that does not
//! grow with the number of files, and format-1 manifests of earlier versions still load. No
//! walk recurses, and every walk (publish, views, scratch removal, GC) holds a bounded number of
//! directory descriptors at any depth (`tree`).
//!
//! # Publish protocol ([`CheckpointStore::publish`])
//! Fence on the epoch; write each new blob into `incoming/` (temp, `renameat` to its digest
//! without replacing); make the new blobs and the manifest durable in one batch (a `syncfs`; a
//! blob of 1 MiB or more gets its own `fdatasync` instead, and when every new blob did, the
//! batch is the manifest's fsync alone — see [`plan::PublishPlan`]); move the blobs into
//! `blobs/sha256/` and the manifest into place, and fsync those directories; fence again;
//! replace `CURRENT` (temp in the same directory, fsync, `renameat`, fsync the directory). The
//! publish is acknowledged only after that last fsync returns, and only then are superseded
//! manifests and blobs collected (keeping the last `keep` checkpoints; manifests before blobs;
//! the deletions are not fsynced, because a deletion lost in a power cut only leaves garbage for
//! the next GC). Blobs already present are not rewritten. While a large blob is written, sha256
//! runs on a helper thread and writeback is started every 8 MiB (`fadvise(DONTNEED)`), so
//! hashing, copying and the disk overlap and its fsync has little left to do. Every failure
//! before the `CURRENT` rename leaves `CURRENT` untouched; an fsync
//! error is never retried on the same descriptor (privfs consumes the file, and poisons a
//! directory, so the store must be reopened). `store::replace_current` is the only function in
//! the crate that replaces `CURRENT`.
//!
//! # Load ([`CheckpointStore::load`])
//! Reads `CURRENT` strictly, checks the manifest's sha256 against it, then streams every blob
//! through sha256 with one fixed buffer, checking size and digest. Any mismatch is a typed
//! refusal naming the file; nothing is repaired, deleted or silently replaced by an older
//! checkpoint. [`CheckpointStore::report`] is the best-effort read-only mode for `tenure verify`
//! and `status`: it also names the newest fully valid *older* checkpoint, without using it.
//!
//! # Staging areas and nested directories
//! A staging area is an empty private directory the writer (the runner's child, through
//! `TENURE_CHECKPOINT_OUT`) fills. Nested directories are flattened into entry names with `/`
//! separators (`dir/sub/file`) and re-created by views; empty directories are not recorded.
//! Symlinks, FIFOs, sockets and devices are refused with [`CheckpointError::UnsupportedFile`], and
//! names that are not UTF-8 with [`CheckpointError::BadEntryName`]. An area with no file means
//! "nothing to publish" ([`Published::Unchanged`]), and so does an area whose files equal the
//! current checkpoint's exactly (card L1: a run that changes nothing leaves CURRENT's bytes as
//! they were).
//!
//! # Views are copies, never hard links
//! The reader of a view (the runner's child) runs as our uid, so mode bits do not stop it: it
//! may `chmod u+w` any file it can reach and write through it. A hard link to a blob would let it
//! rewrite the blob of a published checkpoint. Views are therefore copies (files 0400 or 0500,
//! directories 0500), and the copy is hashed as it is written, so the view is also verified.
//!
//! # Crash points
//! With the `failpoints` feature each step of a publish is a named crash point
//! ([`FAILPOINTS`]); tests kill a child process at each one and check that load then yields the
//! old or the new checkpoint, never anything else.

pub mod error;
pub mod format;
// Garbage collection's plan and the hashing pipeline are the store's internals (the reader a
// user needs is re-exported below as `VerifyingReader`).
#[doc(hidden)]
pub mod gc;
#[doc(hidden)]
pub mod hash;
pub mod limits;
pub mod plan;
mod store;
mod tree;

pub use error::CheckpointError;
pub use format::{
    CheckpointId, Current, Digest, Entry, EntryCheck, FormatError, Header, Manifest, ManifestReader,
};
pub use hash::VerifyingReader;
pub use limits::Limits;
pub use store::{
    Checkpoint, CheckpointStore, CheckpointSummary, CurrentPointer, GcReport, Listed, PublishFile,
    Published, Source, Staging, StoreOptions, VerifyReport, View, failed_name, highest_epoch,
};
pub(crate) use store::{KeptFailure, OwnedDirs};

/// The store's directory inside a state dir.
pub const STORE_DIR: &str = "checkpoints";
/// The pointer file inside [`STORE_DIR`].
pub const CURRENT_FILE: &str = "CURRENT";
/// The manifests directory inside [`STORE_DIR`].
pub const MANIFESTS_DIR: &str = "manifests";
/// The blobs directory inside [`STORE_DIR`]; blobs live in its `sha256/` subdirectory.
pub const BLOBS_DIR: &str = "blobs";
/// The blob subdirectory for sha256-named blobs.
pub const SHA256_DIR: &str = "sha256";
/// The staging areas' directory inside [`STORE_DIR`].
pub const STAGING_DIR: &str = "staging";
/// The views' directory inside [`STORE_DIR`].
pub const VIEWS_DIR: &str = "views";
/// Where the staged output of a failed publish is kept, as `failed/<epoch>` (card P1).
pub const FAILED_DIR: &str = "failed";

/// Every crash point of a publish, in the order a publish of new files over an earlier
/// checkpoint reaches them ([`plan::PublishPlan`]): each step is `<label>.<step>`, plus
/// `publish.acked` (after the `CURRENT` directory fsync, before GC) and the GC steps. Tests
/// iterate over this list, so a new step shows up in the crash sweep by being added here. A
/// publish that adopts staged files reaches `publish.adopt.link` (after a large file's own
/// `publish.blob.fsync`) instead of the copy's [`FAILPOINTS_COPY_ONLY`].
pub const FAILPOINTS: &[&str] = &[
    "publish.incoming.mkdir",
    "publish.blob.create",
    "publish.blob.write",
    "publish.blob.fsync",
    "publish.adopt.link",
    "publish.blob.rename",
    "publish.manifest.create",
    "publish.manifest.write",
    "publish.batch.syncfs",
    "publish.move.rename",
    "publish.manifest.rename",
    "publish.incoming.dirfsync",
    "publish.blob.dirfsync",
    "publish.manifest.dirfsync",
    "publish.incoming.unlink",
    "publish.current.create",
    "publish.current.write",
    "publish.current.fsync",
    "publish.current.rename",
    "publish.current.dirfsync",
    "publish.acked",
    "gc.manifest.unlink",
    "gc.blob.unlink",
];

/// The crash points only a publish that copies its files reaches (one that adopts staged files
/// links each under its digest instead; with the `failpoints` feature, `TENURE_ADOPT=0` makes
/// it copy).
pub const FAILPOINTS_COPY_ONLY: &[&str] = &[
    "publish.blob.create",
    "publish.blob.write",
    "publish.blob.rename",
];

/// The crash points at which `CURRENT` has already been replaced (load must yield the new
/// checkpoint after a crash there); at every earlier point it must yield the old one.
pub const FAILPOINTS_AFTER_RENAME: &[&str] = &[
    "publish.current.dirfsync",
    "publish.acked",
    "gc.manifest.unlink",
    "gc.blob.unlink",
];
