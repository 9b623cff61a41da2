//! The typed lifecycle (`tenure::Tenure`) against real state dirs: cards H1–H4 at library
//! level, with real threads and the real lease and checkpoint store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tenure::machine::{NotAdmitted, OpClass, PhaseKind, Reason, ResidencyKind, RetireMode};
use tenure::{CheckpointFile, Options, Ready, Recovered, Tenure, TenureError, WaitBound};

/// Waits (at most 20 s, polling the lease status) until a waiter of the dir at `dir` shows.
fn wait_for_a_waiter(dir: &std::path::Path) {
    let status_dir = tenure::StateDir::open(dir, false).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while tenure::lease::status(&status_dir)
        .unwrap()
        .waiters
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the waiter never became visible");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn options() -> Options {
    Options {
        grace: Duration::from_secs(10),
        ..Options::default()
    }
}

/// Card H1: bootstrap is admitted while recovering, serving is not (`not ready`); once the drain
/// begins new work is rejected with `draining`.
#[test]
fn h1_admission_follows_the_phase() {
    let tmp = tempfile::tempdir().unwrap();
    let cold = Tenure::open(tmp.path().join("s"), options()).unwrap();
    let host = cold.host();
    let rec = cold.acquire(WaitBound::Try).unwrap();
    assert_eq!(host.phase(), PhaseKind::Recovering);
    assert!(host.admit(OpClass::Bootstrap).is_ok());
    assert!(host.admit(OpClass::Status).is_ok());
    let e = host
        .enter(OpClass::Serve, ResidencyKind::Active)
        .unwrap_err();
    assert!(e.to_string().starts_with("not ready"), "{e}");
    let Recovered::Ready(ready) = rec.recovered().unwrap() else {
        panic!("not ready")
    };
    let work = host.enter(OpClass::Serve, ResidencyKind::Active).unwrap();
    host.request_drain();
    assert_eq!(host.admit(OpClass::Serve), Err(NotAdmitted::Draining));
    let e = host.enter(OpClass::Serve, ResidencyKind::Idle).unwrap_err();
    assert!(e.to_string().starts_with("draining"), "{e}");
    assert!(host.admit(OpClass::Status).is_ok());
    drop(work);
    let draining = ready.wait_for_drain().unwrap();
    let released = draining.close(Vec::new()).unwrap();
    assert_eq!(released.outcome.reason, Reason::Stopped);
    assert_eq!(
        released.published, None,
        "nothing staged, nothing published"
    );
}

/// Card H2: the drain hook may use the host it was set on — set another hook, read the phase,
/// request the drain again — without waiting for itself: it runs outside the hook's lock.
#[test]
fn h2_a_drain_hook_may_use_its_host() {
    let tmp = tempfile::tempdir().unwrap();
    let cold = Tenure::open(tmp.path().join("s"), options()).unwrap();
    let host = cold.host();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = host.clone();
    host.on_begin_drain(move || {
        h.on_begin_drain(|| {});
        h.request_drain();
        tx.send(h.phase()).unwrap();
    });
    let rec = cold.acquire(WaitBound::Try).unwrap();
    let requester = host.clone();
    std::thread::spawn(move || requester.request_drain());
    let phase = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the hook ran to its end (it waited for its own lock)");
    assert_eq!(phase, PhaseKind::Recovering);
    drop(rec);
}

