//! `tenure-models`: checks the stateright models of the tenure lifecycle, runs their mutants,
//! replays traces of real runs, and prints the benchmark numbers.
//!
//! ```text
//! tenure-models check [lease|signals|checkpoint|all] [--processes N] [--symmetry] [--dfs]
//!                     [--threads T] [--mutant NAME] [--explore ADDR] [--paths]
//! tenure-models check lease --tree cgroup|lock-fd [--close-fd] [--threads T] [--paths]
//! tenure-models mutants [lease|signals|checkpoint|all] [--processes N]
//! tenure-models trace FILE...
//! tenure-models pin [--long] [--threads T]
//! tenure-models bench [--long] [--only NAME]... [--no-mutants]
//! ```
//! `check --paths` also prints the path of every discovery, told in words (to compare two
//! builds' counterexamples line by line).
//! `pin` runs the pinned configurations (the CI set; with `--long` the long set too), checks
//! that every property holds, and rewrites models/counts.txt with their unique state counts:
//! the one way the counts the tests compare against are made.
//! Exit codes: 0 when every check passed (every property holds, every mutant is killed, every
//! trace conforms), 1 when one did not, 64 for a usage error.

use stateright::Model;
use std::process::ExitCode;
use std::time::Instant;
use tenure_models::catalog::{self, Which};
use tenure_models::checkpoint::CheckpointModel;
use tenure_models::lease::{Contain, LeaseModel};
use tenure_models::run::{self, Report, Search};
use tenure_models::signals::SignalModel;

/// The allocator of the checker binary (see models/Cargo.toml): mimalloc, through its plain
/// entry points for the alignments every block of it has (`mimalloc::MiMalloc` always takes
/// the aligned ones, which check the alignment on every call and fall back to a slower path
/// for some sizes), and through the aligned ones otherwise.
struct Alloc;

/// An alignment every mimalloc block has (blocks are multiples of the word and word-aligned).
const PLAIN_ALIGN: usize = std::mem::size_of::<usize>();

// SAFETY: every block comes from mimalloc, with at least the layout's alignment (the plain
// entry points return word-aligned blocks, asked for only up to that alignment) and size; it
// is freed and resized by mimalloc.
unsafe impl std::alloc::GlobalAlloc for Alloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: plain C allocation calls; mimalloc returns null on failure.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                libmimalloc_sys::mi_malloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                libmimalloc_sys::mi_zalloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                libmimalloc_sys::mi_realloc(ptr.cast(), new_size).cast()
            } else {
                libmimalloc_sys::mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
            }
        }
    }
}

#[global_allocator]
static ALLOC: Alloc = Alloc;

const USAGE: &str = "usage:
  tenure-models check [lease|signals|checkpoint|all] [--processes N] [--symmetry] [--dfs]
                      [--threads T] [--mutant NAME] [--explore ADDR] [--paths]
  tenure-models check lease --tree cgroup|lock-fd [--close-fd] [--threads T] [--paths]
  tenure-models mutants [lease|signals|checkpoint|all] [--processes N]
  tenure-models trace FILE...
  tenure-models pin [--long] [--threads T]
  tenure-models bench [--long] [--only NAME]... [--no-mutants]";

/// A command line that cannot be run.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\n{USAGE}", self.0)
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tenure-models: {e}");
            ExitCode::from(64)
        }
    }
}

#[derive(Debug, Default)]
struct Opts {
    models: Vec<Which>,
    processes: Option<usize>,
    symmetry: bool,
    dfs: bool,
    threads: usize,
    mutant: Option<String>,
    explore: Option<String>,
    long: bool,
    files: Vec<String>,
    tree: Option<Contain>,
    close_fd: bool,
    only: Vec<String>,
    no_mutants: bool,
    paths: bool,
}

