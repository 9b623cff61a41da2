//! The load and verify plan: `CURRENT` read strictly, the manifest's digest checked, then the
//! manifest streamed a chunk at a time through the parser (hashed again as it is parsed, so a
//! file that changed between the passes is refused too), every blob read and checked against
//! its size and digest. Blob checks are independent `HashFile` steps ([`Poll::Verify`]): the
//! real runner runs up to its window of them at once on the available cores, the models one at
//! a time. Any mismatch is a typed refusal naming the file; nothing is written.

use super::{HashState, Plan, Poll, StorePath, fd_of, os};
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::format::{
    self, CURRENT_LEN, CheckpointId, Current, Digest, Entry, Header, ManifestParser, PARSE_CHUNK,
    Parsed,
};
use crate::checkpoint::limits::{self, Limits};
use crate::checkpoint::store::CheckpointSummary;
use crate::checkpoint::{CURRENT_FILE, hash::Mismatch};
use crate::fsop::{Check, Done, Fd, Op, Step, Summary};
use crate::privfs::FsError;

/// What the load found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Loaded {
    /// No checkpoint: no store, or no `CURRENT`.
    Nothing,
    /// The checkpoint, completely verified.
    Verified(CheckpointSummary),
}

/// The store's directories as a load sees them: a read-only store may lack any of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Dirs {
    root: Option<Fd>,
    manifests: Option<Fd>,
    blobs: Option<Fd>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum At {
    ReadCurrent,
    OpenManifest,
    HashManifest(Fd),
    Rewind(Fd),
    Stream(Fd),
    Close(Fd),
    Done,
}

/// The load of the current checkpoint (or of one named checkpoint, for the read-only report).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoadPlan {
    path: StorePath,
    dirs: Dirs,
    limits: Limits,
    window: usize,
    at: At,
    /// The checkpoint being loaded and the digest its manifest must have.
    id: Option<CheckpointId>,
    /// Its manifest's file name (for the open step).
    manifest_file: String,
    expected: Option<Digest>,
    current_bytes: Option<Vec<u8>>,
    parser: ManifestParser,
    hash: HashState,
    header: Option<Header>,
    /// The next entry to verify, and its blob's file name.
    ready: Option<(Entry, String)>,
    outstanding: Vec<(u64, Entry)>,
    issued: u64,
    bytes: u64,
    parsed_end: bool,
    out: Option<Loaded>,
}

impl LoadPlan {
    /// Loads what `CURRENT` names. Each directory handle is `None` where a read-only store
    /// lacks the directory. Up to `window` blob checks may be outstanding at once.
    pub fn current(
        path: StorePath,
        root: Option<Fd>,
        manifests: Option<Fd>,
        blobs: Option<Fd>,
        limits: Limits,
        window: usize,
    ) -> LoadPlan {
        let dirs = Dirs {
            root,
            manifests,
            blobs,
        };
        LoadPlan {
            path,
            dirs,
            limits,
            window: window.max(1),
            at: if root.is_some() {
                At::ReadCurrent
            } else {
                At::Done
            },
            id: None,
            manifest_file: String::new(),
            expected: None,
            current_bytes: None,
            parser: ManifestParser::new(limits),
            hash: HashState::default(),
            header: None,
            ready: None,
            outstanding: Vec::new(),
            issued: 0,
            bytes: 0,
            parsed_end: false,
            out: if root.is_some() {
                None
            } else {
                Some(Loaded::Nothing)
            },
        }
    }

    /// Loads checkpoint `id` (its manifest's digest unchecked when `expected` is `None`).
    pub fn checkpoint(
        path: StorePath,
        manifests: Option<Fd>,
        blobs: Option<Fd>,
        id: CheckpointId,
        expected: Option<Digest>,
        limits: Limits,
        window: usize,
    ) -> Result<LoadPlan, CheckpointError> {
        let mut plan = LoadPlan::current(path, None, manifests, blobs, limits, window);
        plan.out = None;
        plan.id = Some(id);
        plan.manifest_file = id.manifest_file_name();
        plan.expected = expected;
        plan.at = At::OpenManifest;
        if manifests.is_none() {
            return Err(CheckpointError::ManifestMissing {
                path: plan.path.manifest(id),
                id,
            });
        }
        Ok(plan)
    }

    /// The result, once [`Poll::Done`].
    pub fn output(&self) -> Option<&Loaded> {
        self.out.as_ref()
    }

    /// The bytes of `CURRENT` the load read (to tell whether it changed meanwhile).
    pub fn current_bytes(&self) -> Option<&[u8]> {
        self.current_bytes.as_deref()
    }

    /// The entry of the `Verify` step [`Plan::poll`] gives now (entries come in manifest
    /// order).
    pub fn ready_entry(&self) -> Option<&Entry> {
        self.ready.as_ref().map(|(e, _)| e)
    }

