//! loom checks of the in-process handle (`tenure::host`): every interleaving of the threads
//! below is explored. Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom`.
//!
//! Each property also runs against a deliberately wrong variant of the handle (a load-then-store
//! where the real code does one atomic step) and must fail there, proving the check can fail.
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;
use tenure::host::Host;
use tenure::host::mutation::{self, Mutation};
use tenure::machine::{
    Config, Event, Machine, OpClass, Phase, PhaseKind, RecoveryStep, ResidencyKind, RetireMode,
    Running,
};

fn ready(mode: RetireMode) -> Host {
    Host::detached(
        Machine::with_phase(
            Config::in_process(),
            Phase::Ready {
                epoch: 1,
                running: Running::Main,
            },
        ),
        mode,
    )
}

/// I11, card H2: three threads request the drain at once; it begins exactly once and the hook
/// runs exactly once.
fn drain_once_model() {
    loom::model(|| {
        let host = ready(RetireMode::Service);
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        host.on_begin_drain(move || {
            c.fetch_add(1, Ordering::SeqCst);
        });
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let h = host.clone();
                thread::spawn(move || h.request_drain())
            })
            .collect();
        host.request_drain();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(host.drains_begun(), 1, "the drain began more than once");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(host.phase(), PhaseKind::Draining);
    });
}

#[test]
fn i11_h2_drain_begins_exactly_once_with_three_callers() {
    drain_once_model();
}

#[test]
#[should_panic(expected = "the drain began more than once")]
fn i11_mutant_step_outside_lock_is_caught() {
    let _m = mutation::set(Mutation::StepOutsideLock);
    drain_once_model();
}

/// Card H2: requested while recovering (from two threads, racing the end of recovery), the
/// drain begins once, before the owner closes, and the owner never becomes ready.
#[test]
fn h2_drain_requested_during_recovery_races_recovery_done() {
    loom::model(|| {
        let host = Host::detached(
            Machine::with_phase(
                Config::in_process(),
                Phase::Recovering {
                    epoch: 1,
                    step: RecoveryStep::Verifying,
                    drain_pending: false,
                    outcome: None,
                },
            ),
            RetireMode::Service,
        );
        let h = host.clone();
        let requester = thread::spawn(move || h.request_drain());
        host.request_drain();
        host.feed(Event::RecoveryDone).unwrap();
        requester.join().unwrap();
        assert_eq!(host.drains_begun(), 1);
        let phase = host.phase();
        assert_eq!(
            phase,
            PhaseKind::Draining,
            "recovered with a drain pending must close"
        );
    });
}

/// I15, card H3: once the drain committed no residency can be acquired, so a drain that saw
/// itself settled never has work running behind it.
fn no_residency_after_commit_model() {
    loom::model(|| {
        let host = ready(RetireMode::Service);
        let settled = Arc::new(AtomicBool::new(false));
        let (h, s) = (host.clone(), settled.clone());
        let drainer = thread::spawn(move || {
            h.request_drain();
            if h.residencies().settled() {
                s.store(true, Ordering::SeqCst);
            }
        });
        if let Ok(r) = host.enter(OpClass::Bootstrap, ResidencyKind::Active) {
            assert!(
                !settled.load(Ordering::SeqCst),
                "a residency is held while the drain considers itself settled"
            );
            drop(r);
        }
        drainer.join().unwrap();
        assert!(host.residencies().closed());
    });
}

#[test]
fn i15_no_residency_after_drain_commits() {
    no_residency_after_commit_model();
}

#[test]
#[should_panic(expected = "a residency is held while the drain considers itself settled")]
fn i15_mutant_check_then_increment_is_caught() {
    let _m = mutation::set(Mutation::CheckThenIncrement);
    no_residency_after_commit_model();
}

/// I15, card H3: an ephemeral owner's idle exit commits only while no active residency is held.
fn idle_exit_model() {
    loom::model(|| {
        let host = ready(RetireMode::Ephemeral);
        let exited = Arc::new(AtomicBool::new(false));
        let (h, e) = (host.clone(), exited.clone());
        let watcher = thread::spawn(move || {
            if h.try_idle_exit() {
                e.store(true, Ordering::SeqCst);
            }
        });
        if let Ok(r) = host.enter(OpClass::Serve, ResidencyKind::Active) {
            assert!(
                !exited.load(Ordering::SeqCst),
                "idle exit committed while an active residency is held"
            );
            drop(r);
        }
        watcher.join().unwrap();
    });
}

#[test]
fn i15_idle_exit_only_without_residency() {
    idle_exit_model();
}

#[test]
#[should_panic(expected = "idle exit committed while an active residency is held")]
fn i15_mutant_idle_commit_without_cas_is_caught() {
    let _m = mutation::set(Mutation::IdleCommitWithoutCas);
    idle_exit_model();
}

/// Card H3: idle residencies never block an ephemeral owner's exit.
#[test]
fn h3_idle_residency_does_not_block_idle_exit() {
    loom::model(|| {
        let host = ready(RetireMode::Ephemeral);
        let idle = host.enter(OpClass::Serve, ResidencyKind::Idle).unwrap();
        let h = host.clone();
        let t = thread::spawn(move || h.try_idle_exit());
        assert!(t.join().unwrap());
        drop(idle);
        assert_eq!(host.phase(), PhaseKind::Draining);
    });
}