/// Card H2: many threads request the drain while recovery is still running; the drain hook runs
/// exactly once, on one of those threads, while the phase is still `recovering` (before
/// recovery completes), and the owner then closes without serving.
#[test]
fn h2_drain_requested_before_recovery_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let cold = Tenure::open(tmp.path().join("s"), options()).unwrap();
    let host = cold.host();
    // What the hook saw each time it ran: the phase and the thread it ran on.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (s, h) = (seen.clone(), host.clone());
    host.on_begin_drain(move || {
        s.lock()
            .unwrap()
            .push((h.phase(), std::thread::current().name().map(str::to_owned)))
    });
    let rec = cold.acquire(WaitBound::Try).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let h = host.clone();
            std::thread::Builder::new()
                .name(format!("requester-{i}"))
                .spawn(move || h.request_drain())
                .unwrap()
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "the hook ran {} times: {seen:?}", seen.len());
        assert_eq!(
            seen[0].0,
            PhaseKind::Recovering,
            "the drain began before recovery completed"
        );
        assert!(
            seen[0]
                .1
                .as_deref()
                .is_some_and(|n| n.starts_with("requester-")),
            "it ran on a requesting thread: {seen:?}"
        );
    }
    assert_eq!(host.phase(), PhaseKind::Recovering);
    let Recovered::Draining(d) = rec.recovered().unwrap() else {
        panic!("a drain requested during recovery must close, not serve")
    };
    let released = d.close([CheckpointFile::new("state", "closed")]).unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1, "the hook ran again");
    assert_eq!(host.drains_begun(), 1);
    assert!(released.published.is_some());
}

/// Card H3: an ephemeral owner exits after its idle grace only once no active residency is
/// held; an idle residency does not keep it; a service owner stays.
#[test]
fn h3_ephemeral_owner_exits_when_idle_only() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = Options {
        retire: RetireMode::Ephemeral,
        idle_grace: Duration::from_millis(100),
        ..options()
    };
    let cold = Tenure::open(tmp.path().join("s"), opts).unwrap();
    let host = cold.host();
    let Recovered::Ready(ready) = cold.acquire(WaitBound::Try).unwrap().recovered().unwrap() else {
        panic!()
    };
    let active = host.enter(OpClass::Serve, ResidencyKind::Active).unwrap();
    let _idle = host.enter(OpClass::Serve, ResidencyKind::Idle).unwrap();
    let released_at = Arc::new(AtomicUsize::new(0));
    let h = host.clone();
    let r = released_at.clone();
    let holder = std::thread::spawn(move || {
        // Hold the active residency well past the idle grace: the owner must not exit.
        let until = Instant::now() + Duration::from_millis(400);
        while Instant::now() < until {
            assert_eq!(
                h.phase(),
                PhaseKind::Ready,
                "exited while an active residency was held"
            );
            std::thread::yield_now();
        }
        r.store(1, Ordering::SeqCst);
        drop(active);
    });
    let draining = ready.wait_for_drain().unwrap();
    assert_eq!(
        released_at.load(Ordering::SeqCst),
        1,
        "idle exit before the active residency ended"
    );
    holder.join().unwrap();
    let released = draining.close(Vec::new()).unwrap();
    assert_eq!(released.outcome.reason, Reason::Stopped);

    // A service owner with no residency at all does not retire by itself.
    let cold = Tenure::open(tmp.path().join("svc"), options()).unwrap();
    let host = cold.host();
    let Recovered::Ready(ready) = cold.acquire(WaitBound::Try).unwrap().recovered().unwrap() else {
        panic!()
    };
    assert!(!host.try_idle_exit());
    assert_eq!(host.phase(), PhaseKind::Ready);
    ready.drain().unwrap().close(Vec::new()).unwrap();
}

