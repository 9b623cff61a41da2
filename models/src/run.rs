//! Running a model's checker and reporting what it found: states, depth, time, and a verdict
//! per property with the path of every discovery. Used by the CLI and by the tests.

use stateright::{Checker, Expectation, HasDiscoveries, Model};
use std::collections::BTreeSet;
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A model whose discovery paths can be told in words.
pub trait Describe: Model {
    /// One line per step of `path` (state before, action taken).
    fn describe(&self, path: &[(Self::State, Option<Self::Action>)]) -> Vec<String>;
}

/// A symmetry-reduction function: the representative of a state's orbit.
pub type RepresentativeFn<S> = fn(&S) -> S;

/// How the state space is searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Search {
    /// Breadth-first: shortest counterexamples.
    Bfs,
    /// Depth-first.
    Dfs,
    /// Depth-first with symmetry reduction through this representative function.
    DfsSymmetry,
}

/// What the checker found for one property.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The property's name.
    pub name: &'static str,
    /// `always`, `sometimes` or `eventually`.
    pub expectation: Expectation,
    /// The discovery's path, told in words, if there was one.
    pub path: Option<Vec<String>>,
}

impl Verdict {
    /// Whether the property holds: no counterexample for `always`/`eventually`, an example for
    /// `sometimes`.
    pub fn holds(&self) -> bool {
        match self.expectation {
            Expectation::Always | Expectation::Eventually => self.path.is_none(),
            Expectation::Sometimes => self.path.is_some(),
        }
    }

    fn kind(&self) -> &'static str {
        match self.expectation {
            Expectation::Always => "always",
            Expectation::Eventually => "eventually",
            Expectation::Sometimes => "sometimes",
        }
    }
}

/// The outcome of one checker run.
#[derive(Debug, Clone)]
pub struct Report {
    /// States generated (with repetitions).
    pub states: usize,
    /// Distinct states (representatives under symmetry).
    pub unique: usize,
    /// The deepest path explored.
    pub max_depth: usize,
    /// Wall-clock time of the search.
    pub elapsed: Duration,
    /// Whether the search ran to completion (false when it stopped at a wanted discovery).
    pub complete: bool,
    /// One verdict per property, in the model's order.
    pub verdicts: Vec<Verdict>,
}

impl Report {
    /// States generated per second.
    pub fn states_per_second(&self) -> f64 {
        self.states as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Whether every property holds.
    pub fn all_hold(&self) -> bool {
        self.verdicts.iter().all(Verdict::holds)
    }

    /// The verdict of a property.
    pub fn verdict(&self, name: &str) -> Option<&Verdict> {
        self.verdicts.iter().find(|v| v.name == name)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "states explored {}, unique {}, max depth {}, time {:.2?}, {:.0} states/s{}",
            self.states,
            self.unique,
            self.max_depth,
            self.elapsed,
            self.states_per_second(),
            if self.complete {
                ""
            } else {
                " (stopped at the first wanted discovery)"
            }
        )?;
        for v in &self.verdicts {
            let verdict = match (v.holds(), &v.path) {
                (true, None) => "holds".to_string(),
                (true, Some(p)) => format!("example found ({} steps)", p.len()),
                (false, Some(p)) => format!("VIOLATED ({} steps)", p.len()),
                (false, None) if self.complete => "NO EXAMPLE: vacuous".to_string(),
                (false, None) => "not reached (search stopped early)".to_string(),
            };
            writeln!(f, "  {:<10} {:<32} {verdict}", v.kind(), v.name)?;
        }
        Ok(())
    }
}

/// Checks `model` with `threads` threads. With `stop_at`, the search ends as soon as that
/// property has a discovery (the counts are then partial).
pub fn check<M>(
    model: M,
    search: Search,
    threads: usize,
    representative: Option<RepresentativeFn<M::State>>,
    stop_at: Option<&'static str>,
) -> Report
where
    M: Describe + Clone + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + fmt::Debug + 'static,
    M::Action: Clone + PartialEq + fmt::Debug,
{
    let properties = model.properties();
    let mut builder = model.clone().checker().threads(threads.max(1));
    if let Some(name) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])));
    }
    let started = Instant::now();
    match search {
        Search::Bfs => summarise(
            &model,
            &properties,
            builder.spawn_bfs().join(),
            started,
            stop_at,
        ),
        Search::Dfs => summarise(
            &model,
            &properties,
            builder.spawn_dfs().join(),
            started,
            stop_at,
        ),
        Search::DfsSymmetry => {
            let rep = representative.expect("symmetry needs a representative function");
            let checker = builder.symmetry_fn(rep).spawn_dfs().join();
            summarise(&model, &properties, checker, started, stop_at)
        }
    }
}

fn summarise<M, C>(
    model: &M,
    properties: &[stateright::Property<M>],
    checker: C,
    started: Instant,
    stop_at: Option<&'static str>,
) -> Report
where
    M: Describe,
    M::State: Clone + PartialEq,
    M::Action: Clone + PartialEq,
    C: Checker<M>,
{
    let elapsed = started.elapsed();
    let verdicts = properties
        .iter()
        .map(|p| Verdict {
            name: p.name,
            expectation: p.expectation.clone(),
            path: checker
                .discovery(p.name)
                .map(|path| model.describe(&path.into_vec())),
        })
        .collect();
    Report {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        complete: stop_at.is_none(),
        verdicts,
    }
}

/// Breadth-first search for the shortest path from an initial state to a state where `found`
/// holds, exploring at most `limit` distinct states. Used for minimal counterexamples: the
/// checker's own discovery may be longer, as it keeps the last path it saw.
#[allow(clippy::type_complexity)]
pub fn shortest<M>(
    model: &M,
    limit: usize,
    found: impl Fn(&M::State) -> bool,
) -> Option<Vec<(M::State, Option<M::Action>)>>
where
    M: Model,
    M::State: Hash + Eq + Clone,
    M::Action: Clone,
{
    use std::collections::{HashMap, VecDeque};
    let mut parent: HashMap<M::State, Option<(M::State, M::Action)>> = HashMap::new();
    let mut queue = VecDeque::new();
    for s in model.init_states() {
        if parent.insert(s.clone(), None).is_none() {
            queue.push_back(s);
        }
    }
    let mut actions = Vec::new();
    while let Some(s) = queue.pop_front() {
        if found(&s) {
            let mut path = vec![(s.clone(), None)];
            let mut at = s;
            while let Some(Some((prev, a))) = parent.get(&at) {
                path.push((prev.clone(), Some(a.clone())));
                at = prev.clone();
            }
            // Each entry pairs a state with the action taken from it, as stateright's paths do.
            path.reverse();
            return Some(path);
        }
        if parent.len() >= limit {
            continue;
        }
        model.actions(&s, &mut actions);
        for a in actions.drain(..) {
            if let Some(n) = model.next_state(&s, a.clone())
                && !parent.contains_key(&n)
            {
                parent.insert(n.clone(), Some((s.clone(), a)));
                queue.push_back(n);
            }
        }
    }
    None
}
