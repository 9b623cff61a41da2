//! The mutants of the machine's rules (src/machine/rules.rs) and of the driver core
//! (src/driver/core.rs): each plants one plausible bug in the real code with
//! `tenure::mutant::scoped` and asserts that a model property fails for it (the mutation table in
//! models/README.md). They live in a test binary of their own because the planted mutant is
//! process-wide; the selection hands it to one test at a time.

use tenure_models::catalog;

fn killed(name: &str) {
    catalog::assert_src_killed(name);
}

/// Every catalogued rules and driver-core mutant has a test here.
#[test]
fn every_core_mutant_has_a_test() {
    let here = include_str!("mutants_core.rs");
    for m in catalog::src_mutants() {
        if m.place.starts_with("src/machine/") || m.place.starts_with("src/driver/") {
            assert!(
                here.contains(&format!("killed(\"{}\")", m.name)),
                "no test for src mutant {}",
                m.name
            );
        }
    }
}

/// G4, R1: a drain that publishes after the main process exited 3 (caught by no test before the driver core was shared).
#[test]
fn publish_after_nonzero_exit() {
    killed("publish-after-nonzero-exit");
}

/// G4, G6: a drain that publishes after the rest of the tree had to be SIGKILLed.
#[test]
fn publish_after_kill() {
    killed("publish-after-kill");
}

/// G4: a drain caused by a missed watchdog that publishes what the hung workload staged.
#[test]
fn publish_after_watchdog() {
    killed("publish-after-watchdog");
}

/// G6, D1: a stop step that arms the grace without forwarding the signal, so SIGKILL comes first.
#[test]
fn no_forward_on_stop() {
    killed("no-forward-on-stop");
}

/// G6, D1: a drain by a stop signal that starts with SIGKILL.
#[test]
fn drain_kills_at_once() {
    killed("drain-kills-at-once");
}

/// G4, I8: release, then publish, in one step (the models' old driver dropped the release).
#[test]
fn release_then_publish() {
    killed("release-then-publish");
}

/// G3: a stop while recovering that drains instead of refusing.
#[test]
fn stop_while_recovering_drains() {
    killed("stop-while-recovering-drains");
}

/// G3, I9: an abandoned recovery that publishes what its workload staged.
#[test]
fn refused_recovery_publishes() {
    killed("refused-recovery-publishes");
}

/// Issue 14, I3: a drain whose cluster lease was lost publishes what its killed workload staged.
#[test]
fn publish_after_lease_lost() {
    killed("publish-after-lease-lost");
}

/// G1, L3: a stop while waiting for the lease that is ignored.
#[test]
fn stop_while_waiting_ignored() {
    killed("stop-while-waiting-ignored");
}

/// H2: a drain that never runs the host's hook.
#[test]
fn dropped_begin_drain() {
    killed("dropped-begin-drain");
}

/// G6: the grace timer left armed once the stopped workload is gone.
#[test]
fn missed_disarm() {
    killed("missed-disarm");
}

/// T3: a ready owner that keeps a stray signal from its workload.
#[test]
fn stray_not_relayed() {
    killed("stray-not-relayed");
}

/// T1, I7: the main process's exit taken for the end of its tree while ready.
#[test]
fn main_exit_ends_workload() {
    killed("main-exit-ends-workload");
}

/// T1, I7: a drain that releases when the main process exits, while its tree runs.
#[test]
fn drain_releases_on_main_exit() {
    killed("drain-releases-on-main-exit");
}

/// The driver core lets a signal in while the spawn is outstanding.
#[test]
fn core_spawn_not_synchronous() {
    killed("core-spawn-not-synchronous");
}

/// The driver core keeps a disarmed timer armed.
#[test]
fn core_disarm_ignored() {
    killed("core-disarm-ignored");
}

/// The driver core keeps a fired timer armed.
#[test]
fn core_fired_timer_stays_armed() {
    killed("core-fired-timer-stays-armed");
}

/// The driver core keeps a recovery outstanding after the release that abandoned it.
#[test]
fn core_release_keeps_recovery() {
    killed("core-release-keeps-recovery");
}