/// Card H4: a close is bounded by the grace; when an active residency does not settle, the
/// error keeps the original cause and the lease is kept (a contender is busy), and a later close
/// completes once the work ends.
#[test]
fn h4_bounded_close_keeps_cause_and_lease() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let opts = Options {
        grace: Duration::from_millis(200),
        ..options()
    };
    let cold = Tenure::open(&dir, opts).unwrap();
    let host = cold.host();
    let Recovered::Ready(ready) = cold.acquire(WaitBound::Try).unwrap().recovered().unwrap() else {
        panic!()
    };
    let stuck = host.enter(OpClass::Serve, ResidencyKind::Active).unwrap();
    host.stop(tenure::machine::Signal::Term);
    let draining = ready.wait_for_drain().unwrap();
    let unsettled = match draining.close([CheckpointFile::new("x", "1")]) {
        Err(TenureError::Unsettled(u)) => *u,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("closed while an active residency was held"),
    };
    assert_eq!(
        unsettled.cause,
        tenure::machine::DrainCause::Signal(tenure::machine::Signal::Term)
    );
    assert_eq!(unsettled.active, 1);
    assert!(unsettled.to_string().contains("SIGTERM"), "{unsettled}");
    // The lease is still held: a contender is busy.
    let other = Tenure::open(&dir, options()).unwrap();
    match other.acquire(WaitBound::Try) {
        Err(TenureError::Lease(e)) => assert!(e.to_string().contains("busy"), "{e}"),
        other => panic!("expected busy, got {other:?}"),
    }
    drop(stuck);
    let released = unsettled
        .tenure
        .close([CheckpointFile::new("x", "1")])
        .unwrap();
    assert_eq!(released.outcome.code(), 143);
    assert!(released.published.is_some());
    // The successor sees the checkpoint and a higher epoch.
    let next = Tenure::open(&dir, options())
        .unwrap()
        .acquire(WaitBound::Try)
        .unwrap();
    assert_eq!(next.read("x").unwrap().as_deref(), Some(&b"1"[..]));
    assert!(next.epoch() > released.epoch);
}

/// Card G3 at library level: a stop delivered while recovering refuses; the lease is released
/// and the checkpoint is unchanged.
#[test]
fn g3_stop_while_recovering_refuses_in_process() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let first = Tenure::open(&dir, options())
        .unwrap()
        .acquire(WaitBound::Try)
        .unwrap();
    let Recovered::Ready(r) = first.recovered().unwrap() else {
        panic!()
    };
    r.drain()
        .unwrap()
        .close([CheckpointFile::new("a", "old")])
        .unwrap();

    let cold = Tenure::open(&dir, options()).unwrap();
    let host = cold.host();
    let rec = cold.acquire(WaitBound::Try).unwrap();
    host.stop(tenure::machine::Signal::Term);
    match rec.recovered() {
        Err(TenureError::Ended(o)) => {
            assert_eq!(o.reason, Reason::Refused);
            assert_eq!(o.code(), 143);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let next = Tenure::open(&dir, options())
        .unwrap()
        .acquire(WaitBound::Try)
        .unwrap();
    assert_eq!(next.read("a").unwrap().as_deref(), Some(&b"old"[..]));
}

/// Card H6: a duration too large for the clock (`Duration::MAX`: "no bound") is a bound that
/// never expires, never a panic: a grace, an idle grace and a lease wait of `Duration::MAX`
/// behave as forever. Before, every one of them overflowed `Instant + Duration` and panicked
/// (in `wait_for_drain`, in `close`, in `acquire`).
#[test]
fn h6_a_duration_too_large_for_the_clock_is_forever() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    // An ephemeral owner whose idle grace never runs out stays until the drain is requested.
    // The requester's sleep is not synchronisation: the outcome is the same whenever the
    // request comes; it only lets `wait_for_drain` reach its idle wait first.
    let opts = Options {
        idle_grace: Duration::MAX,
        retire: RetireMode::Ephemeral,
        ..options()
    };
    let cold = Tenure::open(&dir, opts).unwrap();
    let host = cold.host();
    let Recovered::Ready(ready) = cold.acquire(WaitBound::Try).unwrap().recovered().unwrap() else {
        panic!()
    };
    let requester = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        host.request_drain()
    });
    let draining = ready.wait_for_drain().unwrap();
    requester.join().unwrap();
    assert_eq!(draining.phase(), PhaseKind::Draining);
    draining.close(Vec::new()).unwrap();

    // A close whose grace never expires waits for the active residency however long it takes
    // and completes once it is released (the holder's sleep, likewise, only lets the close
    // start waiting first).
    let opts = Options {
        grace: Duration::MAX,
        ..options()
    };
    let cold = Tenure::open(&dir, opts).unwrap();
    let host = cold.host();
    let Recovered::Ready(ready) = cold.acquire(WaitBound::Try).unwrap().recovered().unwrap() else {
        panic!()
    };
    let work = host.enter(OpClass::Serve, ResidencyKind::Active).unwrap();
    let draining = ready.drain().unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(work);
    });
    let released = draining.close([CheckpointFile::new("x", "1")]).unwrap();
    holder.join().unwrap();
    assert_eq!(released.outcome.reason, Reason::Stopped);
    assert!(released.published.is_some());

    // A lease wait of Duration::MAX waits like Forever: it takes the lease once it is free.
    let owner = Tenure::open(&dir, options())
        .unwrap()
        .acquire(WaitBound::Try)
        .unwrap();
    let d = dir.clone();
    let waiter = std::thread::spawn(move || {
        Tenure::open(&d, options())
            .unwrap()
            .acquire(WaitBound::For(Duration::MAX))
            .map(|t| t.epoch())
            .map_err(|e| e.to_string())
    });
    wait_for_a_waiter(&dir);
    let first = owner.epoch();
    let Recovered::Ready(r) = owner.recovered().unwrap() else {
        panic!()
    };
    r.drain().unwrap().close(Vec::new()).unwrap();
    let next = waiter.join().expect("the waiter panicked").unwrap();
    assert!(next > first);
}

