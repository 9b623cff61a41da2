//! Shared helpers of the checkpoint integration tests: fixtures, generations of checkpoint
//! content, tree snapshots, and the child-process entry point used for crash tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use tenure::checkpoint::{
    Checkpoint, CheckpointStore, PublishFile, Published, Source, StoreOptions,
};
use tenure::privfs::StateDir;

/// Env var that turns a re-executed test binary into a crash-test child.
pub const CHILD_ENV: &str = "TENURE_CKPT_CHILD";

/// A fresh private state dir in a temp dir, with the lease epoch file at `epoch`.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub state: PathBuf,
}

impl Fixture {
    pub fn new(epoch: u64) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let sd = StateDir::open(&state, true).unwrap();
        set_epoch(&sd, epoch);
        Fixture { tmp, state }
    }

    pub fn open(&self) -> StateDir {
        StateDir::open(&self.state, false).unwrap()
    }

    pub fn store_dir(&self) -> PathBuf {
        self.state.join("checkpoints")
    }
}

/// Writes the lease epoch file as an owner acquiring at `epoch` would.
pub fn set_epoch(sd: &StateDir, epoch: u64) {
    let control = sd
        .root()
        .ensure_dir(tenure::lease::CONTROL_DIR, "test")
        .unwrap();
    tenure::lease::epoch::write(&control, epoch).unwrap();
}

/// The files of generation `g`: a counter that always changes, a payload that changes with
/// `g`, a file that never changes (exercises dedup), and a nested name.
pub fn generation(g: u64) -> Vec<(String, Vec<u8>)> {
    let mut payload = Vec::with_capacity(40_000);
    let mut x = g.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while payload.len() < 40_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        payload.extend_from_slice(&x.to_le_bytes());
    }
    vec![
        ("counter".to_string(), format!("{g}\n").into_bytes()),
        ("data/payload.bin".to_string(), payload),
        ("static.txt".to_string(), b"never changes\n".to_vec()),
    ]
}

/// Publishes generation `g` through `publish_files`.
pub fn publish_gen(store: &CheckpointStore<'_>, epoch: u64, g: u64) -> Published {
    let files = generation(g);
    let list = files
        .iter()
        .map(|(n, b)| PublishFile {
            name: n.clone(),
            mode: 0o600,
            source: Source::Reader(Box::new(&b[..])),
        })
        .collect();
    store.publish_files(epoch, list).unwrap()
}

/// Reads every file of a checkpoint through the verifying reader.
pub fn contents(store: &CheckpointStore<'_>, cp: &Checkpoint) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    cp.entries
        .iter()
        .map(|e| {
            let mut v = Vec::new();
            store.open_entry(e).unwrap().read_to_end(&mut v).unwrap();
            (e.name.clone(), v)
        })
        .collect()
}

/// Which generation a loaded checkpoint holds; panics unless it is exactly some generation.
pub fn generation_of(store: &CheckpointStore<'_>, cp: &Checkpoint) -> u64 {
    let files = contents(store, cp);
    let counter = &files
        .iter()
        .find(|(n, _)| n == "counter")
        .expect("counter")
        .1;
    let g: u64 = std::str::from_utf8(counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        files,
        generation(g),
        "checkpoint is not exactly generation {g}"
    );
    g
}

/// What a tree holds: relative path → (mode, file bytes or link target, `dir` for directories).
pub type Snapshot = BTreeMap<PathBuf, (u32, Vec<u8>)>;

/// Snapshots a tree byte for byte (modes and contents), never following links.
pub fn snapshot(root: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    snap_into(root, root, &mut out);
    out
}

fn snap_into(root: &Path, p: &Path, out: &mut Snapshot) {
    let md = std::fs::symlink_metadata(p).unwrap();
    let rel = p.strip_prefix(root).unwrap().to_path_buf();
    let mode = md.mode();
    if md.file_type().is_symlink() {
        out.insert(
            rel,
            (
                mode,
                std::fs::read_link(p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes(),
            ),
        );
    } else if md.is_dir() {
        out.insert(rel, (mode, b"dir".to_vec()));
        for e in std::fs::read_dir(p).unwrap() {
            snap_into(root, &e.unwrap().path(), out);
        }
    } else if !md.is_file() {
        // FIFOs, sockets and devices: record the kind, never open them (a FIFO would block).
        out.insert(rel, (mode, b"special".to_vec()));
    } else {
        // Read-only blobs are readable by their owner, so no chmod is needed here.
        out.insert(rel, (mode, std::fs::read(p).unwrap()));
    }
}

/// Every temp file (`.tmp-*`) under `root`.
pub fn temp_files(root: &Path) -> Vec<PathBuf> {
    snapshot(root)
        .into_keys()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".tmp-"))
        })
        .collect()
}

/// Overwrites a file even if it is read-only, restoring its mode afterwards.
pub fn overwrite(path: &Path, bytes: &[u8]) {
    let mode = std::fs::metadata(path).unwrap().permissions().mode();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Spawns this test binary as a crash-test child running `entry` (the name of an ignored test
/// function that acts on `CHILD_ENV`), with extra env vars.
pub fn spawn_child(entry: &str, role: &str, envs: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        entry,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .env(CHILD_ENV, role)
    .env_remove("TENURE_FAILPOINTS")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Makes a crashing child leave no core file behind (abort would otherwise dump one).
pub fn no_core_dumps() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Core);
    lim.current = Some(0);
    let _ = setrlimit(Resource::Core, lim);
}

/// A small xorshift generator so trial schedules are reproducible from a printed seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A seed from the clock, or from `TENURE_SEED` to replay a failure.
pub fn seed() -> u64 {
    std::env::var("TENURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        })
}

/// Whether the long variants of the sweeps were asked for.
pub fn long() -> bool {
    std::env::var("TENURE_LONG").is_ok_and(|v| v == "1")
}

/// The default store options.
pub fn opts() -> StoreOptions {
    StoreOptions::default()
}

/// The lowercase hex sha256 of `b`: a blob's name under `blobs/sha256/`.
pub fn sha(b: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}
