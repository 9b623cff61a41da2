//! The GC after an acknowledged publish, as steps: the manifests listed and their headers read,
//! the policy of [`crate::checkpoint::gc::plan`] applied, the blobs the kept checkpoints name
//! gathered by streaming their manifests (8 bytes per file), then superseded manifests unlinked
//! before any blob, then every blob no kept checkpoint names (and any temp file an earlier
//! version left among the blobs). The temp files a crashed publish left in `manifests/` are
//! unlinked as the listing finds them (the owned open does not list `manifests/`: a run that
//! publishes nothing must not pay for the store's history).
//!
//! Nothing is synced: a deletion lost in a power cut only leaves garbage that the next GC
//! removes again, and what GC deletes is never what a kept checkpoint needs, so the order of
//! the deletions does not need to be durable either (a manifest that comes back without its
//! blobs is not kept, never loaded, and reported as invalid). The GC must start only once the
//! new `CURRENT` is durable: the publish plan runs it after `CURRENT`'s directory fsync.
//!
//! In a store shared by the machines of a cluster (issue 14, [`GcPlan::shared`]) the GC runs
//! after the cluster's fenced move of `CURRENT`, which proves every lower epoch fenced for
//! good: none of them can ever move `CURRENT` again. What such a former owner left — crashed,
//! or paused past its TTL and resumed — is removed then: its manifests, above `CURRENT` too
//! (written after this publish listed them), and its blobs' scratch directories
//! `incoming-EPOCH/`. Nothing of this epoch or a higher one is touched (a higher epoch's is a
//! newer owner's, should this one have lost its lease since), nor anything `CURRENT` names.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use super::{INCOMING_DIR, LIST_PAGE, Plan, Poll, StoreFds, StorePath, fd_of, os};
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::format::{CheckpointId, Digest, ManifestParser, PARSE_CHUNK, Parsed};
use crate::checkpoint::gc::{self, Referenced, Seen};
use crate::checkpoint::limits::Limits;
use crate::checkpoint::store::GcReport;
use crate::fsop::{Check, Done, Fd, Op, Step};
use crate::privfs::{FileKind, FsError, TEMP_PREFIX};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum At {
    ListManifests,
    ManifestPage(Fd),
    CloseManifestList(Fd),
    /// Unlinking the `n`th temp file the listing found in `manifests/`.
    UnlinkTemp(usize),
    /// Reading the header of the `n`th listed manifest.
    HeaderOpen(usize),
    HeaderRead(usize, Fd),
    HeaderClose(usize, Fd),
    /// Gathering the blobs of the `n`th kept manifest.
    RefOpen(usize),
    RefRead(usize, Fd),
    RefClose(usize, Fd),
    /// Unlinking the `n`th superseded manifest.
    UnlinkManifest(usize),
    /// Shared stores: listing the store's directory for the `incoming-EPOCH/` directories of
    /// lower epochs.
    ListRoot,
    RootPage(Fd),
    /// Removing the `incoming-EPOCH/` directory named by the page entry.
    RemoveIncoming(Fd),
    CloseRootList(Fd),
    ListBlobs,
    BlobPage(Fd),
    UnlinkBlob(Fd),
    CloseBlobList(Fd),
    Done,
}

/// The GC plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GcPlan {
    path: StorePath,
    dirs: StoreFds,
    limits: Limits,
    current: CheckpointId,
    keep: usize,
    at: At,
    /// The manifest file the open or unlink step names.
    name: String,
    ids: Vec<CheckpointId>,
    seen: BTreeMap<CheckpointId, Seen>,
    policy: gc::Plan,
    parser: ManifestParser,
    referenced: Referenced,
    page: Vec<OsString>,
    page_pos: usize,
    /// Temp files of crashed publishes found in `manifests/` (a store of its own only).
    temps: Vec<OsString>,
    report: GcReport,
    /// A store shared by the machines of a cluster (issue 14): the publisher's epoch.
    shared: Option<u64>,
    /// The epoch each manifest's header names (shared stores).
    epochs: BTreeMap<CheckpointId, u64>,
}

impl GcPlan {
    /// The GC after `current` became durable, keeping `keep` checkpoints.
    pub fn new(
        path: StorePath,
        dirs: StoreFds,
        limits: Limits,
        current: CheckpointId,
        keep: usize,
    ) -> GcPlan {
        GcPlan {
            path,
            dirs,
            limits,
            current,
            keep,
            at: At::ListManifests,
            name: String::new(),
            ids: Vec::new(),
            seen: BTreeMap::new(),
            policy: gc::Plan::default(),
            parser: ManifestParser::new(limits),
            referenced: Referenced::default(),
            page: Vec::new(),
            page_pos: 0,
            temps: Vec::new(),
            report: GcReport::default(),
            shared: None,
            epochs: BTreeMap::new(),
        }
    }

