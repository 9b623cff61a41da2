//! Integration tests of the owner lease: cards L1–L10, D7, H5, H8, crash takeover,
//! a recycled pid, the hostile-dir matrix and a bounded stress run. Contenders are real child
//! processes (this test binary re-executed as a probe, see `support/probe.rs`) using the library
//! on real state dirs; signals are real (SIGTERM, SIGKILL). No test sleeps to synchronise: each
//! waits for a line from a probe, a process exit (pidfd) or a file the probe wrote first.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use support::{Probe, code, private_tempdir, snapshot, write_private};
use tenure::lease::{
    self, AcquireOptions, Identity, LeaseError, Liveness, OwnerRecord, OwnerState, SignalOutcome,
    WaitBound,
};
use tenure::machine::PhaseKind;
use tenure::privfs::{FsError, StateDir};

/// Entry point of probe children; ignored in normal runs (it is not a test of its own).
#[test]
#[ignore = "entry point for probe child processes (TENURE_PROBE)"]
fn probe_entry() {
    if let Ok(spec) = std::env::var(support::probe::PROBE_ENV) {
        support::probe::run(&spec);
    }
}

fn hold(dir: &Path, bound: &str) -> Probe {
    Probe::spawn(&["hold", dir.to_str().unwrap(), bound])
}

fn acquired_epoch(line: &str) -> u64 {
    line.strip_prefix("acquired ").unwrap().parse().unwrap()
}

fn try_opts() -> AcquireOptions<'static> {
    AcquireOptions {
        wait: WaitBound::Try,
        ..AcquireOptions::default()
    }
}

fn acquire_here(dir: &StateDir) -> Result<lease::Lease, LeaseError> {
    lease::acquire(dir, &try_opts(), &mut |_| panic!("a try never waits"))
}

/// A live process (killed by the caller) with its identity, and the identity of a process
/// that is gone: what a crashed owner's registry entries name.
fn live_and_dead() -> (std::process::Child, Identity, Identity) {
    let live = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let mut gone = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let live_id = Identity::of_pid(live.id()).unwrap();
    let gone_id = Identity::of_pid(gone.id()).unwrap();
    gone.kill().unwrap();
    gone.wait().unwrap();
    (live, live_id, gone_id)
}

fn owner_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join(".tenure/owner.json")).unwrap()
}

/// Card L1: two contenders on one empty dir at the same moment: one owns, the other is a
/// visible waiter and proceeds only after the first releases; both succeed, epochs 1 then 2.
#[test]
fn l1_serialised_first_start() {
    let t = private_tempdir();
    let dir = t.path().join("state");
    let d = dir.to_str().unwrap();
    let mut a = Probe::spawn(&["hold", d, "forever", "go"]);
    let mut b = Probe::spawn(&["hold", d, "forever", "go"]);
    a.send("go");
    b.send("go");
    // Whichever wins, the other must report waiting (and nothing else) before anything more.
    let la = a.next_line(support::DEADLINE).expect("a said something");
    let (mut first, mut second, waiting) = if la.starts_with("acquired") {
        assert_eq!(acquired_epoch(&la), 1);
        let waiting = b.expect("waiting for ");
        (a, b, waiting)
    } else {
        let acquired = b.expect("acquired");
        assert_eq!(acquired_epoch(&acquired), 1);
        (b, a, la)
    };
    // On a first start the owner record may not exist yet when the loser looks (`owner
    // unknown`); the message names the dir either way.
    assert!(waiting.starts_with("waiting for "), "{waiting}");
    assert!(
        waiting.contains(&dir.to_string_lossy().into_owned()),
        "{waiting}"
    );
    let sd = StateDir::open(&dir, false).unwrap();
    let st = lease::status(&sd).unwrap();
    assert!(st.held);
    assert_eq!(st.state(), OwnerState::Owned(PhaseKind::Recovering));
    let waiter_pids: Vec<u32> = st
        .waiters
        .iter()
        .filter_map(|w| w.record.as_ref().map(|r| r.identity.pid))
        .collect();
    assert_eq!(waiter_pids, vec![second.pid()], "the waiter is visible");
    assert_eq!(st.waiters[0].liveness, Liveness::Live);

    first.send("release");
    first.expect("released");
    assert_eq!(code(first.wait()), 0);
    assert_eq!(acquired_epoch(&second.expect("acquired")), 2);
    let st = lease::status(&sd).unwrap();
    assert!(
        st.waiters.is_empty(),
        "the waiter entry left with the wait: {:?}",
        st.waiters
    );
    second.send("release");
    assert_eq!(code(second.wait()), 0);
    assert_eq!(lease::status(&sd).unwrap().state(), OwnerState::Released);
}

/// Card L2: a contender bounded to 1 s against a live owner fails with `busy` and `lock and state
/// were preserved`; the owner record's bytes are unchanged and the owner keeps owning.
#[test]
fn l2_bounded_loser() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let mut owner = hold(&dir, "try");
    owner.expect("acquired 1");
    let before = owner_bytes(&dir);
    let mut loser = hold(&dir, "1000");
    loser.expect("waiting for ");
    let busy = loser.expect("busy ");
    assert!(busy.contains("is busy"), "{busy}");
    assert!(busy.contains("lock and state were preserved"), "{busy}");
    assert!(
        busy.contains(&format!("owner pid {}, epoch 1", owner.pid())),
        "{busy}"
    );
    assert_eq!(code(loser.wait()), 75);
    assert_eq!(owner_bytes(&dir), before);
    let st = lease::status(&StateDir::open(&dir, false).unwrap()).unwrap();
    assert!(st.held && st.owner_liveness == Some(Liveness::Live));
    assert!(st.waiters.is_empty(), "{:?}", st.waiters);
    owner.send("release");
    assert_eq!(code(owner.wait()), 0);
}

