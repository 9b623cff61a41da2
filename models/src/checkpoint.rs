//! The checkpoint store's publish and load protocols as file operations over a filesystem that
//! loses what was not made durable, with crashes at every operation.
//!
//! # The filesystem
//! Three directories as built in `tenure::checkpoint` (`checkpoints/` with `CURRENT`,
//! `manifests/`, `blobs/sha256/`); each holds named entries pointing at inodes. An inode's data
//! is durable once the file is fsynced; a directory's entries (create, rename, unlink) are
//! durable once the directory is fsynced. A crash keeps, for each directory, its durable entries
//! plus **any subset** of the operations done since its last fsync (each rename or unlink whole,
//! never half), and for each file whose data was not fsynced either its durable data or the new
//! data (a new file's durable data is empty, which no parser accepts). This is weaker than what
//! ext4 promises and what POSIX leaves open, which is the point.
//!
//! # The writer
//! One process at a time runs the real machine (in-process workload) through the shared
//! [`Driver`]: acquire, recover, drain, publish, release. `Recover` is the store's owned open
//! (temp files swept, each directory synced) followed by the load; `Publish` is the store's
//! publish of two files — one whose bytes every checkpoint shares (a deduplicated blob after the
//! first) and one new per run — as the sequence of file operations in
//! `CheckpointStore::publish_checked`: each new blob temp + write + fsync + rename without
//! replacing, one fsync of the blob dir; the manifest the same way and its dir fsync; `CURRENT`
//! by temp + write + fsync + rename + dir fsync; acknowledge; then the GC (manifests first and
//! their dir fsync, then blobs and theirs), keeping the last `keep` checkpoints. A crash can fall
//! between any two operations; the next run starts from what survived. Between runs the world
//! may corrupt one file (a flipped byte) to check that the load refuses it.
//!
//! Checkpoints are abstract: a manifest is `(id, run)` (its digest covers both), CURRENT names
//! `(id, run)`, and the checkpoint of run `r` lists the shared blob and the blob of run `r`.

use crate::driver::{Driver, Request};
use stateright::{Model, Property};
use tenure::machine::{Action, Config, Event, Fault};

/// Deliberate bugs in the protocol; each must make a property fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// I12: the blob directory is not fsynced after the blobs' renames.
    SkipBlobDirFsync,
    /// I12: `CURRENT`'s temp file is renamed before it is fsynced.
    RenameCurrentBeforeFsync,
    /// I13: the GC runs before the directory fsync that makes the new `CURRENT` durable.
    GcBeforeDirFsync,
    /// I13: the GC deletes every blob of a deleted manifest, even one a kept manifest shares.
    GcIgnoresSharing,
    /// I14: a load that finds `CURRENT` invalid "repairs" it to the newest valid checkpoint.
    RepairOnLoad,
    /// I14: the load checks blob presence and size but not their digests.
    SkipBlobDigest,
}

impl Mutation {
    /// Every mutation of this model.
    pub const ALL: [Mutation; 6] = [
        Mutation::SkipBlobDirFsync,
        Mutation::RenameCurrentBeforeFsync,
        Mutation::GcBeforeDirFsync,
        Mutation::GcIgnoresSharing,
        Mutation::RepairOnLoad,
        Mutation::SkipBlobDigest,
    ];

    /// The name used on the command line and in the README.
    pub const fn name(self) -> &'static str {
        match self {
            Mutation::SkipBlobDirFsync => "skip-blob-dir-fsync",
            Mutation::RenameCurrentBeforeFsync => "rename-current-before-fsync",
            Mutation::GcBeforeDirFsync => "gc-before-dir-fsync",
            Mutation::GcIgnoresSharing => "gc-ignores-sharing",
            Mutation::RepairOnLoad => "repair-on-load",
            Mutation::SkipBlobDigest => "skip-blob-digest",
        }
    }

    /// The property the mutation must break.
    pub const fn breaks(self) -> &'static str {
        match self {
            Mutation::SkipBlobDirFsync | Mutation::RenameCurrentBeforeFsync => {
                CURRENT_VALID_AFTER_CRASH
            }
            Mutation::GcBeforeDirFsync | Mutation::GcIgnoresSharing => GC_KEEPS_CURRENT,
            Mutation::RepairOnLoad => NO_REPAIR,
            Mutation::SkipBlobDigest => CORRUPTION_REFUSED,
        }
    }

    /// Looks a mutation up by name.
    pub fn from_name(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// I12: after a crash CURRENT is absent/old/new as before, names a complete digest-valid
/// checkpoint, and an acknowledged publish survives.
pub const CURRENT_VALID_AFTER_CRASH: &str = "current valid after crash";
/// I13: the GC deletes nothing CURRENT could name after a crash, and starts only once the new
/// CURRENT is durable.
pub const GC_KEEPS_CURRENT: &str = "gc keeps current";
/// I14: a load that refuses the state changes nothing (temp files aside).
pub const NO_REPAIR: &str = "no repair";
/// I14 (and I12): a load never accepts a checkpoint that is not complete and digest-valid.
pub const CORRUPTION_REFUSED: &str = "corruption refused";
/// The driver feeds only events its semantics allow and the machine accepts.
pub const LEGAL_EVENTS: &str = "legal events";

const V_CRASH: u16 = 1;
const V_GC: u16 = 2;
const V_REPAIR: u16 = 4;
const V_ACCEPT: u16 = 8;
const V_ILLEGAL: u16 = 16;

/// A directory of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DirId {
    /// `checkpoints/`, holding `CURRENT`.
    Root,
    /// `checkpoints/manifests/`.
    Manifests,
    /// `checkpoints/blobs/sha256/`.
    Blobs,
}