    /// The GC of a store shared by the machines of a cluster (issue 14), after the publish of
    /// `epoch` moved `CURRENT`: manifests above `current` may be a newer owner's (this one may
    /// have lost its lease since), and any blob may be about to be named by one, so blobs stay,
    /// older manifests go, and of the rest only what lower (fenced) epochs left: their
    /// manifests and their `incoming-EPOCH/` directories.
    pub fn shared(mut self, epoch: u64) -> GcPlan {
        self.shared = Some(epoch);
        self
    }

    /// What the GC did, once [`Poll::Done`].
    pub fn report(&self) -> &GcReport {
        &self.report
    }

    /// The report of a GC that stopped at `error` (the publish is durable all the same; the
    /// next GC starts over from what is on disk).
    pub fn failed(mut self, error: &CheckpointError) -> GcReport {
        self.report.error = Some(error.to_string());
        self.report
    }

    /// Moves to `at`, naming the manifest its step needs.
    fn go(&mut self, at: At) {
        let id = match at {
            At::HeaderOpen(n) => Some(self.ids[n]),
            At::RefOpen(n) => Some(self.policy.kept[n]),
            At::UnlinkManifest(n) => Some(self.policy.manifests[n]),
            _ => None,
        };
        if let Some(id) = id {
            self.name = id.manifest_file_name();
        }
        self.at = at;
    }

    /// The temp files from the `n`th on, then the headers of the listed manifests.
    fn after_temps(&mut self, n: usize) {
        if n < self.temps.len() {
            self.at = At::UnlinkTemp(n);
        } else if self.ids.is_empty() {
            self.decide();
        } else {
            self.go(At::HeaderOpen(0));
        }
    }

    fn next_header(&mut self, n: usize) {
        if n + 1 < self.ids.len() {
            self.go(At::HeaderOpen(n + 1));
        } else {
            self.decide();
        }
    }

    /// Every header is read: what to keep and what to delete.
    fn decide(&mut self) {
        self.policy = gc::plan(self.current, &self.seen, self.keep);
        if let Some(epoch) = self.shared {
            let current = self.current;
            self.policy.manifests.retain(|id| *id < current);
            // A manifest above CURRENT that a lower epoch wrote can never be named: its owner
            // is fenced for good. An unreadable one is left alone (it may be anybody's).
            self.policy.manifests.extend(
                self.epochs
                    .iter()
                    .filter(|&(id, e)| *id > current && *e < epoch)
                    .map(|(id, _)| *id),
            );
            self.policy.blobs_skipped = true;
        }
        self.report.kept = self.policy.kept.clone();
        self.report.blobs_skipped = self.policy.blobs_skipped;
        if self.policy.blobs_skipped || self.policy.kept.is_empty() {
            self.unlinks();
        } else {
            self.go(At::RefOpen(0));
        }
    }

    /// After the kept manifests were read (or could not be): the deletions, manifests first.
    fn unlinks(&mut self) {
        self.referenced.seal();
        if self.policy.manifests.is_empty() {
            self.after_manifests();
        } else {
            self.go(At::UnlinkManifest(0));
        }
    }

    fn after_manifests(&mut self) {
        self.go(if self.shared.is_some() {
            At::ListRoot
        } else if self.report.blobs_skipped {
            At::Done
        } else {
            At::ListBlobs
        });
    }

    /// After the scratch directories of lower epochs (shared stores).
    fn after_root(&mut self) {
        self.go(if self.report.blobs_skipped {
            At::Done
        } else {
            At::ListBlobs
        });
    }

    /// The next `incoming-EPOCH/` of a lower epoch on the page, or the next page.
    fn next_incoming(&mut self, list: Fd) {
        let epoch = self.shared.unwrap_or(0);
        while let Some(name) = self.page.get(self.page_pos) {
            let stale = name
                .to_str()
                .and_then(|n| n.strip_prefix(INCOMING_DIR))
                .and_then(|n| n.strip_prefix('-'))
                .and_then(|e| e.parse::<u64>().ok())
                .is_some_and(|e| e < epoch);
            if stale {
                self.at = At::RemoveIncoming(list);
                return;
            }
            self.page_pos += 1;
        }
        self.at = At::RootPage(list);
    }

    /// A kept manifest that cannot be read may name any blob: no blob is deleted.
    fn cannot_read_kept(&mut self, e: CheckpointError) {
        self.report.blobs_skipped = true;
        self.report.error = Some(e.to_string());
    }

