//! The catalogue of models, their CI configurations, their properties' invariant ids and their
//! mutants, so the CLI, the tests and the README table come from one list.
//!
//! It also holds the configurations whose unique state counts are pinned ([`pinned`]): the
//! counts live in `models/counts.txt`, are written by one command (`tenure-models pin`, add
//! `--long` for the long set) and are compared by the tests ([`check_pinned`]), so a change of
//! a model's state space is seen and re-pinned on purpose, never edited by hand.

use crate::checkpoint::{self, CheckpointModel};
use crate::cluster::{self, ClusterModel};
use crate::lease::{self, LeaseModel, LeaseState};
use crate::run::{self, Describe, Report, Search};
use crate::signals::{self, SignalModel};
use stateright::{Expectation, Representative};
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// One of the three models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Which {
    /// [`crate::lease`].
    Lease,
    /// [`crate::signals`].
    Signals,
    /// [`crate::checkpoint`].
    Checkpoint,
    /// [`crate::cluster`].
    Cluster,
}

impl Which {
    /// Every model.
    pub const ALL: [Which; 4] = [
        Which::Lease,
        Which::Signals,
        Which::Checkpoint,
        Which::Cluster,
    ];

    /// The name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Which::Lease => "lease",
            Which::Signals => "signals",
            Which::Checkpoint => "checkpoint",
            Which::Cluster => "cluster",
        }
    }

    /// Looks a model up by name.
    pub fn from_name(s: &str) -> Option<Which> {
        Which::ALL.into_iter().find(|w| w.name() == s)
    }
}

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The spec invariant a property checks (`—` for the driver-agreement property).
pub fn invariant(property: &str) -> &'static str {
    match property {
        lease::AT_MOST_ONE_OWNER => "I1",
        lease::EPOCHS_INCREASE => "I2",
        lease::FENCED_WRITES => "I3",
        lease::IDENTITY_CHECKED => "I4",
        lease::CANCEL_LEAVES_NOTHING => "I5",
        lease::TERMINAL_IS_FINAL => "I6",
        lease::NO_OVERLAP | lease::RELEASE_AFTER_TREE => "I7",
        lease::CLEAN_AFTER_POWER_LOSS => "I17",
        lease::MARKER_WRITTEN_ONCE => "L7",
        signals::LEASE_OUTLIVES_WORKLOAD => "I7",
        signals::TERM_BEFORE_KILL | signals::STRAYS_SURVIVED => "I16",
        signals::CHECKPOINT_BEFORE_RELEASE => "I8",
        signals::REFUSED_KEEPS_CURRENT => "I9",
        signals::ONE_OUTCOME | signals::EXIT_CODE_PER_SPEC => "I10",
        signals::DRAIN_ONCE => "I11",
        // The obligations of the cards: the card they pin.
        signals::STOP_COLD_CANCELS => "G1",
        signals::STOP_RECOVERING_REFUSES => "G3",
        signals::STOP_FORWARDED_BEFORE_KILL => "G6",
        signals::PUBLISH_AFTER_CLEAN_EXIT => "G4",
        signals::STRAY_RELAYED => "T3",
        signals::HOOK_BEFORE_DRAINING => "H2",
        // Issue 14: a lost lease fences the owner like a stale epoch does.
        signals::LEASE_LOST_STOPS => "I3",
        checkpoint::CURRENT_VALID_AFTER_CRASH | checkpoint::PUBLISHED_VALID => "I12",
        checkpoint::GC_KEEPS_CURRENT => "I13",
        checkpoint::NO_REPAIR | checkpoint::CORRUPTION_REFUSED => "I14",
        checkpoint::FENCED_PUBLISH => "I3",
        checkpoint::CLEAN_AFTER_POWER_LOSS => "I17",
        // Issue 14: the cluster world's epochs and fence (I2, I3 across machines), and the
        // outcome of a lost lease (I10).
        cluster::EPOCHS_INCREASE => "I2",
        // (`cluster::LOST_STOPS` is the signal model's `LEASE_LOST_STOPS`, I3 above.)
        cluster::NO_LOWER_AFTER_HIGHER | cluster::NEVER_REPLACED_BY_LOWER => "I3",
        cluster::LOST_ENDS_REFUSED => "I10",
        _ => "—",
    }
}

/// A mutant: a model with one deliberate bug and the property it must break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mutant {
    /// The model.
    pub model: Which,
    /// The mutation's name.
    pub name: &'static str,
    /// The property it must break.
    pub breaks: &'static str,
}

