//! Card H7, the candidate's side: a run waiting on a state dir that is replaced meanwhile
//! refuses it instead of initialising it (the owner's side is in runner_signals.rs). Real
//! runner, real child, real renames, through the shared harness (clean environment, traces
//! checked against the models, end records checked, nothing left running on failure).

mod common;

use common::*;

/// Card H7: a candidate waiting on the dir when it is replaced refuses to go on with it
/// (`moved or replaced`, exit 65), and the replacement at the path is left as it is (not
/// initialised); the owner, whose dir moved away, stops with `stopped/root-lost`.
#[test]
fn h7_candidate_refuses_a_replaced_dir() {
    let env = Env::new();
    let mut owner = env.run(&["--grace", "5"], &sh(TERM_CHILD, &[]));
    env.wait_event("ready", Some(owner.pid()));
    env.wait_child_traps_term(owner.pid());
    let mut candidate = env.run(&[], &sh(TERM_CHILD, &[]));
    env.wait_event("waiting", Some(candidate.pid()));
    let moved = env.path("moved");
    std::fs::rename(&env.dir, &moved).unwrap();
    std::fs::create_dir(&env.dir).unwrap();
    // Both runs write their lines into the moved dir: its log is the one to check.
    owner.log_moved_to(&moved);
    candidate.log_moved_to(&moved);
    let a = owner.wait();
    a.expect_code(65);
    assert_eq!(a.end()["summary"], "stopped/root-lost");
    let b = candidate.wait();
    b.expect_code(65);
    assert!(
        b.stderr.contains("moved or replaced"),
        "the candidate must refuse: {}",
        b.stderr
    );
    // A candidate never owned, so the dir it refuses is "refused state" (refused/state), not
    // a lost root.
    assert_eq!(b.end()["summary"], "refused/state");
    assert!(
        !b.stderr.contains("owner of"),
        "the candidate never owned: {}",
        b.stderr
    );
    assert_eq!(
        std::fs::read_dir(&env.dir).unwrap().count(),
        0,
        "the replacement dir was initialised"
    );
}