/// Card L3: SIGTERM to a waiting contender cancels its wait through the signal pipe: exit 143,
/// its waiter entry is gone, the owner and the owner record are untouched (invariant I5).
#[test]
fn l3_interrupted_waiter() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let mut owner = hold(&dir, "try");
    owner.expect("acquired 1");
    let before_record = owner_bytes(&dir);
    let mut waiter = hold(&dir, "forever");
    waiter.expect("waiting for ");
    let sd = StateDir::open(&dir, false).unwrap();
    assert_eq!(lease::status(&sd).unwrap().waiters.len(), 1);
    waiter.signal(Signal::TERM);
    waiter.expect("cancelled");
    assert_eq!(code(waiter.wait()), 143);
    assert_eq!(owner_bytes(&dir), before_record);
    let st = lease::status(&sd).unwrap();
    assert!(
        st.waiters.is_empty(),
        "the cancelled waiter left a trace: {:?}",
        st.waiters
    );
    assert_eq!(st.state(), OwnerState::Owned(PhaseKind::Recovering));
    owner.send("release");
    owner.expect("released");
    assert_eq!(code(owner.wait()), 0);
}

/// Card L4: two state dirs never share a lease: both owners hold at once.
#[test]
fn l4_independent_dirs() {
    let t = private_tempdir();
    let mut a = hold(&t.path().join("a"), "try");
    let mut b = hold(&t.path().join("b"), "try");
    a.expect("acquired 1");
    b.expect("acquired 1");
    for (p, name) in [(&mut a, "a"), (&mut b, "b")] {
        let st = lease::status(&StateDir::open(&t.path().join(name), false).unwrap()).unwrap();
        assert_eq!(st.state(), OwnerState::Owned(PhaseKind::Recovering));
        p.send("release");
        assert_eq!(code(p.wait()), 0);
    }
}

/// Card L5 (crash takeover): an owner killed with SIGKILL leaves its record; a waiting contender
/// owns at once — its 20 s bound is never waited out (it says `acquired`, not `busy`) — with a
/// higher epoch, replaces the record and sweeps the registry entry (invariants I1, I2). How
/// fast the takeover is, is measured by `cargo bench --bench lease` (crash takeover).
#[test]
fn l5_crash_takeover() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let mut owner = hold(&dir, "try");
    owner.expect("acquired 1");
    owner.send("phase ready");
    owner.expect("phase ready");
    let mut next = hold(&dir, "20000");
    next.expect("waiting for ");
    owner.signal(Signal::KILL);
    let line = next.expect("acquired");
    assert_eq!(acquired_epoch(&line), 2);
    assert_eq!(code(owner.wait()), 128 + 9);

    let st = lease::status(&StateDir::open(&dir, false).unwrap()).unwrap();
    let rec = st.owner.clone().unwrap();
    assert_eq!((rec.identity.pid, rec.epoch), (next.pid(), 2));
    assert_eq!(st.state(), OwnerState::Owned(PhaseKind::Recovering));
    let entries: Vec<_> = st
        .registry
        .iter()
        .map(|r| (r.kind, r.entry.clone()))
        .collect();
    assert_eq!(
        entries,
        vec![("leases", "owner.slot".to_owned())],
        "the stale entry is overwritten in place"
    );
    assert_eq!(st.registry[0].record.as_ref().map(|r| r.epoch), Some(2));
    next.send("release");
    assert_eq!(code(next.wait()), 0);
}

/// A record left by an owner that dropped its lease without releasing is stale: the lock is free,
/// so the next contender takes over at once (no waiting out its bound) even though the record
/// names a live process, and sweeps the dead instance entry while reporting the live orphan.
#[test]
fn l5_stale_record_and_registry_are_swept() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let sd = StateDir::open(&dir, true).unwrap();
    let (mut sleeper, sleeper_id, gone_id) = live_and_dead();
    let mut first = acquire_here(&sd).unwrap();
    first.register_instance("child", &sleeper_id).unwrap();
    first.register_instance("gone", &gone_id).unwrap();
    drop(first); // unlocks, but leaves every record as a crash would
    let st = lease::status(&sd).unwrap();
    assert_eq!(st.state(), OwnerState::Stale);
    assert_eq!(st.registry.len(), 3);

    let second = acquire_here(&sd).unwrap();
    assert_eq!(second.epoch(), 2);
    let orphans: Vec<_> = second.orphans().iter().map(|o| o.name.clone()).collect();
    assert_eq!(orphans, vec!["child".to_owned()]);
    let st = lease::status(&sd).unwrap();
    let mut entries: Vec<_> = st.registry.iter().map(|r| r.entry.clone()).collect();
    entries.sort();
    assert_eq!(
        entries,
        vec!["child.slot".to_owned(), "owner.slot".to_owned()],
        "the dead instance's entry is vacated, the live orphan's kept"
    );
    second.release().unwrap();
    let st = lease::status(&sd).unwrap();
    assert_eq!(st.state(), OwnerState::Released);
    assert_eq!(
        st.registry.len(),
        1,
        "only the live orphan of epoch 1 remains"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// Cards L5 and D7 (recycled pid): a record naming a live, unrelated process with another start
/// time counts as dead; that process is never signalled, and the next contender owns at once
/// (invariant I4).
#[test]
fn l5_d7_recycled_pid_is_never_signalled() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let sigfile = t.path().join("signals");
    let mut bystander = Probe::spawn(&["sigwatch", sigfile.to_str().unwrap()]);
    bystander.expect("ready");
    let sd = StateDir::open(&dir, true).unwrap();
    acquire_here(&sd).unwrap().release().unwrap();
    // Forge the record of an owner whose pid was recycled to the bystander.
    let mut forged: OwnerRecord = tenure::lease::record::decode_owner(&owner_bytes(&dir))
        .unwrap()
        .unwrap();
    let real = Identity::of_pid(bystander.pid()).unwrap();
    forged.identity = Identity {
        start_time: real.start_time + 1,
        ..real.clone()
    };
    forged.phase = PhaseKind::Ready;
    write_private(
        &dir.join(".tenure/owner.json"),
        &serde_json::to_vec(&forged).unwrap(),
    );

    let st = lease::status(&sd).unwrap();
    assert_eq!(st.owner_liveness, Some(Liveness::Recycled));
    assert_eq!(st.state(), OwnerState::Stale);
    for sig in [Signal::TERM, Signal::KILL, Signal::USR1] {
        match lease::signal_owner(&forged.identity, sig).unwrap() {
            SignalOutcome::Mismatch { found } => {
                assert_eq!(found.unwrap().start_time, real.start_time)
            }
            other => panic!("a recycled pid was not refused: {other:?}"),
        }
    }
    let lease = acquire_here(&sd).unwrap();
    assert_eq!(lease.epoch(), 2);
    lease.release().unwrap();
    // The forged record was in the older format (one JSON document, issue 11): it was read, and
    // the takeover overwrote it with a slot of the current format.
    let after = owner_bytes(&dir);
    assert_eq!(after.len(), tenure::lease::record::OWNER_SLOT);
    let rec = tenure::lease::record::decode_owner(&after)
        .unwrap()
        .unwrap();
    assert_eq!((rec.epoch, rec.phase), (2, PhaseKind::Released));
    assert!(
        bystander.child.try_wait().unwrap().is_none(),
        "the bystander is alive"
    );
    assert!(!sigfile.exists(), "the bystander received a signal");
    bystander.close_stdin();
    assert_eq!(code(bystander.wait()), 0);
    assert!(!sigfile.exists(), "the bystander received a signal");
}