/// Every mutant of every model.
pub fn mutants() -> Vec<Mutant> {
    let mut v = Vec::new();
    for m in lease::Mutation::ALL {
        v.push(Mutant {
            model: Which::Lease,
            name: m.name(),
            breaks: m.breaks(),
        });
    }
    for m in signals::Mutation::ALL {
        v.push(Mutant {
            model: Which::Signals,
            name: m.name(),
            breaks: m.breaks(),
        });
    }
    v
}

/// A plausible bug planted in the real code of `src/` (`tenure::mutant::on(name)`), the model
/// that runs that code, and the property that must fail when it is planted: the rows of the
/// mutation table in models/README.md. A mutant counts only if a property is violated (an
/// `always` with a counterexample, or a `sometimes` with no example left), never because a
/// state count or a snapshot changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrcMutant {
    /// The name the code asks `tenure::mutant::on` about.
    pub name: &'static str,
    /// Where in `src/` the bug is planted.
    pub place: &'static str,
    /// What the bug does.
    pub what: &'static str,
    /// The model that runs the code.
    pub model: Which,
    /// The property it must break.
    pub breaks: &'static str,
}

/// Every mutant planted in `src/`, one block per area of the code.
pub fn src_mutants() -> Vec<SrcMutant> {
    let m = |name, place, what, model, breaks| SrcMutant {
        name,
        place,
        what,
        model,
        breaks,
    };
    use Which::{Checkpoint, Cluster, Lease, Signals};
    vec![
        // ---- the machine's rules (src/machine/rules.rs) and the driver core
        // (src/driver/core.rs), run by the signal model ----
        m(
            "publish-after-nonzero-exit",
            "src/machine/rules.rs `drain_stopping`",
            "a drain publishes whatever status the main process exited with",
            Signals,
            signals::PUBLISH_AFTER_CLEAN_EXIT,
        ),
        m(
            "publish-after-kill",
            "src/machine/rules.rs `drain_stopping`",
            "a drain publishes after the rest of the tree had to be SIGKILLed",
            Signals,
            signals::PUBLISH_AFTER_CLEAN_EXIT,
        ),
        m(
            "publish-after-watchdog",
            "src/machine/rules.rs `drain_stopping`",
            "a drain caused by a missed watchdog publishes what the workload staged",
            Signals,
            signals::PUBLISH_AFTER_CLEAN_EXIT,
        ),
        m(
            "no-forward-on-stop",
            "src/machine/rules.rs `Rules::stop_step`",
            "the stop step arms the grace without forwarding the stop signal",
            Signals,
            signals::STOP_FORWARDED_BEFORE_KILL,
        ),
        m(
            "drain-kills-at-once",
            "src/machine/rules.rs `Rules::enter_drain`",
            "a drain caused by a stop signal starts with SIGKILL",
            Signals,
            signals::STOP_FORWARDED_BEFORE_KILL,
        ),
        m(
            "release-then-publish",
            "src/machine/rules.rs `publish` (entry of publishing)",
            "the publish step releases the lease, then publishes, in one step",
            Signals,
            signals::CHECKPOINT_BEFORE_RELEASE,
        ),
        m(
            "stop-while-recovering-drains",
            "src/machine/rules.rs `recovering`, `awaiting`",
            "a stop while recovering drains (and may publish) instead of refusing",
            Signals,
            signals::STOP_RECOVERING_REFUSES,
        ),
        m(
            "refused-recovery-publishes",
            "src/machine/rules.rs `aborting`",
            "an abandoned recovery whose workload exited 0 publishes",
            Signals,
            signals::REFUSED_KEEPS_CURRENT,
        ),
        m(
            "stop-while-waiting-ignored",
            "src/machine/rules.rs `waiting`",
            "a stop while waiting for the lease is ignored",
            Signals,
            signals::STOP_COLD_CANCELS,
        ),
        m(
            "dropped-begin-drain",
            "src/machine/rules.rs `Rules::drain_prefix`",
            "a drain begins without `begin-drain` (the host's hook never runs)",
            Signals,
            signals::HOOK_BEFORE_DRAINING,
        ),
        m(
            "missed-disarm",
            "src/machine/rules.rs `drain_stopping`",
            "the grace timer stays armed once the stopped workload is gone",
            Signals,
            signals::LEGAL_EVENTS,
        ),
        m(
            "stray-not-relayed",
            "src/machine/rules.rs `ready`",
            "a ready owner ignores a stray signal instead of relaying it",
            Signals,
            signals::STRAY_RELAYED,
        ),
        m(
            "main-exit-ends-workload",
            "src/machine/rules.rs `ready`",
            "the main process's exit is taken for the end of its whole tree",
            Signals,
            signals::LEASE_OUTLIVES_WORKLOAD,
        ),
        m(
            "drain-releases-on-main-exit",
            "src/machine/rules.rs `drain_stopping`",
            "a drain releases when the main process exits, while its tree runs",
            Signals,
            signals::LEASE_OUTLIVES_WORKLOAD,
        ),
        m(
            "publish-after-lease-lost",
            "src/machine/rules.rs `drain_stopping`",
            "a drain whose lease was lost publishes what the killed workload staged",
            Signals,
            signals::LEASE_LOST_STOPS,
        ),
        m(
            "core-spawn-not-synchronous",
            "src/driver/core.rs `Core::admits`",
            "the driver feeds a signal while the spawn is outstanding",
            Signals,
            signals::LEGAL_EVENTS,
        ),
        m(
            "core-disarm-ignored",
            "src/driver/core.rs `Core::pop`",
            "`disarm-timer` leaves the timer armed",
            Signals,
            signals::LEGAL_EVENTS,
        ),
        m(
            "core-fired-timer-stays-armed",
            "src/driver/core.rs `Core::feed`",
            "a timer that fired stays armed (and fires again)",
            Signals,
            signals::LEGAL_EVENTS,
        ),
        m(
            "core-release-keeps-recovery",
            "src/driver/core.rs `Core::pop`",
            "a release leaves a running recovery outstanding (its answer comes after the release)",
            Signals,
            signals::LEGAL_EVENTS,
        ),
        // ---- the lease plans (src/lease/plan.rs) and the fence (src/lease/epoch.rs), run by
        // the lease model on the crash filesystem ----
        m(
            "lease-no-epoch-bump-on-takeover",
            "src/lease/plan.rs `AcquireSteps::compute`",
            "a takeover of a crashed owner continues its epoch instead of bumping it",
            Lease,
            lease::EPOCHS_INCREASE,
        ),
        m(
            "lease-epoch-file-only",
            "src/lease/plan.rs `AcquireSteps::compute`",
            "the next epoch is derived from the epoch file alone, not from every epoch the dir records (a rewound file repeats one)",
            Lease,
            lease::EPOCHS_INCREASE,
        ),
        m(
            "lease-epoch-not-synced",
            "src/lease/plan.rs `AcquireSteps` (after a new reservation's in-place write; for a new epoch file, after the owner record's rename)",
            "an epoch of a new reservation is handed out before the reservation's fdatasync (a new file: before the control folder's sync): a power loss takes the reservation back",
            Lease,
            lease::EPOCHS_INCREASE,
        ),
        m(
            "lease-epoch-slot-unchecked",
            "src/lease/epoch.rs `slot_value`, `v1_slot_value`",
            "an epoch slot is read without checking its checksum: a slot a power loss tore reads as garbage (here the largest epoch, and the dir cannot be acquired again)",
            Lease,
            lease::CLEAN_AFTER_POWER_LOSS,
        ),
        m(
            "lease-owner-slot-unchecked",
            "src/lease/record.rs `owner_payload`",
            "the owner record's slot, written in place without a sync, is read without checking its checksum: a slot a power loss tore is trusted, and its garbage refused as a corrupt record",
            Lease,
            lease::CLEAN_AFTER_POWER_LOSS,
        ),
        m(
            "lease-epoch-session-unchecked",
            "src/lease/epoch.rs `Batched::confirmed`",
            "the epoch file's scratch slot, written without a sync, is trusted after a power loss (another boot): it can name an epoch older than one already handed out, which is handed out again",
            Lease,
            lease::EPOCHS_INCREASE,
        ),
        m(
            "lease-epoch-data-unsynced",
            "src/lease/plan.rs `AcquireSteps` (after the epoch's temp file is written)",
            "the epoch file is renamed into place without its data synced: a power loss leaves it empty",
            Lease,
            lease::CLEAN_AFTER_POWER_LOSS,
        ),
        m(
            "lease-marker-not-synced",
            "src/lease/plan.rs `AcquireSteps` (after the marker's temp file is written)",
            "the identity marker is renamed into place with its data unsynced: a power loss can leave it empty, and the successor trusts it",
            Lease,
            lease::CLEAN_AFTER_POWER_LOSS,
        ),
        m(
            "lease-empty-record-refused",
            "src/lease/plan.rs `owner_from`",
            "an owner record a power loss emptied (it is never synced) is refused as corrupt",
            Lease,
            lease::CLEAN_AFTER_POWER_LOSS,
        ),
        m(
            "lease-marker-every-acquisition",
            "src/lease/plan.rs `AcquireSteps::compute`, `RenameMarker`",
            "every acquisition writes a fresh identity marker, replacing the dir's",
            Lease,
            lease::MARKER_WRITTEN_ONCE,
        ),
        m(
            "lease-waiter-left-on-cancel",
            "src/lease/plan.rs `AcquireSteps` (the wait's end)",
            "a cancelled waiter forgets to remove its waiter entry",
            Lease,
            lease::CANCEL_LEAVES_NOTHING,
        ),
        m(
            "lease-skip-leftovers",
            "src/lease/plan.rs `AcquireSteps::leftovers_to_end`",
            "a successor never ends what a crashed owner's recorded cgroup holds",
            Lease,
            lease::NO_OVERLAP,
        ),
        m(
            "lease-leftovers-after-record",
            "src/lease/plan.rs `AcquireSteps::ends_leftovers_now`",
            "a successor ends the crashed owner's cgroup only after replacing the record that names it (a crash in between loses it)",
            Lease,
            lease::NO_OVERLAP,
        ),
        // ---- the checkpoint store's plans (src/checkpoint/), run by the checkpoint model ----
        m(
            "current-rename-not-synced",
            "src/checkpoint/plan/publish.rs `PublishPlan::after_current_rename`",
            "the publish is acknowledged without the directory fsync after CURRENT's rename",
            Checkpoint,
            checkpoint::CURRENT_VALID_AFTER_CRASH,
        ),
        m(
            "manifest-dir-not-synced",
            "src/checkpoint/plan/publish.rs `PublishPlan` (SyncBlobs)",
            "the manifests' directory is not synced before CURRENT names the new manifest",
            Checkpoint,
            checkpoint::CURRENT_VALID_AFTER_CRASH,
        ),
        m(
            "batch-sync-skipped",
            "src/checkpoint/plan/publish.rs `PublishPlan::manifest_done`",
            "the one syncfs that makes the new blobs and the manifest durable is skipped",
            Checkpoint,
            checkpoint::CURRENT_VALID_AFTER_CRASH,
        ),
        m(
            "own-blob-fsync-skipped",
            "src/checkpoint/plan/publish.rs `PublishPlan` (ChmodBlob)",
            "a large blob counts as made durable by its own fsync, which never runs (the batch is then the manifest's fsync alone)",
            Checkpoint,
            checkpoint::CURRENT_VALID_AFTER_CRASH,
        ),
        m(
            "adopt-ignores-writer",
            "src/checkpoint/plan/publish.rs `PublishPlan` (AdoptSole)",
            "a staged file another process still holds open for writing is adopted as a blob all the same",
            Checkpoint,
            checkpoint::BLOBS_UNALTERED,
        ),
        m(
            "blobs-named-before-batch-sync",
            "src/checkpoint/plan/publish.rs `PublishPlan::manifest_done`",
            "the new blobs get their names in blobs/sha256/ before the batch makes their data durable",
            Checkpoint,
            checkpoint::CLEAN_AFTER_POWER_LOSS,
        ),
        m(
            "gc-before-current-sync",
            "src/checkpoint/plan/publish.rs `PublishPlan::after_current_rename`",
            "the GC runs before the directory fsync that makes the new CURRENT durable",
            Checkpoint,
            checkpoint::GC_KEEPS_CURRENT,
        ),
        m(
            "gc-deletes-current",
            "src/checkpoint/gc.rs `plan`",
            "the GC policy also deletes the manifest CURRENT names",
            Checkpoint,
            checkpoint::GC_KEEPS_CURRENT,
        ),
        m(
            "load-accepts-digest-mismatch",
            "src/checkpoint/plan/load.rs `check_blob`",
            "the load takes a blob of the right size whatever its digest",
            Checkpoint,
            checkpoint::CORRUPTION_REFUSED,
        ),
        m(
            "dedup-trusts-existing-blob",
            "src/checkpoint/plan/publish.rs `PublishPlan::existing`",
            "an existing blob of the right size is reused without reading it",
            Checkpoint,
            checkpoint::PUBLISHED_VALID,
        ),
        m(
            "fence-off-by-one",
            "src/checkpoint/plan/mod.rs `fence`, through the one fence src/lease/epoch.rs `fence`",
            "the fence lets an owner one epoch behind publish",
            Checkpoint,
            checkpoint::FENCED_PUBLISH,
        ),
        // ---- the cluster lease's transactions (src/cluster/mod.rs) and its epoch
        // (src/lease/mod.rs), run by the cluster world (models/tests/cluster_mutants.rs; the
        // third of `cluster::SRC_MUTANTS`, `publish-after-lease-lost`, is the signal model's
        // row above) ----
        m(
            "cluster-current-plain-put",
            "src/cluster/mod.rs `plan::move_current`",
            "CURRENT is written with a plain put, without the compare on the owner key",
            Cluster,
            cluster::NO_LOWER_AFTER_HIGHER,
        ),
        m(
            "cluster-epoch-local-counter",
            "src/lease/mod.rs `fenced_epoch`",
            "the epoch is taken from the local dir's counter instead of the cluster's revision",
            Cluster,
            cluster::EPOCHS_INCREASE,
        ),
    ]
}