    /// The next entry of the blob page to remove, or the next page.
    fn next_blob(&mut self, list: Fd) {
        while self.page_pos < self.page.len() {
            let name = &self.page[self.page_pos];
            let is_temp = name.as_bytes().starts_with(TEMP_PREFIX.as_bytes());
            let garbage = name
                .to_str()
                .and_then(|n| n.parse::<Digest>().ok())
                .is_some_and(|d| gc::is_garbage(&self.referenced, &d));
            if garbage || is_temp {
                self.at = At::UnlinkBlob(list);
                return;
            }
            self.page_pos += 1;
        }
        self.at = At::BlobPage(list);
    }

    /// Feeds a chunk of a manifest to the parser.
    fn feed(&mut self, r: Result<Done, FsError>) -> Result<(), CheckpointError> {
        match r? {
            Done::Data(chunk) => self.parser.feed(&chunk),
            other => panic!("a read returns data, not {other:?}"),
        }
        Ok(())
    }

    fn malformed(
        &self,
        id: CheckpointId,
        reason: crate::checkpoint::FormatError,
    ) -> CheckpointError {
        CheckpointError::ManifestMalformed {
            path: self.path.manifest(id),
            reason,
        }
    }

    /// Streams the kept manifest's entries into the referenced set; `Ok(true)` at its end.
    fn gather(&mut self, n: usize, r: Result<Done, FsError>) -> Result<bool, CheckpointError> {
        let id = self.policy.kept[n];
        self.feed(r)?;
        loop {
            match self.parser.next_item().map_err(|e| self.malformed(id, e))? {
                Parsed::NeedMore => return Ok(false),
                Parsed::Header(h) if h.id != id => {
                    return Err(CheckpointError::ManifestIdMismatch {
                        path: self.path.manifest(id),
                        expected: id,
                        found: h.id,
                    });
                }
                Parsed::Header(_) => {}
                Parsed::Entry(e) => self.referenced.add(&e.sha256),
                Parsed::End => return Ok(true),
            }
        }
    }
}

