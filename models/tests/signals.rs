//! The signal interleavings model (invariants I6–I11, I16) for all three workloads, each a
//! process tree, with a pinned state count, and every signal mutant killed.

use stateright::{Checker, Model};
use tenure_models::catalog::{self, Which};
use tenure_models::signals::{Mutation, SignalModel};

/// I6–I11 hold when two stop signals (any of TERM, INT, HUP) arrive at any point of any driver
/// step, the child exits by itself or is killed at any point, timers fire at any point, and every
/// request gets every answer; for `--ready start`, `--ready notify --ready-timeout` and the
/// in-process host. Every `sometimes` is reached (a KILL after grace, a child that does not stop
/// and is reaped later, a published drain, a refusal by a signal while recovering, a drain
/// requested before recovery, two signals while draining, ...).
#[test]
fn full_signal_model() {
    catalog::check_pinned("signals");
}

/// With one signal instead of two, "two signals while draining" is not reached: the property
/// list is not vacuous.
#[test]
fn one_signal_cannot_signal_twice() {
    let mut m = SignalModel::ci();
    m.signals = 1;
    let checker = m.clone().checker().spawn_bfs().join();
    assert!(checker.discovery("two signals while draining").is_none());
    for p in m.properties() {
        if p.expectation == stateright::Expectation::Always {
            checker.assert_no_discovery(p.name);
        }
    }
}

fn killed(mutation: Mutation) {
    catalog::assert_killed(Which::Signals, mutation.name());
}

/// I7 (cards G5, G6): releasing at SIGKILL, before the child is reaped.
#[test]
fn mutant_release_on_kill() {
    killed(Mutation::ReleaseOnKill);
}

/// I8 (card G4): releasing before the drain's checkpoint is durable.
#[test]
fn mutant_release_before_publish() {
    killed(Mutation::ReleaseBeforePublish);
}

/// I9 (card G3): publishing when the machine refused the recovery.
#[test]
fn mutant_publish_on_release() {
    killed(Mutation::PublishOnRelease);
}

/// I10 (card R1): two end records for one run.
#[test]
fn mutant_double_end_record() {
    killed(Mutation::DoubleEndRecord);
}

/// I10 (card R1): an exit code that is not `Outcome::code` (and not the spec table's).
#[test]
fn mutant_exit_code_from_signal() {
    killed(Mutation::ExitCodeFromSignal);
}

/// I11 (card H2): the drain hook run a second time.
#[test]
fn mutant_begin_drain_on_set_phase() {
    killed(Mutation::BeginDrainOnSetPhase);
}

/// I6: the machine restarted after a terminal outcome.
#[test]
fn mutant_retry_after_busy() {
    killed(Mutation::RetryAfterBusy);
}

/// Legal events: a signal delivered while spawning, which is synchronous.
#[test]
fn mutant_signal_during_spawn() {
    killed(Mutation::SignalDuringSpawn);
}

/// I7 (card T1): reporting the main process's exit as the end of the workload, while its
/// descendant still runs, releases the lease under it.
#[test]
fn mutant_release_before_tree() {
    killed(Mutation::ReleaseBeforeTree);
}

/// I16 (card T1): the stop signal to the main process only — the rest of the tree is SIGKILLed
/// without ever being asked to stop.
#[test]
fn mutant_term_to_main_only() {
    killed(Mutation::TermToMainOnly);
}