/// Card D7: `signal_owner` delivers to the process whose identity matches (through its pidfd),
/// and reports a dead one without signalling anything.
#[test]
fn d7_signal_owner_checks_identity() {
    let t = private_tempdir();
    let sigfile = t.path().join("signals");
    let mut target = Probe::spawn(&["sigwatch", sigfile.to_str().unwrap()]);
    target.expect("ready");
    let id = Identity::of_pid(target.pid()).unwrap();
    assert_eq!(
        lease::signal_owner(&id, Signal::USR1).unwrap(),
        SignalOutcome::Delivered
    );
    assert_eq!(
        target.expect("got "),
        format!("got {}", Signal::USR1.as_raw())
    );
    let mut other_exe = id.clone();
    other_exe.exe = "/usr/bin/not-the-owner".into();
    assert!(matches!(
        lease::signal_owner(&other_exe, Signal::USR2).unwrap(),
        SignalOutcome::Mismatch { .. }
    ));
    assert!(
        target.next_line(Duration::from_millis(200)).is_none(),
        "a mismatch was signalled"
    );
    target.close_stdin();
    assert_eq!(code(target.wait()), 0);
    assert_eq!(
        lease::signal_owner(&id, Signal::TERM).unwrap(),
        SignalOutcome::Dead
    );
    assert_eq!(id.liveness(), Liveness::Dead);
}

/// Card L6: a record naming a live owner with matching identity is never removed or
/// overwritten by a contender, however long it waits (here until its bound expires).
#[test]
fn l6_live_owner_record_preserved() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let mut owner = hold(&dir, "try");
    owner.expect("acquired 1");
    owner.send("phase ready");
    owner.expect("phase ready");
    let before = snapshot(&dir.join(".tenure/owner.json"));
    let mut contenders: Vec<Probe> = (0..3).map(|_| hold(&dir, "1500")).collect();
    for c in &mut contenders {
        c.expect("waiting for ");
    }
    for c in &mut contenders {
        c.expect("busy ");
        assert_eq!(code(c.wait()), 75);
    }
    assert_eq!(snapshot(&dir.join(".tenure/owner.json")), before);
    let st = lease::status(&StateDir::open(&dir, false).unwrap()).unwrap();
    assert_eq!(st.state(), OwnerState::Owned(PhaseKind::Ready));
    assert_eq!(st.owner.unwrap().identity.pid, owner.pid());
    owner.send("release");
    assert_eq!(code(owner.wait()), 0);
}

/// Card L7: the first owner of a cold dir writes the identity marker under the lease, once and
/// atomically. Five contenders race for a cold dir and own it one after another; each holds
/// until the test has read the marker (so it is read while the others still contend, at least
/// five times), and a reader thread reads it throughout the race besides: it is absent or
/// whole, never partial, and its root id never changes. The owners' own log shows they never
/// overlapped (invariant I1) and had the epochs 1 to 5.
#[test]
fn l7_covered_marker_publication() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};
    let t = private_tempdir();
    let dir = t.path().join("s");
    let logdir = t.path().join("log");
    std::fs::create_dir(&logdir).unwrap();
    let marker = dir.join(".tenure/identity.json");
    let root_id = Arc::new(Mutex::new(None));
    // Reads the marker and checks it: whole, naming one root id for ever.
    let check = {
        let (marker, root_id) = (marker.clone(), root_id.clone());
        move || -> bool {
            let Ok(bytes) = std::fs::read(&marker) else {
                return false;
            };
            let m: lease::DirIdentity = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("partial marker observed ({e}): {bytes:?}"));
            let mut seen = root_id
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            assert_eq!(
                *seen.get_or_insert(m.root_id),
                m.root_id,
                "the marker was rewritten"
            );
            true
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let background_reads = Arc::new(AtomicU32::new(0));
    let reader = {
        let (stop, reads, check) = (stop.clone(), background_reads.clone(), check.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if check() {
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::yield_now();
            }
        })
    };
    let mut racers: Vec<Probe> = (0..5)
        .map(|_| {
            Probe::spawn(&[
                "stress",
                dir.to_str().unwrap(),
                logdir.to_str().unwrap(),
                "waithold",
            ])
        })
        .collect();
    for r in &mut racers {
        r.send("go");
    }
    let mut epochs = Vec::new();
    let mut done = vec![false; racers.len()];
    while done.iter().any(|d| !d) {
        // Whoever owns now says so; the others are still contending.
        let (i, line) = support::first_line(&racers, &done)
            .unwrap_or_else(|| panic!("no contender owned within {:?}", support::DEADLINE));
        assert!(line.starts_with("acquired"), "contender {i} said {line:?}");
        epochs.push(acquired_epoch(&line));
        assert!(
            check(),
            "an owner holds the lease but the marker is missing"
        );
        racers[i].send("release");
        assert_eq!(code(racers[i].wait()), 0);
        done[i] = true;
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert_eq!(epochs, [1, 2, 3, 4, 5], "one owner after another");
    let m: lease::DirIdentity = serde_json::from_slice(&std::fs::read(&marker).unwrap()).unwrap();
    assert_eq!(Some(m.root_id), *root_id.lock().unwrap());
    assert_eq!(m.path, std::fs::canonicalize(&dir).unwrap());
    let (owners, last) = check_exclusive_log(&std::fs::read_to_string(logdir.join("log")).unwrap());
    assert_eq!((owners, last), (5, 5));
    eprintln!(
        "l7: marker read {} times by the racing reader, 5 times by the test",
        background_reads.load(Ordering::Relaxed)
    );
}

