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

/// A fingerprint of a state: a fixed-key 64-bit hash (as stateright's checker keeps).
pub fn fingerprint<T: Hash>(value: &T) -> u64 {
    // Fixed seeds: the same value has the same fingerprint in every run and every thread.
    ahash::RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    )
    .hash_one(value)
}

/// A `u64` fingerprint is its own hash.
#[derive(Default)]
pub struct IdHasher(u64);

/// Hash tables keyed by fingerprints (which are hashes already).
pub type BuildFingerprint = std::hash::BuildHasherDefault<IdHasher>;

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// Breadth-first search for the shortest path from an initial state to a state where `found`
/// holds, exploring at most `limit` distinct states. Used for minimal counterexamples: the
/// checker's own discovery may be longer, as it keeps the last path it saw.
///
/// `found` is checked on every state as it is generated, so the search stops at the first
/// state where it holds: every state of a smaller depth was generated (and checked) before,
/// so the path is a shortest one (and, as states are expanded in the order they were
/// generated, the first of the shortest in that order). The search keeps a fingerprint and
/// the way back (parent, action index) per state and the states of the frontier only; the
/// path is rebuilt by replaying its actions.
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
    search(model, limit, found).0
}

/// [`shortest`], and the number of distinct states the search generated.
#[allow(clippy::type_complexity)]
pub fn search<M>(
    model: &M,
    limit: usize,
    found: impl Fn(&M::State) -> bool,
) -> (Option<Vec<(M::State, Option<M::Action>)>>, usize)
where
    M: Model,
    M::State: Hash + Eq + Clone,
    M::Action: Clone,
{
    use std::collections::{HashSet, VecDeque};
    const ROOT: u32 = u32::MAX;
    let mut seen: HashSet<u64, std::hash::BuildHasherDefault<IdHasher>> = HashSet::default();
    // Per state: its parent's index (`ROOT` for an initial state) and the index of the action
    // that led to it (of the initial state, for an initial state).
    let mut back: Vec<(u32, u32)> = Vec::new();
    let mut queue: VecDeque<(M::State, u32)> = VecDeque::new();
    for (i, s) in model.init_states().into_iter().enumerate() {
        if seen.insert(fingerprint(&s)) {
            let at = back.len() as u32;
            back.push((ROOT, i as u32));
            if found(&s) {
                return (Some(replay(model, &back, at)), seen.len());
            }
            queue.push_back((s, at));
        }
    }
    let mut actions = Vec::new();
    while let Some((s, at)) = queue.pop_front() {
        if seen.len() >= limit {
            continue;
        }
        model.actions(&s, &mut actions);
        for (k, a) in actions.drain(..).enumerate() {
            if let Some(n) = model.next_state(&s, a)
                && seen.insert(fingerprint(&n))
            {
                let next = back.len() as u32;
                back.push((at, k as u32));
                if found(&n) {
                    return (Some(replay(model, &back, next)), seen.len());
                }
                queue.push_back((n, next));
            }
        }
    }
    (None, seen.len())
}

/// The path to state `at` of a [`shortest`] search, rebuilt by replaying its actions.
#[allow(clippy::type_complexity)]
fn replay<M>(model: &M, back: &[(u32, u32)], at: u32) -> Vec<(M::State, Option<M::Action>)>
where
    M: Model,
    M::State: Clone,
    M::Action: Clone,
{
    let mut steps = Vec::new();
    let mut i = at;
    while back[i as usize].0 != u32::MAX {
        steps.push(back[i as usize].1 as usize);
        i = back[i as usize].0;
    }
    steps.reverse();
    let mut state = model.init_states()[back[i as usize].1 as usize].clone();
    let mut path = Vec::with_capacity(steps.len() + 1);
    let mut actions = Vec::new();
    for k in steps {
        model.actions(&state, &mut actions);
        let a = actions.swap_remove(k);
        actions.clear();
        let next = model
            .next_state(&state, a.clone())
            .expect("a replayed action has a successor");
        path.push((state, Some(a)));
        state = next;
    }
    path.push((state, None));
    path
}