impl DirId {
    const ALL: [DirId; 3] = [DirId::Root, DirId::Manifests, DirId::Blobs];

    fn index(self) -> usize {
        match self {
            DirId::Root => 0,
            DirId::Manifests => 1,
            DirId::Blobs => 2,
        }
    }
}

/// A blob's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlobId {
    /// Bytes every checkpoint has (stored once, deduplicated).
    Shared,
    /// Bytes new in this run.
    Own(u8),
}

/// An entry name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Name {
    /// `CURRENT`.
    Current,
    /// A `.tmp-*` file.
    Tmp,
    /// `manifests/<id>.json`.
    Manifest(u8),
    /// `blobs/sha256/<hex>`.
    Blob(BlobId),
}

/// A file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Data {
    /// Empty, partial or flipped bytes: no parser accepts them and no digest matches.
    Torn,
    /// A blob's bytes.
    Blob(BlobId),
    /// A manifest: checkpoint `id` written by run `run`, listing the shared blob and run's own.
    Manifest {
        /// Checkpoint id (its parent is `id - 1`).
        id: u8,
        /// The run that wrote it.
        run: u8,
    },
    /// A `CURRENT` pointer to manifest `id` with the digest of `Manifest { id, run }`.
    Current {
        /// Checkpoint id.
        id: u8,
        /// The run whose manifest's digest it holds.
        run: u8,
    },
}

/// An inode: its data and the data a crash keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Inode {
    /// What reads see.
    pub data: Data,
    /// What survives a crash (as of the last fsync).
    pub durable: Data,
}

/// A directory operation not yet made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DirOp {
    /// A new entry.
    Link(Name, u8),
    /// An entry removed.
    Unlink(Name),
    /// An entry renamed (replacing the target).
    Rename(Name, Name),
}

/// One directory: its durable entries and the operations since its last fsync.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Directory {
    /// Entries as of the last fsync, sorted.
    pub durable: Vec<(Name, u8)>,
    /// Operations since, in order.
    pub pending: Vec<DirOp>,
}

fn apply(entries: &mut Vec<(Name, u8)>, op: DirOp) {
    match op {
        DirOp::Link(n, ino) => {
            entries.retain(|e| e.0 != n);
            entries.push((n, ino));
        }
        DirOp::Unlink(n) => entries.retain(|e| e.0 != n),
        DirOp::Rename(from, to) => {
            if let Some(pos) = entries.iter().position(|e| e.0 == from) {
                let ino = entries.remove(pos).1;
                entries.retain(|e| e.0 != to);
                entries.push((to, ino));
            }
        }
    }
    entries.sort();
}

impl Directory {
    /// The entries reads see.
    pub fn live(&self) -> Vec<(Name, u8)> {
        let mut e = self.durable.clone();
        for op in &self.pending {
            apply(&mut e, *op);
        }
        e
    }

    /// Every set of entries a crash can leave: durable plus any subset of the pending
    /// operations, in order.
    pub fn crash_outcomes(&self) -> Vec<Vec<(Name, u8)>> {
        let n = self.pending.len();
        let mut out: Vec<Vec<(Name, u8)>> = Vec::new();
        for mask in 0u32..(1 << n) {
            let mut e = self.durable.clone();
            for (i, op) in self.pending.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    apply(&mut e, *op);
                }
            }
            if !out.contains(&e) {
                out.push(e);
            }
        }
        out
    }
}

/// The store's three directories and their inodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Fs {
    /// Root, manifests, blobs.
    pub dirs: [Directory; 3],
    /// Inodes by number.
    pub inodes: Vec<Inode>,
}

impl Fs {
    fn dir(&self, d: DirId) -> &Directory {
        &self.dirs[d.index()]
    }

    fn dir_mut(&mut self, d: DirId) -> &mut Directory {
        &mut self.dirs[d.index()]
    }

    fn lookup(&self, d: DirId, n: Name) -> Option<u8> {
        self.dir(d).live().iter().find(|e| e.0 == n).map(|e| e.1)
    }

    fn read(&self, d: DirId, n: Name) -> Option<Data> {
        self.lookup(d, n).map(|i| self.inodes[i as usize].data)
    }