impl Plan for GcPlan {
    fn poll(&self) -> Poll<'_> {
        let m = self.dirs.manifests;
        let step = |label, op| Poll::Op(Step::new(label, op));
        match self.at {
            At::ListManifests => step("gc", Op::List { dir: m }),
            At::ManifestPage(l) | At::BlobPage(l) | At::RootPage(l) => step(
                "gc",
                Op::ListNext {
                    list: l,
                    max: LIST_PAGE,
                },
            ),
            At::CloseManifestList(fd)
            | At::CloseBlobList(fd)
            | At::CloseRootList(fd)
            | At::HeaderClose(_, fd)
            | At::RefClose(_, fd) => step("gc", Op::Close { fd }),
            At::UnlinkTemp(n) => step(
                "gc.temp",
                Op::Unlink {
                    dir: m,
                    name: &self.temps[n],
                },
            ),
            At::HeaderOpen(_) | At::RefOpen(_) => step(
                "gc",
                Op::Open {
                    dir: m,
                    name: os(&self.name),
                    check: Check::Private,
                },
            ),
            At::HeaderRead(_, fd) | At::RefRead(_, fd) => step(
                "gc",
                Op::Read {
                    fd,
                    max: PARSE_CHUNK,
                },
            ),
            At::UnlinkManifest(_) => step(
                "gc.manifest",
                Op::Unlink {
                    dir: m,
                    name: os(&self.name),
                },
            ),
            At::ListRoot => step(
                "gc",
                Op::List {
                    dir: self.dirs.root,
                },
            ),
            At::RemoveIncoming(_) => step(
                "gc.incoming",
                Op::RemoveTree {
                    dir: self.dirs.root,
                    name: &self.page[self.page_pos],
                },
            ),
            At::ListBlobs => step(
                "gc",
                Op::List {
                    dir: self.dirs.blobs,
                },
            ),
            At::UnlinkBlob(_) => step(
                "gc.blob",
                Op::Unlink {
                    dir: self.dirs.blobs,
                    name: &self.page[self.page_pos],
                },
            ),
            At::Done => Poll::Done,
        }
    }

    fn handle(&mut self, r: Result<Done, FsError>) -> Result<(), CheckpointError> {
        match self.at {
            At::ListManifests => self.at = At::ManifestPage(fd_of(&r?)),
            At::ManifestPage(l) => {
                let Done::Entries(entries) = r? else {
                    panic!("a listing returns entries")
                };
                if entries.is_empty() {
                    self.ids.sort();
                    self.at = At::CloseManifestList(l);
                }
                for (name, kind) in entries {
                    if kind != FileKind::Regular {
                        continue;
                    }
                    if let Some(id) = name
                        .to_str()
                        .and_then(CheckpointId::from_manifest_file_name)
                    {
                        self.ids.push(id);
                    } else if self.shared.is_none()
                        && name.as_bytes().starts_with(TEMP_PREFIX.as_bytes())
                    {
                        // A crashed publish's manifest temp (never named by anything): the
                        // owned open leaves them to this listing, which every publish makes
                        // anyway, so that a run that publishes nothing lists no history. In a
                        // shared store one may be a newer owner's publish in progress.
                        self.temps.push(name);
                    }
                }
            }
            At::CloseManifestList(_) => {
                r?;
                self.after_temps(0);
            }
            At::UnlinkTemp(n) => {
                match r {
                    Ok(_) | Err(FsError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                self.after_temps(n + 1);
            }
            At::HeaderOpen(n) => match r {
                Ok(d) => {
                    self.parser = ManifestParser::new(self.limits);
                    self.at = At::HeaderRead(n, fd_of(&d));
                }
                Err(_) => {
                    self.seen.insert(self.ids[n], Seen::Unreadable);
                    self.next_header(n);
                }
            },
            At::HeaderRead(n, fd) => {
                let seen = match self.feed(r).map(|()| self.parser.next_item()) {
                    Ok(Ok(Parsed::NeedMore)) => return Ok(()),
                    Ok(Ok(Parsed::Header(h))) if h.id == self.ids[n] => {
                        self.epochs.insert(h.id, h.epoch);
                        Seen::Valid { parent: h.parent }
                    }
                    Ok(Ok(_) | Err(_)) | Err(_) => Seen::Unreadable,
                };
                self.seen.insert(self.ids[n], seen);
                self.at = At::HeaderClose(n, fd);
            }
            At::HeaderClose(n, _) => {
                r?;
                self.next_header(n);
            }
            At::RefOpen(n) => match r {
                Ok(d) => {
                    self.parser = ManifestParser::new(self.limits);
                    self.at = At::RefRead(n, fd_of(&d));
                }
                Err(e) => {
                    self.cannot_read_kept(e.into());
                    self.unlinks();
                }
            },
            At::RefRead(n, fd) => match self.gather(n, r) {
                Ok(false) => {}
                Ok(true) => self.at = At::RefClose(n, fd),
                Err(e) => {
                    self.cannot_read_kept(e);
                    self.at = At::RefClose(n, fd);
                }
            },
            At::RefClose(n, _) => {
                r?;
                if n + 1 < self.policy.kept.len() && !self.report.blobs_skipped {
                    self.go(At::RefOpen(n + 1));
                } else {
                    self.unlinks();
                }
            }
            At::UnlinkManifest(n) => {
                r?;
                self.report.manifests_removed += 1;
                if n + 1 < self.policy.manifests.len() {
                    self.go(At::UnlinkManifest(n + 1));
                } else {
                    self.after_manifests();
                }
            }
            At::ListRoot => self.at = At::RootPage(fd_of(&r?)),
            At::RootPage(l) => {
                let Done::Entries(entries) = r? else {
                    panic!("a listing returns entries")
                };
                if entries.is_empty() {
                    self.page.clear();
                    self.at = At::CloseRootList(l);
                    return Ok(());
                }
                self.page = entries
                    .into_iter()
                    .filter(|(_, k)| *k == FileKind::Directory)
                    .map(|(n, _)| n)
                    .collect();
                self.page_pos = 0;
                self.next_incoming(l);
            }
            At::RemoveIncoming(l) => {
                match r {
                    Ok(_) | Err(FsError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                self.page_pos += 1;
                self.next_incoming(l);
            }
            At::CloseRootList(_) => {
                r?;
                self.after_root();
            }
            At::ListBlobs => self.at = At::BlobPage(fd_of(&r?)),
            At::BlobPage(l) => {
                let Done::Entries(entries) = r? else {
                    panic!("a listing returns entries")
                };
                if entries.is_empty() {
                    self.page.clear();
                    self.at = At::CloseBlobList(l);
                    return Ok(());
                }
                self.page = entries
                    .into_iter()
                    .filter(|(_, k)| *k == FileKind::Regular)
                    .map(|(n, _)| n)
                    .collect();
                self.page_pos = 0;
                self.next_blob(l);
            }
            At::UnlinkBlob(l) => {
                match r {
                    Ok(_) => {
                        let name = &self.page[self.page_pos];
                        if !name.as_bytes().starts_with(TEMP_PREFIX.as_bytes()) {
                            self.report.blobs_removed += 1;
                        }
                    }
                    Err(FsError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                self.page_pos += 1;
                self.next_blob(l);
            }
            At::CloseBlobList(_) => {
                r?;
                self.at = At::Done;
            }
            At::Done => {}
        }
        Ok(())
    }
}