/// Plants the `src/` mutant `name` (in this process, for the duration of the run) and runs its
/// model's CI configuration, stopping at the first counterexample to the property it must
/// break, then finds the shortest one.
pub fn run_src_mutant(mutant: SrcMutant) -> MutantReport {
    let _planted = tenure::mutant::scoped(mutant.name);
    let as_row = Mutant {
        model: mutant.model,
        name: mutant.name,
        breaks: mutant.breaks,
    };
    match mutant.model {
        Which::Lease => kill(LeaseModel::for_src_mutant(mutant.name), as_row),
        Which::Signals => kill(SignalModel::ci(), as_row),
        Which::Checkpoint => kill(CheckpointModel::ci(), as_row),
        Which::Cluster => kill(ClusterModel::ci(), as_row),
    }
}

/// Runs the catalogued `src/` mutant `name`, prints the shortest counterexample, and panics if
/// the mutant survives — the body of every `src/` mutant test (each binary of them plants one
/// mutant at a time).
pub fn assert_src_killed(name: &str) {
    let mutant = src_mutants()
        .into_iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("src mutant {name} is not catalogued"));
    let r = run_src_mutant(mutant);
    println!(
        "src mutant {} ({}) breaks `{}` ({}); shortest counterexample, {} steps:",
        mutant.name,
        mutant.place,
        mutant.breaks,
        invariant(mutant.breaks),
        r.length
    );
    for line in &r.path {
        println!("    {line}");
    }
    assert!(r.killed, "src mutant {} survived", mutant.name);
    assert!(r.length > 0 && !r.path.is_empty());
}