    /// Entries and contents as reads see them, temp files left out (what I14 compares).
    fn visible(&self) -> Vec<(DirId, Name, Data)> {
        let mut v = Vec::new();
        for d in DirId::ALL {
            for (n, ino) in self.dir(d).live() {
                if n != Name::Tmp {
                    v.push((d, n, self.inodes[ino as usize].data));
                }
            }
        }
        v
    }

    /// Renumbers inodes in order of first reference and drops unreferenced ones, so equal
    /// filesystems are equal states.
    fn normalize(&mut self, tmp: &mut Option<u8>) {
        let mut order: Vec<u8> = Vec::new();
        let see = |i: u8, order: &mut Vec<u8>| {
            if !order.contains(&i) {
                order.push(i);
            }
        };
        for d in &self.dirs {
            for (_, i) in &d.durable {
                see(*i, &mut order);
            }
            for op in &d.pending {
                if let DirOp::Link(_, i) = op {
                    see(*i, &mut order);
                }
            }
        }
        if let Some(i) = tmp {
            see(*i, &mut order);
        }
        let map = |i: u8| order.iter().position(|x| *x == i).expect("referenced") as u8;
        let inodes = order.iter().map(|i| self.inodes[*i as usize]).collect();
        for d in &mut self.dirs {
            for e in &mut d.durable {
                e.1 = map(e.1);
            }
            for op in &mut d.pending {
                if let DirOp::Link(_, i) = op {
                    *i = map(*i);
                }
            }
        }
        *tmp = tmp.map(map);
        self.inodes = inodes;
    }

    /// The checkpoint `current` names, if it is complete and digest-valid here.
    fn complete(&self, current: Data, check_blob_digests: bool) -> bool {
        let Data::Current { id, run } = current else {
            return false;
        };
        if self.read(DirId::Manifests, Name::Manifest(id)) != Some(Data::Manifest { id, run }) {
            return false;
        }
        [BlobId::Shared, BlobId::Own(run)].into_iter().all(|b| {
            match self.read(DirId::Blobs, Name::Blob(b)) {
                Some(d) => d == Data::Blob(b) || !check_blob_digests,
                None => false,
            }
        })
    }

    /// Every `CURRENT` content a crash now could leave (`None`: absent).
    fn possible_currents(&self) -> Vec<Option<Data>> {
        let mut out = Vec::new();
        for entries in self.dir(DirId::Root).crash_outcomes() {
            let found = entries.iter().find(|e| e.0 == Name::Current).map(|e| e.1);
            let datas = match found {
                None => vec![None],
                Some(i) => {
                    let ino = self.inodes[i as usize];
                    vec![Some(ino.data), Some(ino.durable)]
                }
            };
            for d in datas {
                if !out.contains(&d) {
                    out.push(d);
                }
            }
        }
        out
    }
}

/// One file-system step of a program (the owned open or a publish).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FsOp {
    /// Create an empty temp file in the directory.
    Create(DirId),
    /// Write the temp file's content.
    Write(Data),
    /// Fsync the temp file.
    Fsync,
    /// Rename the temp file to this name (replacing).
    Rename(DirId, Name),
    /// Store a blob: if a blob of this content exists, drop the temp file; otherwise fsync it
    /// and rename it into place without replacing.
    StoreBlob(BlobId),
    /// Remove an entry.
    Unlink(DirId, Name),
    /// Fsync a directory.
    SyncDir(DirId),
    /// The publish is acknowledged (`publish.acked`).
    Ack,
    /// Plan the GC from what the directories hold and queue its operations.
    Gc,
    /// Sweep temp files of every directory (owned open).
    Sweep,
}

/// What the writer is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Between runs.
    Idle,
    /// The owned open (temp sweep) runs; the load follows.
    Opening,
    /// The load is next.
    Loading,
    /// A publish runs.
    Publishing,
    /// The last run refused the state: nothing runs again.
    Halted,
}

/// The checkpoint model and its bounds.
#[derive(Debug, Clone)]
pub struct CheckpointModel {
    /// Runs (each publishes once) in all.
    pub runs: u8,
    /// Crashes in all.
    pub crashes: u8,
    /// Corruptions (one flipped file between runs) in all.
    pub corruptions: u8,
    /// The GC's `keep` values checked (one initial state each).
    pub keeps: Vec<u8>,
    /// Whether a corruption may hit files no checkpoint references (a blob a crashed publish
    /// left behind). Without [`CheckpointModel::dedup_verifies_digest`] this breaks I12 through
    /// deduplication.
    pub corrupt_orphans: bool,
    /// Whether a publish verifies the digest of an existing blob before reusing it. Without it,
    /// a corrupted leftover blob of the right name and size enters the new checkpoint: the
    /// publish is acknowledged and the next load refuses it. The store verifies every blob the
    /// current checkpoint does not name (and fails the publish on a mismatch, never rewriting
    /// the blob); this model found the hole.
    pub dedup_verifies_digest: bool,
    /// The bug to inject, if any.
    pub mutation: Option<Mutation>,
}