    fn max_manifest(&self) -> u64 {
        self.limits
            .max_manifest_bytes
            .max(limits::LEGACY_MAX_MANIFEST_BYTES)
    }

    fn manifest_path(&self) -> std::path::PathBuf {
        self.path
            .manifest(self.id.expect("a manifest is being loaded"))
    }

    fn malformed(&self, reason: format::FormatError) -> CheckpointError {
        CheckpointError::ManifestMalformed {
            path: self.manifest_path(),
            reason,
        }
    }

    fn mismatch(&self, e: &Entry, m: Mismatch) -> CheckpointError {
        blob_mismatch(self.path.blob(&e.sha256), e, m)
    }

    /// Parses what the buffered manifest bytes hold until an entry is ready to verify, more
    /// bytes are needed, or the end; then finishes once every check came back.
    fn advance(&mut self) -> Result<(), CheckpointError> {
        let At::Stream(fd) = self.at else {
            return Ok(());
        };
        while self.ready.is_none() && !self.parsed_end {
            match self.parser.next_item().map_err(|r| self.malformed(r))? {
                Parsed::NeedMore => return Ok(()),
                Parsed::Header(h) => {
                    let id = self.id.expect("a manifest is being loaded");
                    if h.id != id {
                        return Err(CheckpointError::ManifestIdMismatch {
                            path: self.manifest_path(),
                            expected: id,
                            found: h.id,
                        });
                    }
                    self.header = Some(h);
                }
                Parsed::Entry(e) => {
                    if self.dirs.blobs.is_none() {
                        return Err(CheckpointError::BlobMissing {
                            path: self.path.blob(&e.sha256),
                            name: e.name,
                        });
                    }
                    self.bytes = self.bytes.saturating_add(e.size);
                    let hex = e.sha256.to_hex();
                    self.ready = Some((e, hex));
                }
                Parsed::End => self.parsed_end = true,
            }
        }
        if self.parsed_end && self.ready.is_none() && self.outstanding.is_empty() {
            let digest = self.hash.digest();
            if let Some(expected) = self.expected
                && digest != expected
            {
                return Err(CheckpointError::ManifestDigestMismatch {
                    path: self.manifest_path(),
                    expected,
                    actual: digest,
                });
            }
            let h = self.header.expect("the parser returns the header first");
            self.out = Some(Loaded::Verified(CheckpointSummary {
                id: h.id,
                parent: h.parent,
                epoch: h.epoch,
                created_at_ms: h.created_at_ms,
                files: h.files,
                bytes: self.bytes,
                manifest_sha256: digest,
            }));
            self.at = At::Close(fd);
        }
        Ok(())
    }
}