fn parse(args: &[String]) -> Result<Opts, Usage> {
    let mut o = Opts {
        threads: 1,
        ..Opts::default()
    };
    let mut it = args.iter();
    let value = |it: &mut std::slice::Iter<'_, String>, flag: &str| {
        it.next()
            .cloned()
            .ok_or_else(|| Usage(format!("{flag} needs a value")))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--processes" => {
                let v = value(&mut it, a)?;
                let n: usize = v
                    .parse()
                    .map_err(|_| Usage(format!("--processes takes a number, not {v:?}")))?;
                if !(1..=6).contains(&n) {
                    return Err(Usage(format!("--processes must be 1 to 6, not {n}")));
                }
                o.processes = Some(n);
            }
            "--threads" => {
                let v = value(&mut it, a)?;
                o.threads = v
                    .parse()
                    .map_err(|_| Usage(format!("--threads takes a number, not {v:?}")))?;
            }
            "--symmetry" => o.symmetry = true,
            "--dfs" => o.dfs = true,
            "--long" => o.long = true,
            "--mutant" => o.mutant = Some(value(&mut it, a)?),
            "--tree" => {
                o.tree = Some(match value(&mut it, a)?.as_str() {
                    "cgroup" => Contain::Cgroup,
                    "lock-fd" => Contain::LockFd,
                    v => {
                        return Err(Usage(format!(
                            "--tree takes `cgroup` or `lock-fd`, not {v:?}"
                        )));
                    }
                })
            }
            "--close-fd" => o.close_fd = true,
            "--only" => o.only.push(value(&mut it, a)?),
            "--no-mutants" => o.no_mutants = true,
            "--paths" => o.paths = true,
            "--explore" => o.explore = Some(value(&mut it, a)?),
            "all" => o.models.extend(Which::ALL),
            s if s.starts_with("--") => return Err(Usage(format!("unknown option {s}"))),
            s => match Which::from_name(s) {
                Some(w) => o.models.push(w),
                None => o.files.push(s.to_string()),
            },
        }
    }
    Ok(o)
}

fn run() -> Result<ExitCode, Usage> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        return Err(Usage("no command".into()));
    };
    let mut o = parse(rest)?;
    match cmd.as_str() {
        "check" => {
            if !o.files.is_empty() {
                return Err(Usage(format!("unknown model {:?}", o.files[0])));
            }
            if o.models.is_empty() {
                o.models.extend(Which::ALL);
            }
            check(&o)
        }
        "mutants" => {
            if o.models.is_empty() {
                o.models.extend(Which::ALL);
            }
            Ok(mutants(&o))
        }
        "trace" => {
            if o.files.is_empty() {
                return Err(Usage("trace needs a file".into()));
            }
            Ok(traces(&o.files))
        }
        "bench" => bench(&o),
        "pin" => {
            if let Some(f) = o.files.first() {
                return Err(Usage(format!("pin takes no argument {f:?}")));
            }
            Ok(pin(o.long, o.threads))
        }
        other => Err(Usage(format!("unknown command {other:?}"))),
    }
}