impl CheckpointModel {
    /// The configuration checked in CI.
    pub fn ci() -> CheckpointModel {
        CheckpointModel {
            runs: 4,
            crashes: 2,
            corruptions: 1,
            keeps: vec![1, 2],
            corrupt_orphans: true,
            dedup_verifies_digest: true,
            mutation: None,
        }
    }

    /// The same model with a bug injected.
    pub fn with_mutation(mut self, m: Option<Mutation>) -> CheckpointModel {
        self.mutation = m;
        self
    }

    fn is(&self, m: Mutation) -> bool {
        self.mutation == Some(m)
    }
}

/// The state of the checkpoint world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CheckpointState {
    /// The filesystem.
    pub fs: Fs,
    /// The GC's `keep`.
    pub keep: u8,
    /// The current run's driver.
    pub drv: Driver,
    /// What the writer is doing.
    pub stage: Stage,
    /// Runs started.
    pub run: u8,
    /// File operations left in the current program.
    pub ops: Vec<FsOp>,
    /// The temp inode being written.
    pub tmp: Option<u8>,
    /// `CURRENT` (as reads see it) when the run started: the "old" pointer.
    pub old: Option<Data>,
    /// Whether the old pointer named a complete checkpoint (a corruption may have broken it).
    pub old_valid: bool,
    /// The `CURRENT` this run's publish writes: the "new" pointer.
    pub new: Option<Data>,
    /// Whether this run's publish was acknowledged.
    pub acked: bool,
    /// Whether this run's publish failed (and left CURRENT alone).
    pub publish_failed: bool,
    /// Crashes left.
    pub crashes_left: u8,
    /// Corruptions left.
    pub corruptions_left: u8,
    /// Milestones reached (for the `sometimes` properties).
    pub seen: u16,
    /// Violations recorded by steps (bit set).
    pub violations: u16,
}

const S_KEPT_OLD: u16 = 1;
const S_KEPT_NEW: u16 = 2;
const S_GC_DELETED: u16 = 4;
const S_DEDUP: u16 = 8;
const S_CORRUPT_REFUSED: u16 = 16;
const S_THREE: u16 = 32;

/// A step of the checkpoint world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckpointAction {
    /// A new run starts: the machine is started, acquires, and asks to recover.
    Run,
    /// The next file operation of the program.
    Op,
    /// The load verifies `CURRENT` and answers the machine.
    Load,
    /// Power loss: this choice of surviving directory operations (one mask per directory) and
    /// surviving file data (a mask over unsynced inodes).
    Crash([u32; 3], u32),
    /// Flip bytes of this file between runs.
    Corrupt(DirId, Name),
}

impl CheckpointState {
    fn feed(&mut self, ev: Event) {
        if self.drv.feed(ev).is_err() {
            self.violations |= V_ILLEGAL;
        }
    }

    /// Runs the machine's actions; `Recover` and `Publish` start programs, everything else is
    /// answered at once (the lease is always free, the host drains as soon as it is ready, no
    /// residency is active).
    fn drive(&mut self, m: &CheckpointModel) {
        loop {
            while let Some(a) = self.drv.pop() {
                match a {
                    Action::Recover => {
                        self.stage = Stage::Opening;
                        self.ops = vec![FsOp::Sweep];
                    }
                    Action::Publish => self.start_publish(m),
                    Action::Exit(_) => {
                        self.stage =
                            if self.drv.machine().kind() == tenure::machine::PhaseKind::Refused {
                                Stage::Halted
                            } else {
                                Stage::Idle
                            };
                        if self.run >= 3 && self.stage == Stage::Idle {
                            self.seen |= S_THREE;
                        }
                    }
                    Action::AcquireLease
                    | Action::AbandonAcquire
                    | Action::SetPhase(_)
                    | Action::SpawnChild
                    | Action::ArmTimer(..)
                    | Action::DisarmTimer(_)
                    | Action::NotifyReady
                    | Action::NotifyStopping
                    | Action::BeginDrain
                    | Action::Forward(..)
                    | Action::Relay(..)
                    | Action::ExtendTimer(..)
                    | Action::Kill
                    | Action::ReleaseLease
                    | Action::Note(_) => {}
                }
            }
            if !self.drv.between_steps() {
                return;
            }
            let ev = match self.drv.request() {
                Some(Request::Acquire { .. }) => Event::LeaseGranted {
                    epoch: u64::from(self.run),
                },
                Some(Request::Release) => Event::LeaseReleased,
                Some(Request::Recover | Request::Publish | Request::Spawn) => return,
                None => match self.drv.machine().kind() {
                    tenure::machine::PhaseKind::Ready => Event::DrainRequested,
                    tenure::machine::PhaseKind::Draining
                        if self.drv.admits(Event::ResidenciesSettled).is_ok() =>
                    {
                        Event::ResidenciesSettled
                    }
                    _ => return,
                },
            };
            self.feed(ev);
        }
    }

