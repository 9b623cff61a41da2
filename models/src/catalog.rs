//! The catalogue of models, their CI configurations, their properties' invariant ids and their
//! mutants, so the CLI, the tests and the README table come from one list.

use crate::checkpoint::{self, CheckpointModel};
use crate::lease::{self, LeaseModel, LeaseState};
use crate::run::{self, Describe, Report, Search};
use crate::signals::{self, SignalModel};
use stateright::Representative;
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
}

impl Which {
    /// Every model.
    pub const ALL: [Which; 3] = [Which::Lease, Which::Signals, Which::Checkpoint];

    /// The name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Which::Lease => "lease",
            Which::Signals => "signals",
            Which::Checkpoint => "checkpoint",
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
        signals::LEASE_OUTLIVES_WORKLOAD => "I7",
        signals::TERM_BEFORE_KILL | signals::STRAYS_SURVIVED => "I16",
        signals::CHECKPOINT_BEFORE_RELEASE => "I8",
        signals::REFUSED_KEEPS_CURRENT => "I9",
        signals::ONE_OUTCOME | signals::EXIT_CODE_PER_SPEC => "I10",
        signals::DRAIN_ONCE => "I11",
        checkpoint::CURRENT_VALID_AFTER_CRASH => "I12",
        checkpoint::GC_KEEPS_CURRENT => "I13",
        checkpoint::NO_REPAIR | checkpoint::CORRUPTION_REFUSED => "I14",
        checkpoint::FENCED_PUBLISH => "I3",
        checkpoint::CLEAN_AFTER_POWER_LOSS => "I17",
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
    for m in checkpoint::Mutation::ALL {
        v.push(Mutant {
            model: Which::Checkpoint,
            name: m.name(),
            breaks: m.breaks(),
        });
    }
    v
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
    /// Distinct states the checker visited before it stopped.
    pub unique: usize,
    /// The shortest counterexample, told in words (one line per step).
    pub path: Vec<String>,
    /// Steps in the shortest counterexample.
    pub length: usize,
    /// Time for both searches.
    pub elapsed: Duration,
}

fn kill<M>(model: M, mutant: Mutant) -> MutantReport
where
    M: Describe + Clone + Send + Sync + 'static,
    M::State: Hash + Eq + Send + Sync + Clone + fmt::Debug + 'static,
    M::Action: Clone + PartialEq + fmt::Debug,
{
    let started = Instant::now();
    let report = run::check(model.clone(), Search::Bfs, 1, None, Some(mutant.breaks));
    let killed = report.verdict(mutant.breaks).is_some_and(|v| !v.holds());
    let property = model.property(mutant.breaks);
    let (path, length) =
        match run::shortest(&model, 20_000_000, |s| !(property.condition)(&model, s)) {
            Some(p) => (model.describe(&p), p.len() - 1),
            None => (Vec::new(), 0),
        };
    MutantReport {
        mutant,
        killed,
        unique: report.unique,
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
        Which::Checkpoint => {
            // The checkpoint model's mutants are bugs planted in the store's real code, for
            // as long as the checker runs.
            let m = checkpoint::Mutation::from_name(mutant.name);
            let _planted = m.map(checkpoint::Mutation::plant);
            kill(CheckpointModel::ci().with_mutation(m), mutant)
        }
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
    }
}

/// Symmetry reduction applies to the lease model only (its pid slots are interchangeable).
fn plain(search: Search) -> Search {
    match search {
        Search::DfsSymmetry => Search::Dfs,
        Search::Bfs | Search::Dfs => search,
    }
}