/// Checks the owners' own log (`B pid epoch` / `E pid epoch` lines, `OVERLAP` when an owner
/// found another inside): no overlap, every begin followed by its own end, epochs strictly
/// increasing. Returns the number of ownerships and the last epoch.
fn check_exclusive_log(log: &str) -> (u64, u64) {
    assert!(!log.contains("OVERLAP"), "two owners at once:\n{log}");
    let mut last_epoch = 0;
    let mut lines = log.lines();
    let mut owners = 0;
    while let Some(b) = lines.next() {
        let e = lines.next().expect("an end line");
        let b: Vec<&str> = b.split(' ').collect();
        let e: Vec<&str> = e.split(' ').collect();
        assert_eq!((b[0], e[0]), ("B", "E"), "begin/end interleaved:\n{log}");
        assert_eq!((b[1], b[2]), (e[1], e[2]), "end of another owner:\n{log}");
        let epoch: u64 = b[2].parse().unwrap();
        assert!(epoch > last_epoch, "epoch {epoch} after {last_epoch}");
        last_epoch = epoch;
        owners += 1;
    }
    (owners, last_epoch)
}

/// Card L8 (a): files but no identity marker: `derived state but no identity`, tree unchanged;
/// an explicit `adopt` is the way past it.
#[test]
fn l8a_foreign_state_refused_then_adopted() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    write_private(&dir.join("data.bin"), b"someone's data");
    let before = snapshot(t.path());
    let mut p = hold(&dir, "try");
    let err = p.expect("error ");
    assert!(err.contains("derived state but no identity"), "{err}");
    assert!(err.contains("tenure init --adopt"), "{err}");
    assert_eq!(code(p.wait()), 65);
    assert_eq!(snapshot(t.path()), before, "a refusal changed the tree");

    let sd = StateDir::open(&dir, false).unwrap();
    let lease::Adoption::Adopted(marker) = lease::adopt(&sd).unwrap() else {
        panic!("a dir with no marker was not adopted")
    };
    assert!(marker.adopted_at.is_some());
    let mut p = hold(&dir, "try");
    p.expect("acquired 1");
    p.send("release");
    assert_eq!(code(p.wait()), 0);
    assert_eq!(
        std::fs::read(dir.join("data.bin")).unwrap(),
        b"someone's data"
    );
}

/// Card L8 (b): an unreadable marker: `identity is unreadable`, tree unchanged (and `adopt`
/// refuses it too: the user must move it aside).
#[test]
fn l8b_unreadable_marker_refused() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let sd = StateDir::open(&dir, true).unwrap();
    acquire_here(&sd).unwrap().release().unwrap();
    write_private(
        &dir.join(".tenure/identity.json"),
        b"{\"version\":1,\"root_",
    );
    let before = snapshot(t.path());
    let mut p = hold(&dir, "try");
    let err = p.expect("error ");
    assert!(err.contains("identity is unreadable"), "{err}");
    assert!(err.contains(".tenure/identity.json"), "{err}");
    assert_eq!(code(p.wait()), 65);
    assert!(matches!(
        lease::adopt(&sd),
        Err(LeaseError::IdentityUnreadable { .. })
    ));
    assert_eq!(snapshot(t.path()), before, "a refusal changed the tree");
}

/// Card L8 (c) and H7: a dir moved after its first owner names another root: `identity
/// mismatch`, tree unchanged; `adopt` keeps the root id and records the new path.
#[test]
fn l8c_moved_dir_refused_then_adopted() {
    let t = private_tempdir();
    let old = t.path().join("old");
    let new = t.path().join("new");
    let sd = StateDir::open(&old, true).unwrap();
    acquire_here(&sd).unwrap().release().unwrap();
    let root_id = lease::status(&sd).unwrap().identity.unwrap().root_id;
    drop(sd);
    std::fs::rename(&old, &new).unwrap();
    let before = snapshot(t.path());
    let mut p = hold(&new, "try");
    let err = p.expect("error ");
    assert!(err.contains("identity mismatch"), "{err}");
    assert_eq!(code(p.wait()), 65);
    assert_eq!(snapshot(t.path()), before, "a refusal changed the tree");

    let sd = StateDir::open(&new, false).unwrap();
    let lease::Adoption::Adopted(m) = lease::adopt(&sd).unwrap() else {
        panic!("a moved dir was not adopted")
    };
    assert_eq!(m.root_id, root_id);
    assert_eq!(m.path, std::fs::canonicalize(&new).unwrap());
    let lease = acquire_here(&sd).unwrap();
    assert_eq!(lease.epoch(), 2);
    lease.release().unwrap();
}