/// Which set a pinned configuration belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Set {
    /// Checked by every `cargo test` (and so by CI).
    Ci,
    /// Checked with `TENURE_LONG=1` (models/tests/long.rs).
    Long,
}

/// A model configuration whose unique state count is pinned in `models/counts.txt`.
#[derive(Debug, Clone, Copy)]
pub struct Pinned {
    /// The name in the counts file and on the command line.
    pub name: &'static str,
    /// The set it belongs to.
    pub set: Set,
    /// What is checked, in words.
    pub what: &'static str,
    /// Runs the complete search with this many checker threads (the unique count does not
    /// depend on them).
    pub run: fn(usize) -> Report,
}

/// The file the pinned counts live in.
pub const COUNTS_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/counts.txt");

/// The counts as last pinned (compiled in, so a re-pin rebuilds the tests).
const COUNTS: &str = include_str!("../counts.txt");

fn lease_fine(processes: usize) -> LeaseModel {
    let mut m = LeaseModel::ci(processes);
    m.atomic_steps = false;
    m.coarse = true;
    m.timers = true;
    m.recovery_failures = true;
    m
}

fn lease_tree(contain: lease::Contain, crashes: u8) -> LeaseModel {
    let mut m = LeaseModel::tree_ci(contain);
    m.crashes = crashes;
    m
}