impl Plan for LoadPlan {
    fn poll(&self) -> Poll<'_> {
        let label = "load";
        let op = match self.at {
            At::ReadCurrent => Op::ReadFile {
                dir: self.dirs.root.expect("a store to read"),
                name: os(CURRENT_FILE),
                max: CURRENT_LEN as u64,
            },
            At::OpenManifest => Op::Open {
                dir: self.dirs.manifests.expect("checked before"),
                name: os(&self.manifest_file),
                check: Check::Private,
            },
            At::HashManifest(fd) => Op::Hash {
                fd,
                limit: Some(self.max_manifest() + 1),
            },
            At::Rewind(fd) => Op::Rewind { fd },
            At::Stream(fd) => {
                if let Some((e, hex)) = &self.ready {
                    if self.outstanding.len() >= self.window {
                        return Poll::Wait;
                    }
                    return Poll::Verify(
                        self.issued,
                        Step::new(
                            label,
                            Op::HashFile {
                                dir: self.dirs.blobs.expect("checked when the entry was parsed"),
                                name: os(hex),
                                // One byte past the promised size is enough to see a longer
                                // blob.
                                limit: Some(e.size.saturating_add(1)),
                            },
                        ),
                    );
                }
                if self.parsed_end {
                    return Poll::Wait;
                }
                Op::Read {
                    fd,
                    max: PARSE_CHUNK,
                }
            }
            At::Close(fd) => Op::Close { fd },
            At::Done => return Poll::Done,
        };
        Poll::Op(Step::new(label, op))
    }

    fn handle(&mut self, r: Result<Done, FsError>) -> Result<(), CheckpointError> {
        match self.at {
            At::ReadCurrent => {
                let path = self.path.current();
                let bytes = match r {
                    Ok(Done::Data(b)) => b,
                    Ok(other) => panic!("a read returns data, not {other:?}"),
                    Err(FsError::NotFound { .. }) => {
                        self.out = Some(Loaded::Nothing);
                        self.at = At::Done;
                        return Ok(());
                    }
                    Err(FsError::TooLarge { len, .. }) => {
                        return Err(CheckpointError::CurrentMalformed {
                            path,
                            reason: format::FormatError::BadLength {
                                actual: len as usize,
                                expected: CURRENT_LEN,
                            },
                        });
                    }
                    Err(e) => return Err(e.into()),
                };
                let cur = match Current::parse(&bytes) {
                    Ok(c) => c,
                    Err(format::FormatError::Empty) => {
                        return Err(CheckpointError::CurrentEmpty { path });
                    }
                    Err(reason) => return Err(CheckpointError::CurrentMalformed { path, reason }),
                };
                self.current_bytes = Some(bytes);
                self.id = Some(cur.id);
                self.manifest_file = cur.id.manifest_file_name();
                self.expected = Some(cur.manifest_sha256);
                if self.dirs.manifests.is_none() {
                    return Err(CheckpointError::ManifestMissing {
                        path: self.path.manifest(cur.id),
                        id: cur.id,
                    });
                }
                self.at = At::OpenManifest;
            }
            At::OpenManifest => {
                let fd = match r {
                    Ok(d) => fd_of(&d),
                    Err(FsError::NotFound { .. }) => {
                        let id = self.id.expect("a manifest is being loaded");
                        return Err(CheckpointError::ManifestMissing {
                            path: self.path.manifest(id),
                            id,
                        });
                    }
                    Err(e) => return Err(e.into()),
                };
                self.at = if self.expected.is_some() {
                    At::HashManifest(fd)
                } else {
                    At::Stream(fd)
                };
            }
            At::HashManifest(fd) => {
                let got = hashed(r)?;
                let max = self.max_manifest();
                if got.size > max {
                    return Err(self.malformed(format::FormatError::TooLarge(max)));
                }
                let expected = self.expected.expect("hashed only against a digest");
                if Digest(got.sha256) != expected {
                    return Err(CheckpointError::ManifestDigestMismatch {
                        path: self.manifest_path(),
                        expected,
                        actual: Digest(got.sha256),
                    });
                }
                self.at = At::Rewind(fd);
            }
            At::Rewind(fd) => {
                r?;
                self.at = At::Stream(fd);
            }
            At::Stream(_) => {
                let chunk = match r? {
                    Done::Data(b) => b,
                    other => panic!("a read returns data, not {other:?}"),
                };
                self.hash.update(&chunk);
                self.parser.feed(&chunk);
                self.advance()?;
            }
            At::Close(_) => {
                r?;
                self.at = At::Done;
            }
            At::Done => {}
        }
        Ok(())
    }

    fn dispatched(&mut self) -> Result<(), CheckpointError> {
        let (e, _) = self.ready.take().expect("a verify step was given");
        self.outstanding.push((self.issued, e));
        self.issued += 1;
        self.advance()
    }

    fn verified(&mut self, token: u64, r: Result<Done, FsError>) -> Result<(), CheckpointError> {
        let pos = self
            .outstanding
            .iter()
            .position(|(t, _)| *t == token)
            .expect("a result for an outstanding check");
        let (_, e) = self.outstanding.remove(pos);
        let got = match r {
            Ok(d) => hashed(Ok(d))?,
            Err(FsError::NotFound { .. }) => {
                return Err(CheckpointError::BlobMissing {
                    path: self.path.blob(&e.sha256),
                    name: e.name,
                });
            }
            Err(err) => return Err(err.into()),
        };
        if let Some(m) = check_blob(&e, &got) {
            return Err(self.mismatch(&e, m));
        }
        self.advance()
    }
}

/// The summary a hash step returned.
pub(super) fn hashed(r: Result<Done, FsError>) -> Result<Summary, CheckpointError> {
    match r? {
        Done::Hashed(s) => Ok(s),
        other => panic!("a hash step returns a summary, not {other:?}"),
    }
}

/// Whether what a blob's file held is what the entry promised (`None`), or how it differs.
/// The error for blob `path` of entry `e` whose bytes are not what the manifest says: one for
/// the load plan and the view the store materialises.
pub(crate) fn blob_mismatch(path: std::path::PathBuf, e: &Entry, m: Mismatch) -> CheckpointError {
    match m {
        Mismatch::Size { expected, actual } => CheckpointError::BlobSizeMismatch {
            path,
            name: e.name.clone(),
            expected,
            actual,
        },
        Mismatch::Digest { actual, .. } => CheckpointError::BlobDigestMismatch {
            path,
            name: e.name.clone(),
            actual,
        },
    }
}

pub(crate) fn check_blob(e: &Entry, got: &Summary) -> Option<Mismatch> {
    if got.size != e.size {
        return Some(Mismatch::Size {
            expected: e.size,
            actual: got.size.min(e.size.saturating_add(1)),
        });
    }
    // A planted bug for the mutation table: a blob of the right size is taken as it is.
    if Digest(got.sha256) != e.sha256 && !crate::mutant::on("load-accepts-digest-mismatch") {
        return Some(Mismatch::Digest {
            expected: e.sha256,
            actual: Digest(got.sha256),
        });
    }
    None
}