    fn start_publish(&mut self, m: &CheckpointModel) {
        self.stage = Stage::Publishing;
        let parent = match self.fs.read(DirId::Root, Name::Current) {
            Some(Data::Current { id, .. }) => id,
            _ => 0,
        };
        let id = parent + 1;
        let run = self.run;
        let new = Data::Current { id, run };
        self.new = Some(new);
        let mut ops = vec![
            FsOp::Create(DirId::Blobs),
            FsOp::Write(Data::Blob(BlobId::Shared)),
            FsOp::StoreBlob(BlobId::Shared),
            FsOp::Create(DirId::Blobs),
            FsOp::Write(Data::Blob(BlobId::Own(run))),
            FsOp::StoreBlob(BlobId::Own(run)),
        ];
        if !m.is(Mutation::SkipBlobDirFsync) {
            ops.push(FsOp::SyncDir(DirId::Blobs));
        }
        ops.extend([
            FsOp::Create(DirId::Manifests),
            FsOp::Write(Data::Manifest { id, run }),
            FsOp::Fsync,
            FsOp::Rename(DirId::Manifests, Name::Manifest(id)),
            FsOp::SyncDir(DirId::Manifests),
            FsOp::Create(DirId::Root),
            FsOp::Write(new),
        ]);
        if m.is(Mutation::RenameCurrentBeforeFsync) {
            ops.extend([FsOp::Rename(DirId::Root, Name::Current), FsOp::Fsync]);
        } else {
            ops.extend([FsOp::Fsync, FsOp::Rename(DirId::Root, Name::Current)]);
        }
        if m.is(Mutation::GcBeforeDirFsync) {
            ops.extend([FsOp::Ack, FsOp::Gc, FsOp::SyncDir(DirId::Root)]);
        } else {
            ops.extend([FsOp::SyncDir(DirId::Root), FsOp::Ack, FsOp::Gc]);
        }
        self.ops = ops;
    }

    fn op(&mut self, m: &CheckpointModel) {
        if self.ops.is_empty() {
            return;
        }
        let op = self.ops.remove(0);
        match op {
            FsOp::Create(d) => {
                let ino = self.fs.inodes.len() as u8;
                self.fs.inodes.push(Inode {
                    data: Data::Torn,
                    durable: Data::Torn,
                });
                self.fs.dir_mut(d).pending.push(DirOp::Link(Name::Tmp, ino));
                self.tmp = Some(ino);
            }
            FsOp::Write(data) => {
                if let Some(i) = self.tmp {
                    self.fs.inodes[i as usize].data = data;
                }
            }
            FsOp::Fsync => {
                if let Some(i) = self.tmp {
                    let ino = &mut self.fs.inodes[i as usize];
                    ino.durable = ino.data;
                }
            }
            FsOp::Rename(d, to) => {
                self.fs
                    .dir_mut(d)
                    .pending
                    .push(DirOp::Rename(Name::Tmp, to));
            }
            FsOp::StoreBlob(b) => {
                let existing = self.fs.read(DirId::Blobs, Name::Blob(b));
                if m.dedup_verifies_digest && existing.is_some_and(|d| d != Data::Blob(b)) {
                    // A corrupt blob is refused, not rewritten: the publish fails.
                    self.ops = vec![FsOp::Unlink(DirId::Blobs, Name::Tmp)];
                    self.publish_failed = true;
                } else if existing.is_some() {
                    // Dedup: the temp file is dropped unsynced.
                    self.seen |= S_DEDUP;
                    self.ops.insert(0, FsOp::Unlink(DirId::Blobs, Name::Tmp));
                } else {
                    self.ops.splice(
                        0..0,
                        [FsOp::Fsync, FsOp::Rename(DirId::Blobs, Name::Blob(b))],
                    );
                }
            }
            FsOp::Unlink(d, n) => {
                if n != Name::Tmp {
                    self.check_gc_unlink(d, n);
                }
                self.fs.dir_mut(d).pending.push(DirOp::Unlink(n));
            }
            FsOp::SyncDir(d) => {
                let dir = self.fs.dir_mut(d);
                dir.durable = dir.live();
                dir.pending.clear();
            }
            FsOp::Ack => self.acked = true,
            FsOp::Gc => {
                // The GC starts only once the new CURRENT is durable (I13).
                if !self.fs.dir(DirId::Root).pending.is_empty() {
                    self.violations |= V_GC;
                }
                self.plan_gc(m);
            }
            FsOp::Sweep => {
                let mut ops = Vec::new();
                for d in DirId::ALL {
                    if self.fs.lookup(d, Name::Tmp).is_some() {
                        ops.extend([FsOp::Unlink(d, Name::Tmp), FsOp::SyncDir(d)]);
                    }
                }
                self.ops.splice(0..0, ops);
            }
        }
        // The temp file is the writer's until its directory is synced (a rename keeps the
        // descriptor: the mutant that renames first still fsyncs through it) or it is dropped.
        self.tmp = match op {
            FsOp::Unlink(..) | FsOp::SyncDir(_) | FsOp::Gc | FsOp::Ack => None,
            FsOp::Create(_)
            | FsOp::Write(_)
            | FsOp::Fsync
            | FsOp::Rename(..)
            | FsOp::StoreBlob(_)
            | FsOp::Sweep => self.tmp,
        };
        if self.ops.is_empty() {
            match self.stage {
                Stage::Opening => self.stage = Stage::Loading,
                Stage::Publishing => {
                    self.feed(if self.publish_failed {
                        Event::CheckpointFailed
                    } else {
                        Event::CheckpointPublished
                    });
                    self.drive(m);
                }
                Stage::Idle | Stage::Loading | Stage::Halted => {}
            }
        }
    }