/// The fine-grained world without the stopper and the external signal (they are checked at
/// the coarser grain of `lease-n2`): crashes between every rename, lock and cgroup operation.
fn lease_fine_quiet() -> LeaseModel {
    let mut m = lease_fine(2);
    m.stopper = false;
    m.signals = 0;
    m
}

/// Every configuration with a pinned count: the CI set, then the long set.
pub fn pinned() -> Vec<Pinned> {
    vec![
        Pinned {
            name: "lease-n2",
            set: Set::Ci,
            what: "lease, 2 processes, a crash, a restart, a signal, the stopper, BFS",
            run: |t| run::check(LeaseModel::ci(2), Search::Bfs, t, None, None),
        },
        Pinned {
            name: "lease-n2-fine-quiet",
            set: Set::Ci,
            what: "lease, 2 processes, every rename, lock and cgroup operation a step, timers, refusals, no stopper or signal, BFS",
            run: |t| run::check(lease_fine_quiet(), Search::Bfs, t, None, None),
        },
        Pinned {
            name: "lease-tree-cgroup",
            set: Set::Ci,
            what: "lease, tree world, cgroup containment, one crash, plans to the next lock operation in a step, BFS",
            run: |t| {
                let m = LeaseModel::tree_small(lease::Contain::Cgroup);
                run::check(m, Search::Bfs, t, None, None)
            },
        },
        Pinned {
            name: "lease-tree-lock-fd",
            set: Set::Ci,
            what: "lease, tree world, inherited lock descriptor, one crash, plans to the next lock operation in a step, BFS",
            run: |t| {
                let m = LeaseModel::tree_small(lease::Contain::LockFd);
                run::check(m, Search::Bfs, t, None, None)
            },
        },
        Pinned {
            name: "lease-power",
            set: Set::Ci,
            what: "lease, runs in one pid slot, two restarts, one power loss at any point, BFS",
            run: |t| run::check(LeaseModel::power_ci(), Search::Bfs, t, None, None),
        },
        Pinned {
            name: "signals",
            set: Set::Ci,
            what: "signals, two signals, three workloads, BFS",
            run: |t| run::check(SignalModel::ci(), Search::Bfs, t, None, None),
        },
        Pinned {
            name: "checkpoint",
            set: Set::Ci,
            what: "checkpoint (real store plans), 2 runs, 1 crash, 1 power loss (ordered), 1 corruption, 1 takeover, BFS",
            run: |t| run::check(CheckpointModel::ci(), Search::Bfs, t, None, None),
        },
        Pinned {
            name: "cluster",
            set: Set::Ci,
            what: "cluster lease (issue 14), 2 runners, real claim/move/release transactions, 2 faults (TTL expiry, pause, partition, keep-alive loss), 1 SIGTERM, BFS",
            run: |t| run::check(ClusterModel::ci(), Search::Bfs, t, None, None),
        },
        Pinned {
            name: "lease-n2-fine",
            set: Set::Long,
            what: "lease, 2 processes, every rename, lock and cgroup operation a step, timers, refusals, BFS",
            run: |t| run::check(lease_fine(2), Search::Bfs, t, None, None),
        },
        Pinned {
            name: "lease-tree-cgroup-two-crashes",
            set: Set::Long,
            what: "lease, tree world, cgroup containment, two crashes, BFS",
            run: |t| {
                run::check(
                    lease_tree(lease::Contain::Cgroup, 2),
                    Search::Bfs,
                    t,
                    None,
                    None,
                )
            },
        },
        Pinned {
            name: "lease-tree-lock-fd-two-crashes",
            set: Set::Long,
            what: "lease, tree world, inherited lock descriptor, two crashes, BFS",
            run: |t| {
                run::check(
                    lease_tree(lease::Contain::LockFd, 2),
                    Search::Bfs,
                    t,
                    None,
                    None,
                )
            },
        },
        Pinned {
            name: "signals-three-signals",
            set: Set::Long,
            what: "signals, three signals, BFS",
            run: |t| {
                let mut m = SignalModel::ci();
                m.signals = 3;
                run::check(m, Search::Bfs, t, None, None)
            },
        },
        Pinned {
            name: "checkpoint-three-runs",
            set: Set::Long,
            what: "checkpoint, 3 runs, keep 1 and 2, 1 crash, 1 power loss (ordered), 1 corruption, 1 takeover, BFS",
            run: |t| run::check(CheckpointModel::three_runs(), Search::Bfs, t, None, None),
        },
        Pinned {
            name: "checkpoint-any-subset",
            set: Set::Long,
            what: "checkpoint, 2 runs, power loss keeps any subset of the entry operations, BFS",
            run: |t| run::check(CheckpointModel::any_subset(), Search::Bfs, t, None, None),
        },
    ]
}