/// A state dir whose path is not UTF-8 (the identity marker records the path as text) is
/// refused with an error naming it before anything is created, instead of a panic inside the
/// acquisition that left a half-made `.tenure/` behind.
#[test]
fn a_state_dir_path_that_is_not_utf8_is_refused_before_anything_is_created() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(std::ffi::OsStr::from_bytes(b"state-\xff"));
    let e = Tenure::open(&dir, options()).unwrap_err();
    assert!(matches!(&e, TenureError::Fs(f) if f.is_refusal()), "{e:?}");
    assert!(e.to_string().contains("UTF-8"), "{e}");
    assert!(
        e.to_string().contains("state-"),
        "the error names the path: {e}"
    );
    assert!(!dir.exists(), "nothing was created");
    // An existing dir of that name is left as it was.
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let e = Tenure::open(&dir, options()).unwrap_err();
    assert!(e.to_string().contains("UTF-8"), "{e}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing was created"
    );
}

/// Card H7 at library level: an in-process owner whose state dir is moved while it serves
/// drains by itself (`wait_for_drain` returns, the drain hook runs) and its close ends
/// `stopped/root-lost` (65); moved while recovering, `recovered` refuses (`refused/root-lost`)
/// and releases the lease. Nothing is recreated at the old path. The library used to go on
/// serving the moved dir until someone asked it to drain.
#[test]
fn h7_moved_root_drains_the_in_process_owner() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let cold = Tenure::open(&dir, options()).unwrap();
    let host = cold.host();
    let hook_ran = Arc::new(AtomicUsize::new(0));
    let h = hook_ran.clone();
    host.on_begin_drain(move || {
        h.fetch_add(1, Ordering::SeqCst);
    });
    let Recovered::Ready(ready) = cold.acquire(WaitBound::Try).unwrap().recovered().unwrap() else {
        panic!()
    };
    let moved = tmp.path().join("moved");
    std::fs::rename(&dir, &moved).unwrap();
    // Nobody requests the drain: the owner must notice the move itself, within the deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(ready.wait_for_drain());
    });
    let draining = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the owner did not notice that its state dir was moved")
        .unwrap();
    assert_eq!(hook_ran.load(Ordering::SeqCst), 1);
    // The drain still publishes, into the dir where it now is (the owner's descriptors follow
    // the move; never into a dir that replaced it): what the owner made is not lost (card P1).
    let released = draining
        .close([CheckpointFile::new("a", "made while serving")])
        .unwrap();
    assert_eq!(released.outcome.summary(), "stopped/root-lost");
    assert_eq!(released.outcome.code(), 65);
    assert!(released.published.is_some(), "{released:?}");
    assert!(moved.join(".tenure").is_dir());
    assert!(!dir.exists(), "nothing was recreated at the old path");

    // Moved while recovering: the recovery is refused and the lease released.
    std::fs::rename(&moved, &dir).unwrap();
    let rec = Tenure::open(&dir, options())
        .unwrap()
        .acquire(WaitBound::Try)
        .unwrap();
    std::fs::rename(&dir, &moved).unwrap();
    match rec.recovered() {
        Err(TenureError::Ended(o)) => assert_eq!(o.summary(), "refused/root-lost"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(!dir.exists(), "nothing was recreated at the old path");
    std::fs::rename(&moved, &dir).unwrap();
    let next = Tenure::open(&dir, options())
        .unwrap()
        .acquire(WaitBound::Try)
        .expect("the refused owner released the lease");
    assert_eq!(
        next.read("a").unwrap().as_deref(),
        Some(&b"made while serving"[..]),
        "the drain's checkpoint is the moved dir's"
    );
    drop(next);
}

/// Card G1 at library level: a stop delivered through the host while the owner is cold —
/// before `acquire`, or while `acquire` waits for the lease — cancels (`cancelled/SIGTERM`):
/// `acquire` returns [`TenureError::Ended`] with that outcome, a lease the wait obtained
/// afterwards is released at once (no stale owner record), and a successor acquires at once.
/// `acquire` used to fail with `TenureError::Internal` ("please report it": the machine,
/// already cancelled, rejected `start` or the acquisition's answer) and, when the lease was
/// granted, dropped it unreleased, leaving a record of an owner in `recovering` behind.
#[test]
fn g1_a_stop_while_cold_cancels_the_in_process_acquire() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let cancelled = |r: Result<Tenure<tenure::Recovering>, TenureError>| match r {
        Err(TenureError::Ended(o)) => {
            assert_eq!(o.summary(), "cancelled/SIGTERM");
            assert_eq!(o.code(), 143);
        }
        other => panic!("expected a cancellation, got {other:?}"),
    };

    // Before acquire: nothing on disk changes.
    let cold = Tenure::open(&dir, options()).unwrap();
    cold.host().stop(tenure::machine::Signal::Term);
    let before: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    cancelled(cold.acquire(WaitBound::Try));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), before.len());

    // While acquire waits: once the owner releases, the waiter's grant is withdrawn.
    let owner = Tenure::open(&dir, options())
        .unwrap()
        .acquire(WaitBound::Try)
        .unwrap();
    let cold = Tenure::open(&dir, options()).unwrap();
    let host = cold.host();
    let waiter = std::thread::spawn(move || cold.acquire(WaitBound::Forever));
    wait_for_a_waiter(&dir);
    host.stop(tenure::machine::Signal::Term);
    assert_eq!(host.phase(), PhaseKind::Cancelled);
    let first = owner.epoch();
    let Recovered::Ready(r) = owner.recovered().unwrap() else {
        panic!()
    };
    r.drain().unwrap().close(Vec::new()).unwrap();
    cancelled(waiter.join().unwrap());
    let st = tenure::lease::status(&tenure::StateDir::open(&dir, false).unwrap()).unwrap();
    assert!(!st.held, "the withdrawn grant still holds the lease");
    assert!(st.waiters.is_empty(), "a waiter entry remains");
    let rec = st.owner.expect("the first owner's record");
    assert_eq!(
        rec.phase,
        PhaseKind::Released,
        "the record of the withdrawn grant says it ended: {rec:?}"
    );
    let next = Tenure::open(&dir, options())
        .unwrap()
        .acquire(WaitBound::Try)
        .expect("a successor acquires at once");
    assert!(next.epoch() > first);
}