    /// `gc::plan` as built, from what reads see: keep `CURRENT` and its ancestors up to `keep`,
    /// delete other readable manifests, then blobs no kept manifest lists (none at all if a
    /// kept manifest is unreadable).
    fn plan_gc(&mut self, m: &CheckpointModel) {
        let Some(Data::Current { id, .. }) = self.fs.read(DirId::Root, Name::Current) else {
            return;
        };
        let manifests: Vec<(u8, Option<u8>)> = self
            .fs
            .dir(DirId::Manifests)
            .live()
            .iter()
            .filter_map(|(n, ino)| match (n, self.fs.inodes[*ino as usize].data) {
                (Name::Manifest(k), Data::Manifest { id, run }) if id == *k => {
                    Some((*k, Some(run)))
                }
                (Name::Manifest(k), _) => Some((*k, None)),
                _ => None,
            })
            .collect();
        let mut kept = Vec::new();
        let mut referenced = vec![BlobId::Shared];
        let mut skip_blobs = false;
        let mut next = Some(id);
        while let Some(k) = next {
            if kept.len() == usize::from(self.keep) {
                break;
            }
            match manifests.iter().find(|(id, _)| *id == k) {
                Some((_, Some(run))) => {
                    kept.push(k);
                    referenced.push(BlobId::Own(*run));
                    next = k.checked_sub(1).filter(|p| *p > 0);
                }
                Some((_, None)) => {
                    kept.push(k);
                    skip_blobs = true;
                    next = None;
                }
                None => next = None,
            }
        }
        let mut ops = Vec::new();
        let mut deleted_runs = Vec::new();
        for (k, run) in &manifests {
            if let Some(run) = run
                && !kept.contains(k)
            {
                ops.push(FsOp::Unlink(DirId::Manifests, Name::Manifest(*k)));
                deleted_runs.push(*run);
            }
        }
        if !ops.is_empty() {
            ops.push(FsOp::SyncDir(DirId::Manifests));
        }
        let blobs_before = ops.len();
        if !skip_blobs {
            for (n, _) in self.fs.dir(DirId::Blobs).live() {
                if let Name::Blob(b) = n {
                    let doomed = if m.is(Mutation::GcIgnoresSharing) {
                        // Every blob a deleted manifest lists.
                        b == BlobId::Shared && !deleted_runs.is_empty()
                            || matches!(b, BlobId::Own(r) if deleted_runs.contains(&r))
                    } else {
                        !referenced.contains(&b)
                    };
                    if doomed {
                        ops.push(FsOp::Unlink(DirId::Blobs, n));
                    }
                }
            }
        }
        if ops.len() > blobs_before {
            ops.push(FsOp::SyncDir(DirId::Blobs));
        }
        if !ops.is_empty() {
            self.seen |= S_GC_DELETED;
        }
        self.ops.splice(0..0, ops);
    }

    /// I13: the GC never deletes a file of a checkpoint `CURRENT` could name after a crash now.
    fn check_gc_unlink(&mut self, d: DirId, n: Name) {
        for cur in self.fs.possible_currents() {
            let Some(Data::Current { id, run }) = cur else {
                continue;
            };
            let protected = match (d, n) {
                (DirId::Manifests, Name::Manifest(k)) => k == id,
                (DirId::Blobs, Name::Blob(BlobId::Shared)) => true,
                (DirId::Blobs, Name::Blob(BlobId::Own(r))) => r == run,
                _ => false,
            };
            if protected {
                self.violations |= V_GC;
            }
        }
    }

    /// The store's load: `CURRENT` absent is no checkpoint; otherwise it must name a complete,
    /// digest-valid checkpoint, or the load refuses and changes nothing.
    fn load(&mut self, m: &CheckpointModel) {
        let before = self.fs.visible();
        let current = self.fs.read(DirId::Root, Name::Current);
        let valid = current.is_none_or(|c| self.fs.complete(c, true));
        let accepted = current.is_none_or(|c| self.fs.complete(c, !m.is(Mutation::SkipBlobDigest)));
        let accepted = if !accepted && m.is(Mutation::RepairOnLoad) {
            self.repair()
        } else {
            accepted
        };
        if accepted && !valid {
            self.violations |= V_ACCEPT;
        }
        if !valid && self.fs.visible() != before {
            self.violations |= V_REPAIR;
        }
        if !valid && !accepted {
            self.seen |= S_CORRUPT_REFUSED;
        }
        self.stage = Stage::Idle;
        self.feed(if accepted {
            Event::RecoveryDone
        } else {
            Event::RecoveryFailed(Fault::State)
        });
        self.drive(m);
    }