/// Reads a counts file: one `name count` per line; `#` starts a comment.
pub fn parse_counts(text: &str) -> Result<Vec<(String, usize)>, String> {
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(name), Some(count), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "line {}: expected `name count`, found {line:?}",
                i + 1
            ));
        };
        let count = count
            .replace('_', "")
            .parse()
            .map_err(|_| format!("line {}: {count:?} is not a count", i + 1))?;
        v.push((name.to_string(), count));
    }
    Ok(v)
}

/// The pinned count of the configuration `name`.
pub fn pinned_count(name: &str) -> Option<usize> {
    parse_counts(COUNTS)
        .expect("models/counts.txt is written by `tenure-models pin`")
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, c)| c)
}

/// Writes the counts file for `counts` (in the order of [`pinned`]).
pub fn render_counts(counts: &[(String, usize)]) -> String {
    let mut out = String::from(
        "# Unique state counts of the models' pinned configurations (models/src/catalog.rs).\n\
         # Written by `cargo run -p tenure-models --release -- pin` (`--long` for the long set);\n\
         # checked by the tests. Re-pin after an intended change of a model and say why in\n\
         # models/README.md.\n",
    );
    for p in pinned() {
        if let Some((_, c)) = counts.iter().find(|(n, _)| n == p.name) {
            out.push_str(&format!("{} {c}\n", p.name));
        }
    }
    out
}