/// Card L9: the state dir and missing parents are created 0700, records 0600; a permissive dir
/// or record is refused as `permissive`, never fixed.
#[test]
fn l9_private_by_default() {
    let t = private_tempdir();
    let dir = t.path().join("a/b/s");
    let mut p = hold(&dir, "try");
    p.expect("acquired 1");
    for d in [t.path().join("a"), t.path().join("a/b"), dir.clone()] {
        assert_eq!(
            std::fs::metadata(&d).unwrap().mode() & 0o7777,
            0o700,
            "{}",
            d.display()
        );
    }
    for (path, (mode, _, _, _)) in snapshot(&dir.join(".tenure")) {
        let want = if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            0o700
        } else {
            0o600
        };
        assert_eq!(mode & 0o7777, want, "{}", path.display());
    }
    p.send("release");
    assert_eq!(code(p.wait()), 0);

    std::fs::set_permissions(
        dir.join(".tenure/owner.json"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let before = snapshot(t.path());
    let mut p = hold(&dir, "try");
    let err = p.expect("error ");
    assert!(err.contains("owner.json is permissive"), "{err}");
    assert_eq!(code(p.wait()), 65);
    assert_eq!(snapshot(t.path()), before);

    std::fs::set_permissions(
        dir.join(".tenure/owner.json"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    let before = snapshot(t.path());
    let mut p = hold(&dir, "try");
    let err = p.expect("error ");
    assert!(err.contains("is permissive (mode 0750)"), "{err}");
    assert_eq!(code(p.wait()), 65);
    assert_eq!(snapshot(t.path()), before);
}

/// Card L10: an owner record holding `{not-json` is a clear error naming the file, from
/// `acquire` (in a child) and from `status`; no panic, nothing deleted.
#[test]
fn l10_corrupt_record_refused() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let sd = StateDir::open(&dir, true).unwrap();
    acquire_here(&sd).unwrap().release().unwrap();
    write_private(&dir.join(".tenure/owner.json"), b"{not-json");
    let before = snapshot(t.path());
    let mut p = hold(&dir, "try");
    let err = p.expect("error ");
    assert!(err.contains(".tenure/owner.json is corrupt"), "{err}");
    assert_eq!(code(p.wait()), 65);
    let err = lease::status(&sd).unwrap_err();
    assert!(matches!(err, LeaseError::CorruptRecord { .. }), "{err}");
    assert_eq!(snapshot(t.path()), before);
}

/// Card H5: epochs strictly increase across ownerships and a stale epoch is rejected without
/// effect; `read_epoch` from another process sees the owner's epoch (invariants I2, I3).
#[test]
fn h5_epoch_fencing() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let sd = StateDir::open(&dir, true).unwrap();
    assert_eq!(lease::read_epoch(&sd).unwrap(), 0);
    let first = acquire_here(&sd).unwrap();
    assert_eq!(first.epoch(), 1);
    lease::check_epoch(&sd, first.epoch()).unwrap();
    let stale_epoch = first.epoch();
    first.release().unwrap();
    let mut other = hold(&dir, "try");
    assert_eq!(acquired_epoch(&other.expect("acquired")), 2);
    assert_eq!(lease::read_epoch(&sd).unwrap(), 2);
    let before = snapshot(t.path());
    let err = lease::check_epoch(&sd, stale_epoch).unwrap_err();
    assert!(
        matches!(
            err,
            LeaseError::StaleEpoch {
                mine: 1,
                current: 2,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(snapshot(t.path()), before, "fencing is read-only");
    lease::check_epoch(&sd, 2).unwrap();
    other.send("release");
    assert_eq!(code(other.wait()), 0);
    let third = acquire_here(&sd).unwrap();
    assert_eq!(third.epoch(), 3);
    third.release().unwrap();
}

/// Card H8: `status` from another process while an owner runs shows phase, pid, epoch and
/// liveness, takes no lock and writes nothing; the owner is undisturbed.
#[test]
fn h8_status_from_another_process() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let mut owner = hold(&dir, "try");
    owner.expect("acquired 1");
    owner.send("phase ready");
    owner.expect("phase ready");
    let sd = StateDir::open(&dir, false).unwrap();
    let before = snapshot(t.path());
    let st = lease::status(&sd).unwrap();
    assert_eq!(snapshot(t.path()), before, "status wrote something");
    assert!(st.held);
    assert_eq!(st.epoch, 1);
    assert_eq!(st.state(), OwnerState::Owned(PhaseKind::Ready));
    let rec = st.owner.unwrap();
    assert_eq!(rec.identity.pid, owner.pid());
    assert_eq!(st.owner_liveness, Some(Liveness::Live));
    assert_eq!(
        st.identity.unwrap().path,
        std::fs::canonicalize(&dir).unwrap()
    );
    // The owner still owns: a try fails busy, and its orderly release still works.
    assert!(matches!(acquire_here(&sd), Err(LeaseError::Busy { .. })));
    owner.send("release");
    owner.expect("released");
    assert_eq!(code(owner.wait()), 0);
    let st = lease::status(&sd).unwrap();
    assert!(!st.held);
    assert_eq!(st.state(), OwnerState::Released);
    assert!(
        st.registry.is_empty(),
        "the registry holds no entry of the released owner"
    );
}

/// The lock descriptor is close-on-exec, so a supervised child never inherits the lease.
#[test]
fn lock_fd_is_cloexec() {
    let t = private_tempdir();
    let sd = StateDir::open(&t.path().join("s"), true).unwrap();
    let lease = acquire_here(&sd).unwrap();
    let flags = rustix::io::fcntl_getfd(lease.lock_fd().unwrap()).unwrap();
    assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
    lease.release().unwrap();
}

/// A wait bound and a cancel fd in-process: `on_wait` is called exactly once, a readable cancel
/// fd ends the wait with `Cancelled` without consuming its bytes, and nothing is left behind.
#[test]
fn cancel_fd_ends_wait_and_is_not_consumed() {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    let t = private_tempdir();
    let dir = t.path().join("s");
    let mut owner = hold(&dir, "try");
    owner.expect("acquired 1");
    let sd = StateDir::open(&dir, false).unwrap();
    let (mut r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
    let before = snapshot(t.path());
    let mut calls = 0;
    let opts = AcquireOptions {
        wait: WaitBound::Forever,
        cancel: Some(r.as_fd()),
        phase: PhaseKind::Recovering,
        fence: None,
    };
    let err = lease::acquire(&sd, &opts, &mut |c| {
        calls += 1;
        assert!(c.to_string().starts_with("waiting for "), "{c}");
        // The waiter entry is visible while waiting; then the stop signal arrives.
        assert_eq!(lease::status(&sd).unwrap().waiters.len(), 1);
        w.write_all(b"x").unwrap();
    })
    .unwrap_err();
    assert!(matches!(err, LeaseError::Cancelled { .. }), "{err}");
    assert_eq!(calls, 1);
    let mut byte = [0u8; 1];
    r.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"x", "the cancel byte is still there for its owner");
    assert_eq!(
        snapshot(t.path()),
        before,
        "a cancelled waiter left a trace"
    );
    owner.send("release");
    assert_eq!(code(owner.wait()), 0);
}

/// The hostile-dir matrix: each planted defect is refused with its own error and the tree is
/// left byte-for-byte as it was (invariant I14).
#[test]
fn hostile_dir_matrix() {
    type Plant = fn(&Path);
    type Check = fn(&LeaseError) -> bool;
    let cases: Vec<(&str, Plant, Check)> = vec![
        (
            "symlinked owner record",
            |d| {
                let rec = d.join(".tenure/owner.json");
                std::fs::rename(&rec, d.join(".tenure/real.json")).unwrap();
                std::os::unix::fs::symlink("real.json", &rec).unwrap();
            },
            |e| matches!(e, LeaseError::Fs(FsError::Symlink { .. })),
        ),
        (
            "world-writable record",
            |d| {
                std::fs::set_permissions(
                    d.join(".tenure/owner.json"),
                    std::fs::Permissions::from_mode(0o606),
                )
                .unwrap();
            },
            |e| matches!(e, LeaseError::Fs(FsError::Permissive { .. })),
        ),
        (
            "group-writable control dir",
            |d| {
                std::fs::set_permissions(d.join(".tenure"), std::fs::Permissions::from_mode(0o770))
                    .unwrap();
            },
            |e| matches!(e, LeaseError::Fs(FsError::Permissive { .. })),
        ),
        (
            "fifo record",
            |d| {
                let rec = d.join(".tenure/owner.json");
                std::fs::remove_file(&rec).unwrap();
                rustix::fs::mkfifoat(
                    rustix::fs::CWD,
                    &rec,
                    rustix::fs::Mode::from_raw_mode(0o600),
                )
                .unwrap();
            },
            |e| matches!(e, LeaseError::Fs(FsError::NotRegular { .. })),
        ),
        (
            "hard-linked record",
            |d| {
                std::fs::hard_link(d.join(".tenure/owner.json"), d.join(".tenure/copy")).unwrap();
            },
            |e| matches!(e, LeaseError::Fs(FsError::HardLinked { nlink: 2, .. })),
        ),
        (
            "not-json record",
            |d| {
                write_private(&d.join(".tenure/owner.json"), b"{not-json");
            },
            |e| matches!(e, LeaseError::CorruptRecord { .. }),
        ),
        (
            "foreign-owned record",
            |d| {
                std::os::unix::fs::lchown(d.join(".tenure/owner.json"), Some(4242), None).unwrap();
            },
            |e| matches!(e, LeaseError::Fs(FsError::NotOwned { uid: 4242, .. })),
        ),
        (
            "symlinked control dir",
            |d| {
                std::fs::rename(d.join(".tenure"), d.join("elsewhere")).unwrap();
                std::os::unix::fs::symlink("elsewhere", d.join(".tenure")).unwrap();
            },
            |e| matches!(e, LeaseError::Fs(FsError::Symlink { .. })),
        ),
        (
            "corrupt epoch",
            |d| {
                write_private(&d.join(".tenure/epoch"), b"12 monkeys\n");
            },
            |e| {
                matches!(
                    e,
                    LeaseError::Epoch(lease::epoch::EpochError::Corrupt { .. })
                )
            },
        ),
    ];
    let mut messages = std::collections::BTreeSet::new();
    let mut skipped = 0;
    for (name, plant, check) in cases {
        // Giving the record to another uid needs root (the rule of tests/common/skip.rs).
        if name == "foreign-owned record"
            && !support::skip::have_root("hostile_dir_matrix: foreign-owned record")
        {
            skipped += 1;
            continue;
        }
        let t = private_tempdir();
        let dir = t.path().join("s");
        let sd = StateDir::open(&dir, true).unwrap();
        acquire_here(&sd).unwrap().release().unwrap();
        drop(sd);
        plant(&dir);
        let before = snapshot(t.path());
        let err = match StateDir::open(&dir, true) {
            Ok(sd) => acquire_here(&sd)
                .err()
                .unwrap_or_else(|| panic!("{name}: acquired")),
            Err(e) => LeaseError::Fs(e),
        };
        assert!(check(&err), "{name}: unexpected error {err}");
        assert_eq!(snapshot(t.path()), before, "{name}: the tree changed");
        messages.insert(
            err.to_string()
                .split(';')
                .next()
                .unwrap()
                .replace(&*dir.to_string_lossy(), "DIR"),
        );
    }
    // The state dir itself, symlinked and permissive.
    let t = private_tempdir();
    let real = t.path().join("real");
    StateDir::open(&real, true).unwrap();
    std::os::unix::fs::symlink(&real, t.path().join("link")).unwrap();
    let before = snapshot(t.path());
    let err = StateDir::open(&t.path().join("link"), true).unwrap_err();
    assert!(matches!(err, FsError::Symlink { .. }), "{err}");
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o701)).unwrap();
    let before_perm = snapshot(t.path());
    let err2 = StateDir::open(&real, true).unwrap_err();
    assert!(
        matches!(err2, FsError::Permissive { mode: 0o701, .. }),
        "{err2}"
    );
    assert_eq!(snapshot(t.path()), before_perm);
    assert_ne!(before, before_perm);
    assert_eq!(
        messages.len(),
        9 - skipped,
        "each defect has its own message: {messages:#?}"
    );
}

/// Stress: rounds of 2–8 simultaneous contenders (100 rounds, 1,000 with `TENURE_LONG=1`).
/// In `try` rounds exactly one owns; in `wait` rounds all own one after another. The owners
/// themselves log begin/end and detect overlap; epochs strictly increase across the run
/// (invariants I1, I2).
#[test]
fn stress_contenders() {
    let rounds = if support::long() { 1000 } else { 100 };
    let t = private_tempdir();
    let dir = t.path().join("s");
    let logdir = t.path().join("log");
    std::fs::create_dir(&logdir).unwrap();
    let mut expected_epoch = 0u64;
    for round in 0..rounds {
        let k = 2 + round % 7;
        let mode = if round % 2 == 0 { "try" } else { "wait" };
        let mut ps: Vec<Probe> = (0..k)
            .map(|_| {
                Probe::spawn(&[
                    "stress",
                    dir.to_str().unwrap(),
                    logdir.to_str().unwrap(),
                    mode,
                ])
            })
            .collect();
        for p in &mut ps {
            p.send("go");
        }
        if mode == "try" {
            // The winner holds until told; every other contender must fail busy meanwhile.
            let mut winner = None;
            let mut busy = 0;
            for (i, p) in ps.iter_mut().enumerate() {
                let line = p.next_line(support::DEADLINE).expect("a probe line");
                if line.starts_with("acquired") {
                    assert!(winner.is_none(), "round {round}: two owners");
                    winner = Some(i);
                } else {
                    assert!(line.starts_with("busy"), "round {round}: {line}");
                    assert_eq!(code(p.wait()), 75);
                    busy += 1;
                }
            }
            let w = winner.unwrap_or_else(|| panic!("round {round}: nobody owned"));
            assert_eq!(busy, k - 1);
            ps[w].send("release");
            assert_eq!(code(ps[w].wait()), 0);
            expected_epoch += 1;
        } else {
            for p in &mut ps {
                let c = code(p.wait());
                assert_eq!(
                    c,
                    0,
                    "round {round}: {:?}",
                    p.next_line(Duration::from_secs(1))
                );
            }
            expected_epoch += k as u64;
        }
    }
    let log = std::fs::read_to_string(logdir.join("log")).unwrap();
    let (owners, last_epoch) = check_exclusive_log(&log);
    assert_eq!(last_epoch, expected_epoch);
    assert_eq!(owners, expected_epoch);
    assert_eq!(
        lease::read_epoch(&StateDir::open(&dir, false).unwrap()).unwrap(),
        expected_epoch
    );
    eprintln!("stress: {rounds} rounds, {owners} ownerships, no overlap");
}

/// Crash points of acquisition (feature `failpoints`): a contender SIGKILLed at any write,
/// fsync, rename or directory fsync of its acquisition never wedges the dir. The next contender
/// owns at once with a higher epoch, finds a whole marker naming the dir (or none yet, card L7),
/// and leaves no temp file behind. An injected EIO fails the acquisition cleanly the same way.
#[cfg(feature = "failpoints")]
#[test]
fn acquisition_crash_points_never_wedge_the_dir() {
    let points = [
        "lease.control.mkdir",
        "lease.control.dirfsync",
        "lease.lock.create",
        "epoch.create",
        "epoch.write",
        "epoch.fsync",
        "epoch.rename",
        "lease.marker.create",
        "lease.marker.write",
        "lease.marker.fsync",
        "lease.marker.rename",
        "lease.owner.create",
        "lease.owner.write",
        "lease.owner.rename",
        "lease.acquire.dirfsync",
        "lease.registry.mkdir",
        "lease.registry.create",
        "lease.registry.write",
        "lease.registry.rename",
        "lease.waiters.mkdir",
    ];
    let mut table = Vec::new();
    for point in points {
        let mut hits = 0;
        for (cold, action) in [
            (true, "kill"),
            (false, "kill"),
            (true, "eio"),
            (false, "eio"),
        ] {
            let t = private_tempdir();
            let dir = t.path().join("s");
            let sd = StateDir::open(&dir, true).unwrap();
            let before_epoch = if cold {
                0
            } else {
                let l = acquire_here(&sd).unwrap();
                let e = l.epoch();
                l.release().unwrap();
                e
            };
            let spec = format!("{point}={action}");
            let mut p = Probe::spawn_with_env(
                &["hold", dir.to_str().unwrap(), "try"],
                &[("TENURE_FAILPOINTS", spec.as_str())],
            );
            // End of input makes a probe that was not stopped by the point release and exit.
            p.close_stdin();
            let st = p.wait();
            match (code(st), action) {
                (137, "kill") => hits += 1,
                (65, "eio") => hits += 1,
                (0, _) => {} // this scenario never reaches the point (e.g. no mkdir when warm)
                (c, _) => panic!("{spec} (cold={cold}): unexpected exit {c}"),
            }
            // The next contender owns at once, higher epoch, whole marker, no temp files.
            let l =
                acquire_here(&sd).unwrap_or_else(|e| panic!("{spec} (cold={cold}) wedged: {e}"));
            assert!(
                l.epoch() > before_epoch,
                "{spec}: epoch {} after {before_epoch}",
                l.epoch()
            );
            let st = lease::status(&sd).unwrap();
            assert_eq!(st.identity.unwrap().path, sd.path(), "{spec}");
            let temps: Vec<_> = std::fs::read_dir(dir.join(".tenure"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".tmp-"))
                .collect();
            assert!(temps.is_empty(), "{spec}: temp files left {temps:?}");
            l.release().unwrap();
        }
        assert!(
            hits > 0,
            "{point} was never reached: the sweep would be vacuous"
        );
        table.push((point, hits));
    }
    eprintln!("acquisition crash points (point, scenarios that hit it):");
    for (point, hits) in table {
        eprintln!("  {point:<26} {hits}");
    }
}

/// Card H7: a candidate that opened a state dir never initialises or takes over a replacement:
/// after the dir is moved away and an empty one put at its path, acquisition through the old
/// handle refuses (`moved or replaced`) and neither directory changes.
#[test]
fn h7_replaced_dir_is_not_initialised() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let sd = StateDir::open(&dir, true).unwrap();
    acquire_here(&sd).unwrap().release().unwrap();
    std::fs::rename(&dir, t.path().join("moved")).unwrap();
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let before = snapshot(t.path());
    let err = acquire_here(&sd).unwrap_err();
    assert!(matches!(err, LeaseError::Moved { .. }), "{err}");
    assert!(err.to_string().contains("moved or replaced"), "{err}");
    assert_eq!(snapshot(t.path()), before);
}