/// A state dir path with a name too long for the filesystem (over 255 bytes) is refused before
/// anything is created: its missing parents are not left behind. (`Tenure::open` and
/// `tenure run --dir` created the parents, then failed on the long name.)
#[test]
fn a_name_too_long_creates_no_parent() {
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("missing");
    let dir = parent.join("x".repeat(300));
    let e = Tenure::open(&dir, options()).unwrap_err();
    assert!(e.to_string().contains("too long"), "{e}");
    assert!(!parent.exists(), "a parent was created");
}

/// A ready owner of `dir`, acquired at once.
fn ready(dir: &std::path::Path) -> Tenure<Ready> {
    let Recovered::Ready(r) = Tenure::open(dir, options())
        .unwrap()
        .acquire(WaitBound::Try)
        .unwrap()
        .recovered()
        .unwrap()
    else {
        panic!("not ready")
    };
    r
}

/// Closes a ready owner of `dir` with `files`, and expects the publish to fail: the files it
/// hands back, and the error's message.
fn close_failing(
    dir: &std::path::Path,
    files: Vec<CheckpointFile>,
) -> (Vec<CheckpointFile>, String) {
    match ready(dir).drain().unwrap().close(files) {
        Err(TenureError::Publish(p)) => {
            let msg = p.to_string();
            (p.into_files(), msg)
        }
        Err(e) => panic!("expected a failed publish, got {e}"),
        Ok(r) => panic!("published {:?}", r.published),
    }
}