    /// `RepairOnLoad`: point `CURRENT` at the newest complete checkpoint, durably.
    fn repair(&mut self) -> bool {
        let candidates: Vec<Data> = self
            .fs
            .dir(DirId::Manifests)
            .live()
            .iter()
            .filter_map(|(_, ino)| match self.fs.inodes[*ino as usize].data {
                Data::Manifest { id, run } => Some(Data::Current { id, run }),
                _ => None,
            })
            .filter(|c| self.fs.complete(*c, true))
            .collect();
        let Some(best) = candidates.into_iter().max() else {
            return false;
        };
        let ino = self.fs.inodes.len() as u8;
        self.fs.inodes.push(Inode {
            data: best,
            durable: best,
        });
        let root = self.fs.dir_mut(DirId::Root);
        let mut live = root.live();
        apply(&mut live, DirOp::Link(Name::Current, ino));
        root.durable = live;
        root.pending.clear();
        true
    }

    /// Whether this entry is part of the checkpoint `CURRENT` names (or is `CURRENT`): what a
    /// load reads.
    fn referenced(&self, d: DirId, n: Name) -> bool {
        let current = match self.fs.read(DirId::Root, Name::Current) {
            Some(Data::Current { id, run }) => Some((id, run)),
            _ => None,
        };
        match (d, n) {
            (DirId::Root, Name::Current) => true,
            (DirId::Manifests, Name::Manifest(k)) => current.is_some_and(|c| c.0 == k),
            (DirId::Blobs, Name::Blob(BlobId::Shared)) => current.is_some(),
            (DirId::Blobs, Name::Blob(BlobId::Own(r))) => current.is_some_and(|c| c.1 == r),
            _ => false,
        }
    }

    /// The unsynced inodes, in order: a crash mask bit per inode says whether its new data
    /// survived.
    fn unsynced(&self) -> Vec<u8> {
        (0..self.fs.inodes.len() as u8)
            .filter(|i| {
                let ino = self.fs.inodes[*i as usize];
                ino.data != ino.durable
            })
            .collect()
    }
}

impl Model for CheckpointModel {
    type State = CheckpointState;
    type Action = CheckpointAction;

    fn init_states(&self) -> Vec<CheckpointState> {
        self.keeps
            .iter()
            .map(|&keep| CheckpointState {
                fs: Fs::default(),
                keep,
                drv: Driver::new(Config::in_process()),
                stage: Stage::Idle,
                run: 0,
                ops: Vec::new(),
                tmp: None,
                old: None,
                old_valid: true,
                new: None,
                acked: false,
                publish_failed: false,
                crashes_left: self.crashes,
                corruptions_left: self.corruptions,
                seen: 0,
                violations: 0,
            })
            .collect()
    }

    fn actions(&self, s: &CheckpointState, out: &mut Vec<CheckpointAction>) {
        match s.stage {
            Stage::Idle => {
                if s.run < self.runs {
                    out.push(CheckpointAction::Run);
                }
                if s.corruptions_left > 0 && s.run > 0 {
                    for d in DirId::ALL {
                        for (n, _) in s.fs.dir(d).live() {
                            if n != Name::Tmp && (self.corrupt_orphans || s.referenced(d, n)) {
                                out.push(CheckpointAction::Corrupt(d, n));
                            }
                        }
                    }
                }
            }
            Stage::Opening | Stage::Publishing => out.push(CheckpointAction::Op),
            Stage::Loading => out.push(CheckpointAction::Load),
            Stage::Halted => {}
        }
        if s.crashes_left > 0 && matches!(s.stage, Stage::Opening | Stage::Publishing) {
            let per_dir: Vec<u32> = s.fs.dirs.iter().map(|d| 1u32 << d.pending.len()).collect();
            let files = 1u32 << s.unsynced().len();
            for a in 0..per_dir[0] {
                for b in 0..per_dir[1] {
                    for c in 0..per_dir[2] {
                        for f in 0..files {
                            out.push(CheckpointAction::Crash([a, b, c], f));
                        }
                    }
                }
            }
        }
    }