/// Issue 11 (the registry written in place): the owner's entry and an instance entry are made
/// once and then only overwritten — the same inodes across ownerships, registrations and
/// releases, and no other name ever appears in the registry folders — while `status` shows
/// exactly the entries of the live ownership (the owner, its registered child) and none once
/// it released or unregistered.
#[test]
fn registry_entries_are_written_in_place() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let sd = StateDir::open(&dir, true).unwrap();
    let me = Identity::of_self().unwrap();
    let ino = |p: &str| {
        std::fs::metadata(dir.join(".tenure/registry").join(p))
            .unwrap()
            .ino()
    };
    let names = |kind: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.join(".tenure/registry").join(kind))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let shown = || -> Vec<(&'static str, String, u64)> {
        let st = lease::status(&sd).unwrap();
        st.registry
            .iter()
            .map(|r| (r.kind, r.entry.clone(), r.record.as_ref().unwrap().epoch))
            .collect()
    };
    let mut inodes = None;
    for round in 1..=4u64 {
        let mut l = acquire_here(&sd).unwrap();
        assert_eq!(l.epoch(), round);
        assert_eq!(shown(), [("leases", "owner.slot".to_owned(), round)]);
        l.register_instance("child", &me).unwrap();
        assert_eq!(
            shown(),
            [
                ("leases", "owner.slot".to_owned(), round),
                ("instances", "child.slot".to_owned(), round)
            ]
        );
        if round % 2 == 0 {
            // Unregistered by hand on even rounds, vacated by the release on odd ones.
            l.unregister_instance("child").unwrap();
            assert_eq!(shown(), [("leases", "owner.slot".to_owned(), round)]);
        }
        let now = (ino("leases/owner.slot"), ino("instances/child.slot"));
        assert_eq!(
            *inodes.get_or_insert(now),
            now,
            "round {round}: a new inode"
        );
        l.release().unwrap();
        assert_eq!(
            shown(),
            [],
            "round {round}: entries of a released owner shown"
        );
        assert_eq!(names("leases"), ["owner.slot"]);
        assert_eq!(names("instances"), ["child.slot"]);
        assert_eq!(
            (ino("leases/owner.slot"), ino("instances/child.slot")),
            now,
            "round {round}: the release made a new inode"
        );
    }
    // An owner that crashed (dropped, not released) leaves its entry, and status shows it.
    let crashed = acquire_here(&sd).unwrap();
    let root_id = crashed.root_id();
    drop(crashed);
    assert_eq!(shown(), [("leases", "owner.slot".to_owned(), 5)]);
    // A successor whose owner record is written but whose entry is not yet (it overwrites the
    // slot right after): the crashed owner's entry of an older epoch is not shown as an owner.
    let successor = acquire_here(&sd).unwrap();
    assert_eq!(successor.epoch(), 6);
    let older = lease::RegistryRecord {
        version: lease::RECORD_VERSION,
        epoch: 5,
        token: lease::Token([5; 16]),
        name: "owner".to_owned(),
        identity: me.clone(),
        since: 1,
        root_id: Some(root_id),
    };
    let slot = lease::record::registry_slot(Some(&older)).unwrap();
    std::fs::write(dir.join(".tenure/registry/leases/owner.slot"), slot).unwrap();
    assert_eq!(
        shown(),
        [],
        "an entry a later owner record superseded is shown"
    );
    successor.release().unwrap();
}