/// Runs the pinned configuration `name` (complete search), asserts that every property holds
/// and that the unique state count is the pinned one — the body of every pinned-count test.
pub fn check_pinned(name: &str) -> Report {
    let p = pinned()
        .into_iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no pinned configuration {name}"));
    let threads = match p.set {
        Set::Ci => 1,
        Set::Long => 2,
    };
    let r = (p.run)(threads);
    print!("{} ({}):\n{r}", p.name, p.what);
    assert!(r.all_hold(), "{name}: a property does not hold:\n{r}");
    let pinned = pinned_count(name).unwrap_or_else(|| {
        panic!("{name} has no pinned count; run `cargo run -p tenure-models --release -- pin`")
    });
    assert_eq!(
        r.unique,
        pinned,
        "{name}: {} unique states, {pinned} pinned; if the model changed on purpose, re-pin with \
         `cargo run -p tenure-models --release -- pin{}` and say why in models/README.md",
        r.unique,
        if p.set == Set::Long { " --long" } else { "" }
    );
    r
}

/// The lease model checked in CI with `processes` slots.
pub fn lease_ci(processes: usize) -> LeaseModel {
    LeaseModel::ci(processes)
}

/// What running a mutant found.
#[derive(Debug, Clone)]
pub struct MutantReport {
    /// The mutant.
    pub mutant: Mutant,
    /// Whether the checker found a counterexample to the property.
    pub killed: bool,
    /// Distinct states the search generated before it stopped.
    pub unique: usize,
    /// The shortest counterexample, told in words (one line per step).
    pub path: Vec<String>,
    /// Steps in the shortest counterexample.
    pub length: usize,
    /// Time for the search.
    pub elapsed: Duration,
}

fn kill<M>(model: M, mutant: Mutant) -> MutantReport
where
    M: Describe + Clone + Send + Sync + 'static,
    M::State: Hash + Eq + Send + Sync + Clone + fmt::Debug + 'static,
    M::Action: Clone + PartialEq + fmt::Debug,
{
    let started = Instant::now();
    let property = model.property(mutant.breaks);
    // One breadth-first search that checks the property the mutant must break on every state
    // it generates and stops at the first counterexample: it proves the kill (a VIOLATED
    // `always`, by that property) and is the shortest counterexample at once. A `sometimes`
    // is broken when no state has its example: that takes the complete search.
    let (killed, path, length, unique) = match property.expectation {
        Expectation::Always => {
            let (path, unique) =
                run::search(&model, 20_000_000, |s| !(property.condition)(&model, s));
            match path {
                Some(p) => (true, model.describe(&p), p.len() - 1, unique),
                None => (false, Vec::new(), 0, unique),
            }
        }
        Expectation::Sometimes => {
            let (example, unique) =
                run::search(&model, usize::MAX, |s| (property.condition)(&model, s));
            (example.is_none(), Vec::new(), 0, unique)
        }
        Expectation::Eventually => panic!(
            "mutant {} is killed by the eventually property {}, which a search cannot show",
            mutant.name, mutant.breaks
        ),
    };
    MutantReport {
        mutant,
        killed,
        unique,
        path,
        length,
        elapsed: started.elapsed(),
    }
}