    fn next_state(&self, s: &CheckpointState, action: CheckpointAction) -> Option<CheckpointState> {
        let mut s = s.clone();
        match action {
            CheckpointAction::Run => {
                s.run += 1;
                s.drv = Driver::new(Config::in_process());
                s.old = s.fs.read(DirId::Root, Name::Current);
                s.old_valid = s.old.is_none_or(|c| s.fs.complete(c, true));
                s.new = None;
                s.acked = false;
                s.publish_failed = false;
                s.feed(Event::Start);
                s.drive(self);
            }
            CheckpointAction::Op => s.op(self),
            CheckpointAction::Load => s.load(self),
            CheckpointAction::Corrupt(d, n) => {
                s.corruptions_left -= 1;
                let ino = s.fs.lookup(d, n)?;
                s.fs.inodes[ino as usize] = Inode {
                    data: Data::Torn,
                    durable: Data::Torn,
                };
            }
            CheckpointAction::Crash(masks, files) => {
                s.crashes_left -= 1;
                let unsynced = s.unsynced();
                for (k, ino) in unsynced.iter().enumerate() {
                    let i = &mut s.fs.inodes[*ino as usize];
                    if files & (1 << k) == 0 {
                        i.data = i.durable;
                    } else {
                        i.durable = i.data;
                    }
                }
                for (d, mask) in s.fs.dirs.iter_mut().zip(masks) {
                    let mut e = d.durable.clone();
                    for (k, op) in d.pending.iter().enumerate() {
                        if mask & (1 << k) != 0 {
                            apply(&mut e, *op);
                        }
                    }
                    d.durable = e;
                    d.pending.clear();
                }
                s.check_after_crash();
                s.stage = Stage::Idle;
                s.ops.clear();
                s.tmp = None;
                s.drv = Driver::new(Config::in_process());
            }
        }
        let mut tmp = s.tmp;
        s.fs.normalize(&mut tmp);
        s.tmp = tmp;
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // I12: checked on the state each crash leaves.
            Property::always(CURRENT_VALID_AFTER_CRASH, |_, s: &CheckpointState| {
                s.violations & V_CRASH == 0
            }),
            Property::sometimes(
                "crash keeps the old checkpoint",
                |_, s: &CheckpointState| s.seen & S_KEPT_OLD != 0,
            ),
            Property::sometimes(
                "crash keeps the new checkpoint",
                |_, s: &CheckpointState| s.seen & S_KEPT_NEW != 0,
            ),
            // I13: checked at every GC unlink and at the start of every GC.
            Property::always(GC_KEEPS_CURRENT, |_, s: &CheckpointState| {
                s.violations & V_GC == 0
            }),
            Property::sometimes(
                "gc deletes a superseded checkpoint",
                |_, s: &CheckpointState| s.seen & S_GC_DELETED != 0,
            ),
            Property::sometimes(
                "a shared blob is not rewritten",
                |_, s: &CheckpointState| s.seen & S_DEDUP != 0,
            ),
            // I14: a refusing load changes nothing.
            Property::always(NO_REPAIR, |_, s: &CheckpointState| {
                s.violations & V_REPAIR == 0
            }),
            Property::sometimes(
                "a corrupt checkpoint is refused",
                |_, s: &CheckpointState| s.seen & S_CORRUPT_REFUSED != 0,
            ),
            // I14/I12: the load never accepts what is not complete and digest-valid.
            Property::always(CORRUPTION_REFUSED, |_, s: &CheckpointState| {
                s.violations & V_ACCEPT == 0
            }),
            Property::sometimes("three runs publish", |_, s: &CheckpointState| {
                s.seen & S_THREE != 0
            }),
            Property::always(LEGAL_EVENTS, |_, s: &CheckpointState| {
                s.violations & V_ILLEGAL == 0
            }),
        ]
    }
}

impl CheckpointState {
    /// I12 on the state a crash left: `CURRENT` is as before the run, or this run's new one
    /// (which it must be once acknowledged), and names a complete, digest-valid checkpoint.
    fn check_after_crash(&mut self) {
        let cur = self.fs.read(DirId::Root, Name::Current);
        let allowed = if self.acked {
            cur == self.new
        } else {
            cur == self.old || (self.new.is_some() && cur == self.new)
        };
        // A pointer a corruption broke before the run stays broken; the crash is not to blame.
        let valid =
            cur.is_none_or(|c| self.fs.complete(c, true)) || (cur == self.old && !self.old_valid);
        if !(allowed && valid) {
            self.violations |= V_CRASH;
        }
        if self.new.is_some() && self.old.is_some() && cur == self.old {
            self.seen |= S_KEPT_OLD;
        }
        if self.new.is_some() && !self.acked && cur == self.new {
            self.seen |= S_KEPT_NEW;
        }
    }
}

impl crate::run::Describe for CheckpointModel {
    fn describe(&self, path: &[(CheckpointState, Option<CheckpointAction>)]) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some((s, _)) = path.first() {
            lines.push(format!("keep = {}", s.keep));
        }
        for (s, a) in path {
            let Some(a) = a else { continue };
            lines.push(match a {
                CheckpointAction::Run => format!("run {} starts", s.run + 1),
                CheckpointAction::Op => match s.ops.first() {
                    Some(op) => format!("{op:?}"),
                    None => "(no operation)".into(),
                },
                CheckpointAction::Load => format!(
                    "load: CURRENT = {:?}",
                    s.fs.read(DirId::Root, Name::Current)
                ),
                CheckpointAction::Crash(m, f) => {
                    format!("crash (directory masks {m:?}, file data mask {f:#b})")
                }
                CheckpointAction::Corrupt(d, n) => format!("corrupt {d:?}/{n:?}"),
            });
        }
        if let Some((s, _)) = path.last() {
            lines.push(format!(
                "CURRENT = {:?}",
                s.fs.read(DirId::Root, Name::Current)
            ));
        }
        lines
    }
}