/// Issue 11: the registry entries older tenure created per ownership (`<epoch>.json`,
/// `<epoch>-<name>.json`) are still read: the epoch rule counts their names (card P3), the
/// next owner sweeps the dead ones, reports a live instance as an orphan and removes its entry
/// once it stopped it, and `status` shows them meanwhile.
#[test]
fn older_registry_entries_are_still_read_and_swept() {
    let t = private_tempdir();
    let dir = t.path().join("s");
    let sd = StateDir::open(&dir, true).unwrap();
    let first = acquire_here(&sd).unwrap();
    let root_id = first.root_id();
    // Dropped, not released: as after a crash, the next acquisition lists and sweeps the
    // registry (after an orderly release only every 64th epoch does).
    drop(first);
    let (mut orphan, orphan_id, gone_id) = live_and_dead();
    // What an older tenure's owner of epoch 5 left when it crashed (the owner record stays
    // at epoch 1: only the names say 5).
    let entry = |epoch: u64, name: &str, id: &Identity| {
        serde_json::to_vec_pretty(&lease::RegistryRecord {
            version: lease::RECORD_VERSION,
            epoch,
            token: lease::Token([5; 16]),
            name: name.to_owned(),
            identity: id.clone(),
            since: 1,
            root_id: Some(root_id),
        })
        .unwrap()
    };
    let reg = dir.join(".tenure/registry");
    let me = Identity::of_self().unwrap();
    write_private(&reg.join("leases/5.json"), &entry(5, "owner", &me));
    write_private(
        &reg.join("instances/5-child.json"),
        &entry(5, "child", &orphan_id),
    );
    write_private(
        &reg.join("instances/5-gone.json"),
        &entry(5, "gone", &gone_id),
    );
    let st = lease::status(&sd).unwrap();
    let mut shown: Vec<_> = st.registry.iter().map(|r| r.entry.clone()).collect();
    shown.sort();
    assert_eq!(
        shown,
        ["5-child.json", "5-gone.json", "5.json", "owner.slot"]
    );

    let mut second = acquire_here(&sd).unwrap();
    assert_eq!(
        second.epoch(),
        6,
        "the older names count for the epoch rule"
    );
    let orphans: Vec<_> = second.orphans().iter().map(|o| o.identity.pid).collect();
    assert_eq!(orphans, [orphan.id()]);
    assert!(
        !reg.join("leases/5.json").exists(),
        "the dead owner's entry is swept"
    );
    assert!(
        !reg.join("instances/5-gone.json").exists(),
        "the dead instance is swept"
    );
    assert_eq!(
        second.stop_orphans(Duration::from_secs(10)),
        Ok(vec![orphan.id()])
    );
    orphan.wait().unwrap();
    assert!(
        !reg.join("instances/5-child.json").exists(),
        "the stopped orphan's entry"
    );
    second.release().unwrap();
    assert!(lease::status(&sd).unwrap().registry.is_empty());
}