fn check(o: &Opts) -> Result<ExitCode, Usage> {
    let processes = o.processes.unwrap_or(3);
    if let Some(addr) = &o.explore {
        let [which] = o.models[..] else {
            return Err(Usage("--explore serves one model".into()));
        };
        println!("serving the {which} model's explorer on http://{addr}");
        match which {
            Which::Lease => {
                LeaseModel::ci(processes).checker().serve(addr.as_str());
            }
            Which::Signals => {
                SignalModel::ci().checker().serve(addr.as_str());
            }
            Which::Checkpoint => {
                CheckpointModel::ci().checker().serve(addr.as_str());
            }
            Which::Cluster => {
                tenure_models::cluster::ClusterModel::ci()
                    .checker()
                    .serve(addr.as_str());
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(name) = &o.mutant {
        // A mutant of the model's world, or a bug planted in src/ that the model runs.
        let world = catalog::mutants()
            .into_iter()
            .find(|m| m.name == name && o.models.contains(&m.model));
        let src = catalog::src_mutants()
            .into_iter()
            .find(|m| m.name == name && o.models.contains(&m.model));
        let r = match (world, src) {
            (Some(m), _) => catalog::run_mutant(m, processes),
            (None, Some(m)) => catalog::run_src_mutant(m),
            (None, None) => {
                return Err(Usage(format!(
                    "no mutant {name:?} in {:?}; `tenure-models mutants` lists them",
                    o.models
                )));
            }
        };
        print_mutant(&r, true);
        return Ok(if r.killed {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if let Some(contain) = o.tree {
        if o.models != [Which::Lease] {
            return Err(Usage("--tree is an option of `check lease`".into()));
        }
        let mut m = LeaseModel::tree_ci(contain);
        if let Some(t) = m.tree.as_mut() {
            t.close_fd = o.close_fd;
        }
        println!(
            "== lease, tree world ({contain:?}{}), Bfs, {} thread(s)",
            if o.close_fd {
                ", descendants close fds"
            } else {
                ""
            },
            o.threads.max(1)
        );
        let r = run::check(m, Search::Bfs, o.threads, None, None);
        print!("{r}");
        print_paths(&r, o.paths);
        return Ok(if r.all_hold() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let search = match (o.symmetry, o.dfs) {
        (true, _) => Search::DfsSymmetry,
        (false, true) => Search::Dfs,
        (false, false) => Search::Bfs,
    };
    let mut ok = true;
    for &which in &o.models {
        let label = match which {
            Which::Lease => format!("lease, {processes} processes"),
            Which::Signals | Which::Checkpoint | Which::Cluster => which.to_string(),
        };
        println!("== {label} ({search:?}, {} thread(s))", o.threads.max(1));
        let r = catalog::check_ci(which, processes, search, o.threads);
        print!("{r}");
        print_paths(&r, o.paths);
        ok &= r.all_hold();
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// With `--paths`: every discovery's path, one line per step, under its property's name.
fn print_paths(r: &Report, paths: bool) {
    if !paths {
        return;
    }
    for v in &r.verdicts {
        if let Some(path) = &v.path {
            println!("  path of {:?}:", v.name);
            for line in path {
                println!("    {line}");
            }
        }
    }
}

fn print_mutant(r: &catalog::MutantReport, path: bool) {
    println!(
        "{:<11} {:<30} breaks {:<28} ({:>4}): {} — shortest counterexample {} steps, {} states, {:.2?}",
        r.mutant.model.name(),
        r.mutant.name,
        format!("`{}`", r.mutant.breaks),
        catalog::invariant(r.mutant.breaks),
        if r.killed { "killed" } else { "SURVIVED" },
        r.length,
        r.unique,
        r.elapsed
    );
    if path {
        for line in &r.path {
            println!("    {line}");
        }
    }
}

fn mutants(o: &Opts) -> ExitCode {
    let processes = o.processes.unwrap_or(3);
    let mut ok = true;
    for m in catalog::mutants() {
        if !o.models.contains(&m.model) {
            continue;
        }
        let r = catalog::run_mutant(m, processes);
        print_mutant(&r, false);
        ok &= r.killed;
    }
    println!("bugs planted in src/:");
    for m in catalog::src_mutants() {
        if !o.models.contains(&m.model) {
            continue;
        }
        let r = catalog::run_src_mutant(m);
        print_mutant(&r, false);
        ok &= r.killed;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn traces(files: &[String]) -> ExitCode {
    let mut ok = true;
    for f in files {
        match tenure_models::trace::check_file(f) {
            Ok(s) => println!(
                "{f}: conforms ({} steps, ends in {}{})",
                s.steps,
                s.final_phase,
                s.exit_code()
                    .map(|c| format!(", exit {c}"))
                    .unwrap_or_default()
            ),
            Err(v) => {
                ok = false;
                println!("{f}: does not conform: {v}");
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the pinned configurations and rewrites the counts file (only if every property of every
/// configuration run holds).
fn pin(long: bool, threads: usize) -> ExitCode {
    let path = catalog::COUNTS_FILE;
    let old = match std::fs::read_to_string(path) {
        Ok(text) => match catalog::parse_counts(&text) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("tenure-models: {path}: {e}; fix or delete the file, then pin again");
                return ExitCode::FAILURE;
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            eprintln!("tenure-models: cannot read {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut counts: Vec<(String, usize)> = old.clone();
    let mut ok = true;
    for p in catalog::pinned() {
        if p.set == catalog::Set::Long && !long {
            continue;
        }
        let r = (p.run)(threads.max(1));
        line(p.name, &r);
        if !r.all_hold() {
            ok = false;
            print!("{r}");
            continue;
        }
        let was = old.iter().find(|(n, _)| n == p.name).map(|(_, c)| *c);
        match was {
            Some(c) if c == r.unique => {}
            Some(c) => println!("  {}: {c} -> {}", p.name, r.unique),
            None => println!("  {}: pinned at {}", p.name, r.unique),
        }
        counts.retain(|(n, _)| n != p.name);
        counts.push((p.name.to_string(), r.unique));
    }
    if !ok {
        eprintln!("tenure-models: a property does not hold; {path} was left as it was");
        return ExitCode::FAILURE;
    }
    if let Err(e) = std::fs::write(path, catalog::render_counts(&counts)) {
        eprintln!("tenure-models: cannot write {path}: {e}");
        return ExitCode::FAILURE;
    }
    println!("wrote {path}");
    ExitCode::SUCCESS
}

fn line(name: &str, r: &Report) {
    println!(
        "{name:<32} {:>10} {:>10} {:>6} {:>9.2?} {:>12.0}",
        r.unique,
        r.states,
        r.max_depth,
        r.elapsed,
        r.states_per_second()
    );
}

/// States per second of every pinned configuration (the CI set; `--long`: the long set too),
/// one checker thread each, and the time of the whole mutation table. States per second count
/// generated states, as the checker reports them. The lease rows at N = 3 and the symmetry
/// factors of the models before issue 12 are gone: with the real plans the pids are in the
/// files, so symmetry no longer reduces, and N = 3 breadth-first runs for many minutes.
/// `--only NAME` runs just the named rows (no mutants), `--no-mutants` skips the mutation table.
fn bench(o: &Opts) -> Result<ExitCode, Usage> {
    let pinned = catalog::pinned();
    // `--only` names rows to run (for profiling one world, or timing rows interleaved with
    // another build's): an unknown name is a usage error, not an empty table.
    if let Some(unknown) = o.only.iter().find(|n| !pinned.iter().any(|p| p.name == *n)) {
        return Err(Usage(format!(
            "no pinned configuration {unknown:?}; the rows are: {}",
            pinned.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
        )));
    }
    if let Some(f) = o.files.first() {
        return Err(Usage(format!("bench takes no argument {f:?}")));
    }
    println!(
        "{:<32} {:>10} {:>10} {:>6} {:>9} {:>12}",
        "configuration", "unique", "generated", "depth", "time", "states/s"
    );
    let started = Instant::now();
    for p in pinned {
        let wanted = if o.only.is_empty() {
            p.set == catalog::Set::Ci || o.long
        } else {
            o.only.iter().any(|n| n == p.name)
        };
        if wanted {
            line(p.name, &(p.run)(1));
        }
    }
    if o.no_mutants || !o.only.is_empty() {
        println!("total {:.2?}", started.elapsed());
        return Ok(ExitCode::SUCCESS);
    }
    let m0 = Instant::now();
    let mut killed = 0;
    let all = catalog::mutants();
    for m in &all {
        killed += usize::from(catalog::run_mutant(*m, 3).killed);
    }
    let src = catalog::src_mutants();
    for m in &src {
        killed += usize::from(catalog::run_src_mutant(*m).killed);
    }
    println!(
        "mutants: {killed}/{} killed ({} of the worlds, {} planted in src/) in {:.2?}",
        all.len() + src.len(),
        all.len(),
        src.len(),
        m0.elapsed()
    );
    println!("total {:.2?}", started.elapsed());
    Ok(ExitCode::SUCCESS)
}
