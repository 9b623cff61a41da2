//! Checkpoint store benchmarks, each printed as a ratio against a baseline measured
//! in the same run:
//!
//! - verify a cached checkpoint (full `load`) vs in-process sha2 on the same bytes (in memory,
//!   and streamed from the same files) and vs `sha256sum`; peak RSS of a child that only loads;
//! - publish vs writing + fsyncing the same bytes by hand plus one durable pointer replace;
//! - incremental publish (one 4 MiB file changed) vs writing + fsyncing 4 MiB;
//! - publish and load of 100,000 small files (1,000,000 with `TENURE_BENCH_FULL=1`) vs writing
//!   them plainly (with and without an fsync each) and reading them back with sha256, with the
//!   peak RSS of the publishing and the loading process. `TENURE_BENCH_MANY_ONLY=1`
//!   runs only these.
//!
//! - issue 11's store rows: a child writing 20,000 and 100,000 small files under `tenure run`
//!   (published when it exits 0) vs the same writer into a plain dir followed by `sync -f`
//!   (`TENURE_BENCH_MANY_RUNS`, default 3, interleaved repetitions; medians); verify (a full
//!   `load`) of 8 × 32 MiB blobs and of one 256 MiB blob vs `openssl dgst -sha256` of the same
//!   files (7 interleaved repetitions); SIGTERM → exit of a ready owner whose child staged a
//!   100 MiB checkpoint vs the publish of the same 100 MiB through the library alone (adopting
//!   the staged file, as the runner's publish does; the copying publish printed beside it)
//!   (`TENURE_BENCH_PUBLISH_RUNS`, default 5; target ≤ +10 ms); `tenure run -- true` in a dir
//!   with 10,000 older manifests and 10,000 kept failed outputs (`TENURE_BENCH_HISTORY` sets
//!   the count) vs a dir with one checkpoint (`TENURE_BENCH_RUNS`, default 40, interleaved;
//!   target ratio about 1). `TENURE_BENCH_ISSUE11_ONLY=1` runs only these, and
//!   `TENURE_BENCH_ROW=verify|many|stop|history` only one of them.
//!
//! Default sizes run in about a minute (`cargo bench --bench checkpoint`); the issue's sizes
//! (1 GiB verify, 256 MiB publish, 1 GiB incremental) with `TENURE_BENCH_FULL=1`;
//! `TENURE_BENCH_QUICK=1` divides sizes and counts by 16 (a smoke run).

mod common;

use common::{TENURE, ms, runs, timed};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use tenure::checkpoint::{CheckpointStore, PublishFile, Published, Source, StoreOptions};
use tenure::lease::{self, AcquireOptions, WaitBound};
use tenure::machine::PhaseKind;
use tenure::privfs::StateDir;

const MIB: usize = 1 << 20;

fn full() -> bool {
    std::env::var("TENURE_BENCH_FULL").is_ok_and(|v| v == "1")
}

/// Divides the default sizes by 16 with `TENURE_BENCH_QUICK=1` (a smoke run).
fn scale(bytes: usize) -> usize {
    if std::env::var("TENURE_BENCH_QUICK").is_ok_and(|v| v == "1") {
        bytes / 16
    } else {
        bytes
    }
}

fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = seed.wrapping_mul(2).wrapping_add(1);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<F: FnMut()>(runs: usize, mut f: F) -> Duration {
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

/// Flushes every dirty page and pending journal commit of the machine and lets the device
/// settle, so each timed step starts from a quiet disk and does not pay for the previous step's
/// deferred work (on a filesystem mounted with online `discard`, the discards of a deleted
/// file run after the commit that `sync` waits for; a settle time is the only handle on them).
fn quiesce() {
    rustix::fs::sync();
    std::thread::sleep(Duration::from_millis(300));
    rustix::fs::sync();
}

fn mibs(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / MIB as f64 / d.as_secs_f64()
}

fn set_epoch(sd: &StateDir, epoch: u64) {
    let control = sd
        .root()
        .ensure_dir(tenure::lease::CONTROL_DIR, "bench")
        .unwrap();
    tenure::lease::epoch::write(&control, epoch).unwrap();
}

/// Publishes `files` (name, bytes) into a fresh state dir under `root`.
fn make_store(root: &Path, files: &[(String, Vec<u8>)]) -> StateDir {
    let sd = StateDir::open(root, true).unwrap();
    set_epoch(&sd, 1);
    let store = CheckpointStore::open_owned(&sd, StoreOptions::default()).unwrap();
    let list = files
        .iter()
        .map(|(n, b)| PublishFile {
            name: n.clone(),
            mode: 0o600,
            source: Source::Reader(Box::new(&b[..])),
        })
        .collect();
    store.publish_files(1, list).unwrap();
    drop(store);
    sd
}

fn vm_hwm_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn bench_verify(tmp: &Path) {
    let total = scale(if full() { 1024 * MIB } else { 256 * MIB });
    let per = scale(64 * MIB);
    let files: Vec<(String, Vec<u8>)> = (0..total / per)
        .map(|i| (format!("part/{i:03}"), payload(per, i as u64 + 11)))
        .collect();
    let state = tmp.join("verify");
    let sd = make_store(&state, &files);
    let store = CheckpointStore::open(&sd, StoreOptions::default()).unwrap();
    let cp = store.load().unwrap().unwrap(); // also warms the page cache
    let blob_paths: Vec<_> = cp
        .entries
        .iter()
        .map(|e| {
            state
                .join("checkpoints/blobs/sha256")
                .join(e.sha256.to_hex())
        })
        .collect();

    let t_load = time(3, || {
        assert_eq!(store.load().unwrap().unwrap().id, cp.id);
    });
    let t_mem = time(3, || {
        for (_, b) in &files {
            std::hint::black_box(Sha256::digest(b));
        }
    });
    drop(files);
    let t_stream = time(3, || {
        let mut buf = vec![0u8; MIB];
        for p in &blob_paths {
            let mut f = File::open(p).unwrap();
            let mut h = Sha256::new();
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            std::hint::black_box(h.finalize());
        }
    });
    let t_sum = time(1, || {
        let st = Command::new("sha256sum")
            .args(&blob_paths)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
    });
    // Peak RSS of a process that does nothing but open the store and load (verify) it.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--verify-child", state.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hwm: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();

    println!(
        "verify {} MiB cached checkpoint ({} files):",
        total / MIB,
        blob_paths.len()
    );
    println!(
        "  load (full verify)     {:>8.1} MiB/s",
        mibs(total, t_load)
    );
    println!(
        "  sha2 in memory         {:>8.1} MiB/s   load/this = {:.2}",
        mibs(total, t_mem),
        t_mem.as_secs_f64() / t_load.as_secs_f64()
    );
    println!(
        "  sha2 streamed, 1 MiB   {:>8.1} MiB/s   load/this = {:.2}",
        mibs(total, t_stream),
        t_stream.as_secs_f64() / t_load.as_secs_f64()
    );
    println!(
        "  sha256sum              {:>8.1} MiB/s   load/this = {:.2}x faster",
        mibs(total, t_sum),
        t_sum.as_secs_f64() / t_load.as_secs_f64()
    );
    println!(
        "  peak RSS of a verifying process: {:.1} MiB (VmHWM)",
        hwm as f64 / 1024.0
    );
}

/// The hand-written floor: write + fsync the bytes into one new file, then a durable pointer
/// replace (temp, write, fsync, rename, dir fsync).
fn by_hand(dir: &Path, i: usize, bytes: &[u8]) {
    let data = dir.join(format!("data-{i}"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&data)
        .unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
    drop(f);
    File::open(dir).unwrap().sync_all().unwrap();
    let tmp = dir.join("pointer.tmp");
    let mut p = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .unwrap();
    p.write_all(format!("data-{i}\n").as_bytes()).unwrap();
    p.sync_all().unwrap();
    drop(p);
    std::fs::rename(&tmp, dir.join("pointer")).unwrap();
    File::open(dir).unwrap().sync_all().unwrap();
}

fn bench_publish(tmp: &Path) {
    let size = scale(if full() { 256 * MIB } else { 64 * MIB });
    let runs = 5;
    let state = tmp.join("publish");
    let sd = StateDir::open(&state, true).unwrap();
    set_epoch(&sd, 1);
    let store = CheckpointStore::open_owned(&sd, StoreOptions { keep: 1 }).unwrap();
    // The same publish without garbage to collect, to show what the GC costs.
    let state2 = tmp.join("publish-nogc");
    let sd2 = StateDir::open(&state2, true).unwrap();
    set_epoch(&sd2, 1);
    let nogc = CheckpointStore::open_owned(&sd2, StoreOptions { keep: 1000 }).unwrap();
    let mut nogc_times = Vec::new();
    let hand_gc = tmp.join("by-hand-gc");
    std::fs::create_dir(&hand_gc).unwrap();
    let mut hand_gc_times = Vec::new();
    let hand = tmp.join("by-hand");
    std::fs::create_dir(&hand).unwrap();
    let mut bytes = payload(size, 5);
    let mut i = 0usize;
    let mut pub_times = Vec::new();
    let mut hand_times = Vec::new();
    // Interleaved so both see the same disk state; a new first word each time defeats dedup.
    for _ in 0..runs {
        i += 1;
        bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
        quiesce();
        let t = Instant::now();
        let res = store
            .publish_files(
                1,
                vec![PublishFile {
                    name: "state.bin".into(),
                    mode: 0o600,
                    source: Source::Reader(Box::new(&bytes[..])),
                }],
            )
            .unwrap();
        pub_times.push(t.elapsed());
        assert!(matches!(res, Published::New { .. }));
        quiesce();
        let t = Instant::now();
        nogc.publish_files(
            1,
            vec![PublishFile {
                name: "state.bin".into(),
                mode: 0o600,
                source: Source::Reader(Box::new(&bytes[..])),
            }],
        )
        .unwrap();
        nogc_times.push(t.elapsed());
        quiesce();
        let t = Instant::now();
        by_hand(&hand, i, &bytes);
        hand_times.push(t.elapsed());
        std::fs::remove_file(hand.join(format!("data-{i}"))).unwrap();
        // The hand-written floor of "keep the last one": also delete the previous file.
        quiesce();
        let t = Instant::now();
        by_hand(&hand_gc, i, &bytes);
        if i > 1 {
            std::fs::remove_file(hand_gc.join(format!("data-{}", i - 1))).unwrap();
        }
        hand_gc_times.push(t.elapsed());
    }
    let (p, h) = (median(pub_times), median(hand_times));
    let (n, hg) = (median(nogc_times), median(hand_gc_times));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!("publish {} MiB (median of {runs}):", size / MIB);
    println!("  write+fsync+pointer by hand        {:>8.1} ms", ms(h));
    println!(
        "  store publish, nothing to collect  {:>8.1} ms   ratio = {:.2}",
        ms(n),
        ratio(n, h)
    );
    println!("  by hand, deleting the previous one {:>8.1} ms", ms(hg));
    println!(
        "  store publish, GC of the previous  {:>8.1} ms   ratio = {:.2} (vs by hand deleting: {:.2})",
        ms(p),
        ratio(p, h),
        ratio(p, hg)
    );
}

fn bench_incremental(tmp: &Path) {
    let total = scale(if full() { 1024 * MIB } else { 256 * MIB });
    let per = 4 * MIB;
    let n = total / per;
    let files: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| (format!("f/{i:04}"), payload(per, 1000 + i as u64)))
        .collect();
    let state = tmp.join("incremental");
    let sd = make_store(&state, &files);
    let store = CheckpointStore::open_owned(&sd, StoreOptions { keep: 2 }).unwrap();
    let hand = tmp.join("inc-by-hand");
    std::fs::create_dir(&hand).unwrap();
    let runs = 5;
    let mut pub_times = Vec::new();
    let mut hand_times = Vec::new();
    for r in 0..runs {
        // Outside the timed region: the owner holds its loaded checkpoint anyway.
        let cp = store.load().unwrap().unwrap().entries;
        let changed = payload(per, 50_000 + r as u64);
        let list: Vec<PublishFile> = cp
            .iter()
            .map(|e| {
                if e.name == "f/0001" {
                    PublishFile {
                        name: e.name.clone(),
                        mode: e.mode,
                        source: Source::Reader(Box::new(&changed[..])),
                    }
                } else {
                    PublishFile {
                        name: e.name.clone(),
                        mode: e.mode,
                        source: Source::Blob {
                            sha256: e.sha256,
                            size: e.size,
                        },
                    }
                }
            })
            .collect();
        quiesce();
        let t = Instant::now();
        let res = store.publish_files(1, list).unwrap();
        pub_times.push(t.elapsed());
        let Published::New { bytes_written, .. } = res else {
            panic!("one file changed, got {res:?}")
        };
        assert_eq!(bytes_written, per as u64);
        quiesce();
        let t = Instant::now();
        by_hand(&hand, r, &changed);
        hand_times.push(t.elapsed());
    }
    let (p, h) = (median(pub_times), median(hand_times));
    println!(
        "incremental publish: {} MiB checkpoint, one 4 MiB file changed (median of {runs}):",
        total / MIB
    );
    println!("  store publish          {:>8.1} ms", p.as_secs_f64() * 1e3);
    println!(
        "  write+fsync 4 MiB+ptr  {:>8.1} ms   ratio = {:.2}",
        h.as_secs_f64() * 1e3,
        p.as_secs_f64() / h.as_secs_f64()
    );

    // The same change through a staging area that holds every file: publish must re-hash all
    // of them to find the unchanged ones (reported for the runner path, no target).
    let staging = store.staging().unwrap();
    for (name, b) in &files {
        let p = staging.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b).unwrap();
    }
    std::fs::write(staging.path().join("f/0001"), payload(per, 99_999)).unwrap();
    quiesce();
    let t = Instant::now();
    store.publish(1, &staging).unwrap();
    let s = t.elapsed();
    println!(
        "  via a full staging dir {:>8.1} ms   ratio = {:.2} (re-hashes every file)",
        s.as_secs_f64() * 1e3,
        s.as_secs_f64() / h.as_secs_f64()
    );
    store.discard_staging(staging).unwrap();
}