/// Runs the catalogued mutant `name` of `model` (at 3 processes for the lease model), prints
/// the shortest counterexample, and panics if the mutant survives — the body of every mutant
/// test.
pub fn assert_killed(model: Which, name: &str) {
    let mutant = mutants()
        .into_iter()
        .find(|m| m.model == model && m.name == name)
        .unwrap_or_else(|| panic!("mutant {name} is not catalogued"));
    let r = run_mutant(mutant, 3);
    println!(
        "mutant {} breaks `{}` ({}); shortest counterexample, {} steps:",
        mutant.name,
        mutant.breaks,
        invariant(mutant.breaks),
        r.length
    );
    for line in &r.path {
        println!("    {line}");
    }
    assert!(r.killed, "mutant {} survived", mutant.name);
    assert!(r.length > 0 && !r.path.is_empty());
}

/// Runs a mutant on its model's CI configuration (the lease model with `processes` slots).
pub fn run_mutant(mutant: Mutant, processes: usize) -> MutantReport {
    match mutant.model {
        Which::Lease => {
            let m = lease::Mutation::from_name(mutant.name);
            // The tree mutants live in the tree world (cgroup containment).
            let model = if m.is_some_and(lease::Mutation::needs_tree) {
                LeaseModel::tree_ci(lease::Contain::Cgroup)
            } else {
                lease_ci(processes)
            };
            kill(model.with_mutation(m), mutant)
        }
        Which::Signals => kill(
            SignalModel::ci().with_mutation(signals::Mutation::from_name(mutant.name)),
            mutant,
        ),
        // The checkpoint model runs the store's real plans: its mutants are all planted in
        // `src/` (`src_mutants`); so are the cluster world's.
        Which::Checkpoint => kill(CheckpointModel::ci(), mutant),
        Which::Cluster => kill(ClusterModel::ci(), mutant),
    }
}

/// Checks a model's CI configuration (the lease model with `processes` slots, with symmetry
/// reduction if asked).
pub fn check_ci(which: Which, processes: usize, search: Search, threads: usize) -> Report {
    match which {
        Which::Lease => run::check(
            lease_ci(processes),
            search,
            threads,
            Some(<LeaseState as Representative>::representative),
            None,
        ),
        Which::Signals => run::check(SignalModel::ci(), plain(search), threads, None, None),
        Which::Checkpoint => run::check(CheckpointModel::ci(), plain(search), threads, None, None),
        Which::Cluster => run::check(ClusterModel::ci(), plain(search), threads, None, None),
    }
}

/// Symmetry reduction applies to the lease model only (its pid slots are interchangeable).
fn plain(search: Search) -> Search {
    match search {
        Search::DfsSymmetry => Search::Dfs,
        Search::Bfs | Search::Dfs => search,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateright::Model;

    /// The counts file pins exactly the catalogued configurations, in the form `pin` writes it:
    /// no stale name, no configuration without a count, no hand-made layout.
    #[test]
    fn counts_file_is_what_pin_writes() {
        let counts = parse_counts(COUNTS).expect("counts.txt parses");
        let mut names: Vec<&str> = counts.iter().map(|(n, _)| n.as_str()).collect();
        let mut want: Vec<&str> = pinned().iter().map(|p| p.name).collect();
        names.sort_unstable();
        want.sort_unstable();
        assert_eq!(names, want);
        assert_eq!(render_counts(&counts), COUNTS);
    }

    #[test]
    fn counts_parse_errors_name_the_line() {
        assert_eq!(
            parse_counts("# c\nsignals 1_000\n").unwrap(),
            [("signals".to_string(), 1000)]
        );
        assert!(parse_counts("a\n").unwrap_err().starts_with("line 1"));
        assert!(parse_counts("\na x\n").unwrap_err().starts_with("line 2"));
    }

    /// Every `src/` mutant names a property its model has.
    #[test]
    fn src_mutants_name_real_properties() {
        for m in src_mutants() {
            let names: Vec<&str> = match m.model {
                Which::Lease => LeaseModel::for_src_mutant(m.name)
                    .properties()
                    .iter()
                    .map(|p| p.name)
                    .collect(),
                Which::Signals => SignalModel::ci()
                    .properties()
                    .iter()
                    .map(|p| p.name)
                    .collect(),
                Which::Checkpoint => CheckpointModel::ci()
                    .properties()
                    .iter()
                    .map(|p| p.name)
                    .collect(),
                Which::Cluster => ClusterModel::ci()
                    .properties()
                    .iter()
                    .map(|p| p.name)
                    .collect(),
            };
            assert!(
                names.contains(&m.breaks),
                "{}: no property {}",
                m.name,
                m.breaks
            );
        }
    }
}