/// Card P1 in the library: a publish that fails hands every file given to `close` back, in
/// order and byte for byte (`TenureError::Publish`); the lease is released and the current
/// checkpoint is the one before. `close` took the files by value and dropped them with the
/// error. The publish fails for real: a name the store refuses beside a good file, and (with
/// the `failpoints` feature) an I/O error while a blob is created.
#[test]
fn p1_a_failed_publish_hands_the_files_back_in_process() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    ready(&dir)
        .drain()
        .unwrap()
        .close([CheckpointFile::new("a", "old")])
        .unwrap();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let expect = |back: &[CheckpointFile], names: &[&str], bytes: &[&[u8]]| {
        let got: Vec<(&str, &[u8])> = back
            .iter()
            .map(|f| (f.name.as_str(), f.bytes.as_slice()))
            .collect();
        let want: Vec<(&str, &[u8])> = names.iter().copied().zip(bytes.iter().copied()).collect();
        assert!(got == want, "the files handed back differ from those given");
    };
    let mut cases: Vec<(&str, Option<&str>)> = vec![("../escape", None)];
    if cfg!(feature = "failpoints") {
        cases.push(("second", Some("publish.blob.create=eio")));
    }
    for (second, point) in cases {
        let files = vec![
            CheckpointFile::new("state", big.clone()),
            CheckpointFile::new(second, "tail"),
        ];
        let (back, msg) = {
            #[cfg(feature = "failpoints")]
            let _f = point.map(tenure::failpoint::scoped);
            #[cfg(not(feature = "failpoints"))]
            assert!(point.is_none());
            close_failing(&dir, files)
        };
        assert!(msg.contains("handed back unpublished"), "{msg}");
        expect(&back, &["state", second], &[&big, b"tail"]);
        // Released, and nothing of the failed close was published.
        let next = Tenure::open(&dir, options())
            .unwrap()
            .acquire(WaitBound::Try)
            .unwrap();
        assert_eq!(next.read("a").unwrap().as_deref(), Some(&b"old"[..]));
        assert_eq!(next.read("state").unwrap(), None);
        let Recovered::Ready(r) = next.recovered().unwrap() else {
            panic!("not ready")
        };
        r.drain().unwrap().close(Vec::new()).unwrap();
    }
}