/// The small files of the many-files benchmark: 100 bytes each, 1,000 per directory.
fn many_name(i: usize) -> String {
    format!("d{:04}/f{:06}", i / 1000, i)
}

fn fill_many(root: &Path, n: usize) {
    for i in 0..n {
        let name = many_name(i);
        if i % 1000 == 0 {
            std::fs::create_dir_all(root.join(&name).parent().unwrap()).unwrap();
        }
        std::fs::write(root.join(&name), payload(100, i as u64)).unwrap();
    }
}

/// Child process of [`bench_many`]: publishes a staging area of `n` small files into `state`
/// and prints the seconds taken and its peak RSS.
fn many_publish_child(state: &Path, n: usize) {
    let sd = StateDir::open(state, true).unwrap();
    set_epoch(&sd, 1);
    let store = CheckpointStore::open_owned(&sd, StoreOptions::default()).unwrap();
    let staging = store.staging().unwrap();
    fill_many(staging.path(), n);
    rustix::fs::sync();
    let t = Instant::now();
    let res = store.publish(1, &staging).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let Published::New { checkpoint, .. } = res else {
        panic!("new checkpoint expected")
    };
    assert_eq!(checkpoint.files, n as u64);
    store.discard_staging(staging).unwrap();
    println!("{secs} {}", vm_hwm_kib());
}

/// Child process of [`bench_many`]: loads (verifies every blob of) the checkpoint in `state`
/// and prints the seconds taken and its peak RSS.
fn many_load_child(state: &Path, n: usize) {
    let sd = StateDir::open(state, false).unwrap();
    let store = CheckpointStore::open(&sd, StoreOptions::default()).unwrap();
    store.load_summary().unwrap().unwrap(); // warm the cache like the baseline's reads
    let t = Instant::now();
    let s = store.load_summary().unwrap().unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(s.files, n as u64);
    println!("{secs} {}", vm_hwm_kib());
}

fn child_numbers(args: &[&str]) -> (f64, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    (
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().parse().unwrap(),
    )
}

/// Publish and load of `n` small files (100 bytes, 1,000 per directory) against writing the
/// same files plainly (with and without an fsync per file, as publish makes each blob durable)
/// and reading them back with sha256. Publish and load run in child processes so their peak
/// RSS is their own.
fn bench_many(tmp: &Path, n: usize) {
    // Each tree is written into a directory of its own and kept until the bench ends: a removal
    // right before the next writer slows its file creation (see `bench_many_under_run`).
    let plain = tmp.join(format!("plain-{n}-unsynced"));
    std::fs::create_dir_all(&plain).unwrap();
    rustix::fs::sync();
    let t = Instant::now();
    fill_many(&plain, n);
    let t_write = t.elapsed();
    let plain = tmp.join(format!("plain-{n}"));
    std::fs::create_dir_all(&plain).unwrap();
    quiesce();
    let t = Instant::now();
    for i in 0..n {
        let name = many_name(i);
        if i % 1000 == 0 {
            let d = plain.join(&name);
            std::fs::create_dir_all(d.parent().unwrap()).unwrap();
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(plain.join(&name))
            .unwrap();
        f.write_all(&payload(100, i as u64)).unwrap();
        f.sync_all().unwrap();
        if i % 1000 == 999 || i + 1 == n {
            File::open(plain.join(&name).parent().unwrap())
                .unwrap()
                .sync_all()
                .unwrap();
        }
    }
    let t_fsync = t.elapsed();
    let read_all = || {
        let mut buf = vec![0u8; 4096];
        for i in 0..n {
            let mut f = File::open(plain.join(many_name(i))).unwrap();
            let mut h = Sha256::new();
            loop {
                let k = f.read(&mut buf).unwrap();
                if k == 0 {
                    break;
                }
                h.update(&buf[..k]);
            }
            std::hint::black_box(h.finalize());
        }
    };
    read_all();
    let t = Instant::now();
    read_all();
    let t_read = t.elapsed();

    let state = tmp.join(format!("many-{n}"));
    quiesce();
    let (s_pub, hwm_pub) =
        child_numbers(&["--many-publish", state.to_str().unwrap(), &n.to_string()]);
    let (s_load, hwm_load) =
        child_numbers(&["--many-load", state.to_str().unwrap(), &n.to_string()]);
    let manifest_bytes: u64 = std::fs::read_dir(state.join("checkpoints/manifests"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    std::fs::remove_dir_all(&state).unwrap();
    println!(
        "{n} small files (100 bytes, 1,000 per directory; manifest {:.1} MiB):",
        manifest_bytes as f64 / MIB as f64
    );
    println!(
        "  write plainly, no fsync    {:>8.2} s",
        t_write.as_secs_f64()
    );
    println!(
        "  write plainly + fsync each {:>8.2} s",
        t_fsync.as_secs_f64()
    );
    println!(
        "  publish                    {:>8.2} s   publish/plain+fsync = {:.2}, publish/plain = {:.2}, peak RSS {:.1} MiB",
        s_pub,
        s_pub / t_fsync.as_secs_f64(),
        s_pub / t_write.as_secs_f64(),
        hwm_pub as f64 / 1024.0
    );
    println!(
        "  read + sha256 plainly      {:>8.2} s",
        t_read.as_secs_f64()
    );
    println!(
        "  load (verify every blob)   {:>8.2} s   load/plain = {:.2}, peak RSS {:.1} MiB",
        s_load,
        s_load / t_read.as_secs_f64(),
        hwm_load as f64 / 1024.0
    );
}

/// The writer of the many-files row: `n` files of 64 to 4,159 bytes in 100 directories under
/// `dir` (or `$TENURE_CHECKPOINT_OUT` when `dir` is `-`), written plainly, no fsync.
fn write_many_child(dir: &str, n: usize) {
    let dir = if dir == "-" {
        std::env::var("TENURE_CHECKPOINT_OUT").expect("run under `tenure run`")
    } else {
        dir.to_string()
    };
    let dir = Path::new(&dir);
    for d in 0..100 {
        std::fs::create_dir_all(dir.join(format!("d{d:02}"))).unwrap();
    }
    let mut buf = payload(4160, 7);
    for i in 0..n {
        let len = 64 + (i * 7919) % 4096;
        buf[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let p = dir.join(format!("d{:02}/f{i:07}", i % 100));
        std::fs::write(p, &buf[..len]).unwrap();
    }
}

/// Issue 11: a child writing many small files under `tenure run` (then published) vs the same
/// writer into a plain dir followed by `sync -f` (one flush of the filesystem), `runs`
/// interleaved repetitions of each (plain, run, plain, run, ...), medians and their ratio.
///
/// No tree is removed until the bench ends (they are under `tmp`): on ext4 without a journal
/// (this machine's root), creating a file within a minute or more of many deletions scans the
/// inode tables for recently deleted inodes (`recently_deleted` in the kernel), and a writer
/// that ran right after the previous run's tree was removed took 2 to 10 times as long (2.5 s
/// on a quiet filesystem, 7 to 27 s after deletions) — whichever side came second paid it.
fn bench_many_under_run(tmp: &Path, n: usize, runs: usize) {
    let me = std::env::current_exe().unwrap();
    let (mut plain_t, mut run_t) = (Vec::new(), Vec::new());
    let mut parts: [Vec<f64>; 3] = Default::default();
    for r in 0..runs {
        quiesce();
        let plain = tmp.join(format!("plain-many-{n}-{r}"));
        std::fs::create_dir_all(&plain).unwrap();
        let t = Instant::now();
        let st = Command::new(&me)
            .args(["--write-many", plain.to_str().unwrap(), &n.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let st = Command::new("sync").arg("-f").arg(&plain).status().unwrap();
        assert!(st.success());
        plain_t.push(t.elapsed());
        quiesce();
        let dir = tmp.join(format!("run-many-{n}-{r}"));
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .arg("run")
            .arg("--dir")
            .arg(&dir)
            .arg("--")
            .arg(&me)
            .args(["--write-many", "-", &n.to_string()])
            .output()
            .unwrap();
        run_t.push(t.elapsed());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let events = std::fs::read_to_string(dir.join(".tenure/events.jsonl")).unwrap();
        assert!(events.contains("checkpoint-published"), "nothing published");
        let at = event_times(&events);
        let ph = [
            at("child-exited") - at("spawned"),
            at("checkpoint-published") - at("child-exited"),
            at("released") - at("checkpoint-published"),
        ];
        for (all, p) in parts.iter_mut().zip(ph) {
            all.push(p);
        }
    }
    let (p, r) = (median(plain_t), median(run_t));
    println!("a child writing {n} small files (issue 11; median of {runs}, interleaved):");
    println!("  writer + sync -f           {:>8.2} s", p.as_secs_f64());
    println!(
        "  under tenure run, published {:>7.2} s   ratio = {:.2} (target <= 2)",
        r.as_secs_f64(),
        r.as_secs_f64() / p.as_secs_f64()
    );
    let [mut c, mut p, mut l] = parts;
    println!(
        "  the runner's event log (medians): child {:.2} s, publish {:.2} s, release (staging removal) {:.2} s",
        median_f(&mut c) / 1e3,
        median_f(&mut p) / 1e3,
        median_f(&mut l) / 1e3
    );
}

/// The time (ms) of the first event of each kind in an event log (NaN when it is missing).
fn event_times(log: &str) -> impl Fn(&str) -> f64 + '_ {
    move |kind: &str| {
        log.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["kind"] == kind)
            .and_then(|v| v["at_ms"].as_f64())
            .unwrap_or(f64::NAN)
    }
}

fn median_f(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Issue 11: a full `load` (every digest checked, blobs on up to the available cores) of
/// `count` blobs of `per` bytes vs `openssl dgst -sha256` of the same (cached) files.
fn bench_verify_vs_openssl(tmp: &Path, count: usize, per: usize) {
    let files: Vec<(String, Vec<u8>)> = (0..count)
        .map(|i| (format!("b{i}"), payload(per, i as u64 + 101)))
        .collect();
    let state = tmp.join(format!("verify-{count}x{}", per / MIB));
    let sd = make_store(&state, &files);
    drop(files);
    let store = CheckpointStore::open(&sd, StoreOptions::default()).unwrap();
    let cp = store.load().unwrap().unwrap(); // also warms the page cache
    let blob_paths: Vec<_> = cp
        .entries
        .iter()
        .map(|e| {
            state
                .join("checkpoints/blobs/sha256")
                .join(e.sha256.to_hex())
        })
        .collect();
    // Interleaved (load, openssl, load, ...), both on the cached files, so a burst of other
    // work on the machine hits both sides alike.
    let (mut loads, mut ssls) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        let t = Instant::now();
        assert_eq!(store.load().unwrap().unwrap().id, cp.id);
        loads.push(t.elapsed());
        let t = Instant::now();
        let st = Command::new("openssl")
            .args(["dgst", "-sha256"])
            .args(&blob_paths)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        ssls.push(t.elapsed());
    }
    let (t_load, t_ssl) = (median(loads), median(ssls));
    drop(store);
    std::fs::remove_dir_all(&state).unwrap();
    println!(
        "verify {count} x {} MiB (issue 11): load {:>8.1} MiB/s, openssl dgst -sha256 {:>8.1} MiB/s   load is {:.2}x faster",
        per / MIB,
        mibs(count * per, t_load),
        mibs(count * per, t_ssl),
        t_ssl.as_secs_f64() / t_load.as_secs_f64()
    );
}

/// 100 MiB whose first bytes make it unique to `tag` (so no publish finds its blob already
/// stored and skips the write).
fn tagged(base: &[u8], tag: &str) -> Vec<u8> {
    let mut v = base.to_vec();
    let t = tag.as_bytes();
    v[..t.len()].copy_from_slice(t);
    v
}

/// The library publish alone: own a fresh dir, stage the file, time `publish`.
fn publish_alone(dir: &Path, data: &[u8], adopt: bool) -> Duration {
    let sd = StateDir::open(dir, true).unwrap();
    let opts = AcquireOptions {
        wait: WaitBound::Try,
        cancel: None,
        phase: PhaseKind::Ready,
        fence: None,
    };
    let l = lease::acquire(&sd, &opts, &mut |_| {}).unwrap();
    let store = CheckpointStore::open_owned(&sd, StoreOptions { keep: 2 }).unwrap();
    let staging = store.staging().unwrap();
    let mut f = fs::File::create(staging.path().join("big")).unwrap();
    f.write_all(data).unwrap();
    drop(f);
    let t = Instant::now();
    if adopt {
        store.publish_adopting(l.epoch(), &staging).unwrap();
    } else {
        store.publish(l.epoch(), &staging).unwrap();
    }
    let d = t.elapsed();
    l.release().unwrap();
    d
}

/// A ready owner whose child staged `src` (100 MiB) and waits; SIGTERM → the runner's exit.
fn stop_with_publish(dir: &Path, src: &Path, staged: &Path) -> (Duration, [f64; 3]) {
    let script = r#"trap 'exit 0' TERM
cat "$1" > "$TENURE_CHECKPOINT_OUT/big"
: > "$2"
read _"#;
    let mut child = Command::new(TENURE)
        .arg("run")
        .arg("--dir")
        .arg(dir)
        .args(["--", "sh", "-c", script, "sh"])
        .arg(src)
        .arg(staged)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Held until the runner exited: `Child::wait` would close it, and the child's `read _`
    // would end on EOF instead of on the signal.
    let stdin = child.stdin.take();
    let events = dir.join(".tenure/events.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    // Event wait: the owner says ready and the child says its file is staged.
    while !(staged.exists()
        && fs::read_to_string(&events).is_ok_and(|s| s.contains("\"kind\":\"ready\"")))
    {
        assert!(Instant::now() < deadline, "the owner never became ready");
        std::thread::sleep(Duration::from_millis(1));
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    let t = Instant::now();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let st = child.wait().unwrap();
    let d = t.elapsed();
    drop(stdin);
    assert_eq!(st.code(), Some(143), "the owner did not stop in order");
    let log = fs::read_to_string(&events).unwrap_or_default();
    assert!(
        log.contains("checkpoint-published"),
        "nothing was published:\n{log}"
    );
    (d, phases(&log))
}

/// The runner's own account of a stop, from its event log (ms): signal → child exited, →
/// checkpoint published, → released.
fn phases(log: &str) -> [f64; 3] {
    let at = event_times(log);
    let s = at("signal");
    [
        at("child-exited") - s,
        at("checkpoint-published") - at("child-exited"),
        at("released") - at("checkpoint-published"),
    ]
}

/// Issue 11: SIGTERM → exit of a ready owner whose child staged 100 MiB against the library's
/// publish of the same 100 MiB alone, interleaved, with the runner's own account of where the
/// time went (its event log).
fn bench_stop_publish(tmp: &Path, m: usize) {
    println!(
        "== SIGTERM -> exit of a ready owner publishing 100 MiB  vs  the publish alone ({m} runs each)"
    );
    // Incompressible-looking but cheap bytes: a xorshift stream.
    let base = payload(100 * MIB, 0x9e37_79b9_7f4a_7c15);
    let (mut alone, mut copied, mut runner) = (Vec::new(), Vec::new(), Vec::new());
    let mut parts: [Vec<f64>; 3] = Default::default();
    for i in 0..m {
        // The runner's publish adopts the staged file; the baseline is the same publish.
        let data = tagged(&base, &format!("library-{i}-"));
        alone.push(publish_alone(&tmp.join(format!("lib-{i}")), &data, true));
        let _ = fs::remove_dir_all(tmp.join(format!("lib-{i}")));
        let data = tagged(&base, &format!("copy-{i}-"));
        copied.push(publish_alone(&tmp.join(format!("lib-{i}")), &data, false));
        let data = tagged(&base, &format!("runner-{i}-"));
        let src = tmp.join(format!("src-{i}"));
        // Written back before the measurement, so that in both cases only the staged copy is
        // dirty when the publish starts.
        let mut f = fs::File::create(&src).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let (d, ph) = stop_with_publish(
            &tmp.join(format!("run-{i}")),
            &src,
            &tmp.join(format!("staged-{i}")),
        );
        runner.push(d);
        for (all, p) in parts.iter_mut().zip(ph) {
            all.push(p);
        }
        fs::remove_file(&src).unwrap();
        // Keep the disk footprint bounded.
        let _ = fs::remove_dir_all(tmp.join(format!("lib-{i}")));
        let _ = fs::remove_dir_all(tmp.join(format!("run-{i}")));
    }
    let (a, c, r) = (median(alone), median(copied), median(runner));
    println!(
        "   publish alone (library, adopting as the runner does): median {:8.2} ms",
        ms(a)
    );
    println!(
        "   publish alone (library, copying): median {:8.2} ms  (adoption saves {:.2} ms)",
        ms(c),
        ms(c) - ms(a)
    );
    println!("   SIGTERM -> exit (runner): median {:8.2} ms", ms(r));
    println!(
        "   overhead: {:+.2} ms  (issue 11 target <= +10 ms)",
        ms(r) - ms(a)
    );
    let [mut c, mut p, mut l] = parts;
    println!(
        "   the runner's event log (medians): signal -> child exited {:.1} ms, -> published {:.1} ms, -> released {:.1} ms",
        median_f(&mut c),
        median_f(&mut p),
        median_f(&mut l)
    );
}

/// A store's history as the owner's run path meets it: `k` older manifests (as `--keep` `k`
/// keeps them; the same one-file checkpoint under ids `1..=k`, CURRENT naming the last) and
/// `k` kept outputs of failed publishes (`failed/<epoch>.<n>`, empty, as a large keep would
/// leave them). Written directly because `k` real publishes (one `syncfs` each) take minutes.
fn plant_history(dir: &Path, k: usize) {
    let run = Command::new(TENURE)
        .arg("run")
        .arg("--dir")
        .arg(dir)
        .args(["--", "sh", "-c", "echo hi > \"$TENURE_CHECKPOINT_OUT/f\""])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    assert!(run.success());
    let cps = dir.join("checkpoints");
    let manifests = cps.join("manifests");
    let first = fs::read_to_string(manifests.join(format!("{:020}.json", 1))).unwrap();
    let entry = first.lines().nth(1).unwrap().to_string();
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for id in 2..=k {
        let text = format!(
            "{{\"format\":2,\"id\":\"{id:020}\",\"parent\":\"{:020}\",\"epoch\":1,\"created_at_ms\":{at_ms},\"files\":1}}\n{entry}\n",
            id - 1
        );
        // Private, as the store writes them (a manifest open to others is refused unread).
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(manifests.join(format!("{id:020}.json")))
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .unwrap();
    }
    // CURRENT keeps naming checkpoint 1 (its line carries that manifest's digest): the older
    // manifests are history the run path may list, never load.
    let failed = cps.join("failed");
    for n in 0..k {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(failed.join(format!("1.{n}")))
            .unwrap();
    }
}

/// Issue 11: nothing on the run path is O(size of the dir's history). `tenure run -- true` in
/// a dir with 10,000 older manifests and 10,000 kept failed outputs against a dir with one
/// checkpoint, interleaved.
fn bench_history(tmp: &Path, n: usize) {
    let k = runs("TENURE_BENCH_HISTORY", 10_000);
    println!(
        "== tenure run -- true: a dir with {k} old manifests + {k} failed outputs  vs  one checkpoint ({n} interleaved runs each)"
    );
    let (old, fresh) = (tmp.join("history-old"), tmp.join("history-fresh"));
    plant_history(&old, k);
    plant_history(&fresh, 1);
    let run = |dir: &Path| {
        let mut c = Command::new(TENURE);
        c.arg("run").arg("--dir").arg(dir).args(["--", "true"]);
        c
    };
    timed(&mut run(&old));
    timed(&mut run(&fresh));
    let (mut o, mut f) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        o.push(timed(&mut run(&old)));
        f.push(timed(&mut run(&fresh)));
    }
    let (om, fm) = (median(o), median(f));
    println!("   with history: median {:7.2} ms", ms(om));
    println!("   without:      median {:7.2} ms", ms(fm));
    println!(
        "   ratio history/none: {:.2}x  (target ~1.0x: nothing on the run path grows with history)",
        om.as_secs_f64() / fm.as_secs_f64()
    );
}

fn have_openssl() -> bool {
    Command::new("openssl")
        .arg("version")
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--write-many") => {
            return write_many_child(&args[2], args[3].parse().unwrap());
        }
        Some("--many-publish") => {
            return many_publish_child(Path::new(&args[2]), args[3].parse().unwrap());
        }
        Some("--many-load") => {
            return many_load_child(Path::new(&args[2]), args[3].parse().unwrap());
        }
        _ => {}
    }
    if args.get(1).map(String::as_str) == Some("--verify-child") {
        let sd = StateDir::open(Path::new(&args[2]), false).unwrap();
        let store = CheckpointStore::open(&sd, StoreOptions::default()).unwrap();
        store.load().unwrap().unwrap();
        println!("{}", vm_hwm_kib());
        return;
    }
    // `cargo bench` passes `--bench`; anything else (e.g. `cargo test --benches`) only checks
    // that the binary starts.
    if !args.iter().any(|a| a == "--bench") {
        println!("checkpoint bench: run with `cargo bench --bench checkpoint`");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    println!(
        "checkpoint store benchmarks ({} sizes)",
        if full() { "full" } else { "default" }
    );
    // Issue 11's store rows, with a size knob: TENURE_BENCH_QUICK=1 divides them by 16;
    // TENURE_BENCH_ROW=verify|many|stop|history runs that row alone.
    let row = std::env::var("TENURE_BENCH_ROW").ok();
    let want = |name: &str| row.as_deref().is_none_or(|r| r == name);
    if want("verify") {
        if have_openssl() {
            bench_verify_vs_openssl(tmp.path(), 8, scale(32 * MIB));
            bench_verify_vs_openssl(tmp.path(), 1, scale(256 * MIB));
        } else {
            println!("verify vs openssl: skipped (no `openssl` on this machine)");
        }
    }
    let many_runs = runs("TENURE_BENCH_MANY_RUNS", 3);
    if want("many") {
        bench_many_under_run(tmp.path(), scale(20_000), many_runs);
        bench_many_under_run(tmp.path(), scale(100_000), many_runs);
    }
    if want("stop") {
        bench_stop_publish(tmp.path(), runs("TENURE_BENCH_PUBLISH_RUNS", 5));
    }
    if want("history") {
        bench_history(tmp.path(), runs("TENURE_BENCH_RUNS", 40));
    }
    if row.is_some() {
        return;
    }
    if std::env::var("TENURE_BENCH_ISSUE11_ONLY").is_ok_and(|v| v == "1") {
        return;
    }
    let many_only = std::env::var("TENURE_BENCH_MANY_ONLY").is_ok_and(|v| v == "1");
    if !many_only {
        bench_verify(tmp.path());
        bench_publish(tmp.path());
        bench_incremental(tmp.path());
    }
    // Many small files: 100,000 by default, and 1,000,000 with the full sizes
    // (about a quarter of an hour here, most of it one fsync per file on both sides).
    bench_many(tmp.path(), scale(100_000));
    if full() {
        bench_many(tmp.path(), 1_000_000);
    }
}
