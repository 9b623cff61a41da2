//! Benchmarks of the `tenure` runner, each printed against a baseline measured in the
//! same run on the same filesystem, so the ratios survive a slow or loaded machine:
//!
//! 1. `tenure run --dir D -- true` against `flock F/lock true` (both spawn `true`): medians of N
//!    interleaved runs and their ratio (issue 11 target ≤ 1.3×), with the same run without
//!    the ownership's cgroup (`--cgroup off`) interleaved as a third; the start-up alone
//!    (`tenure --version` against `flock --version`, interleaved); and the peak RSS of each (from
//!    `/usr/bin/time -f %M` when it is installed).
//! 2. The cost of containment, separately: `tenure run -- true` with a cgroup per
//!    ownership against `--cgroup off` (subreaper and inherited lock only), interleaved; and the
//!    parts alone — `PR_SET_CHILD_SUBREAPER`, and a cgroup's create + record-free remove.
//!
//! The store's rows on the run path (SIGTERM → exit with a 100 MiB publish, a long history)
//! are in `cargo bench --bench checkpoint`.
//!
//! Run with `cargo bench --bench runner`; `TENURE_BENCH_RUNS` (default 40) sets the
//! repetitions. Nothing is asserted: speed is reported, never tested.

mod common;

use common::{TENURE, ms, runs, timed};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p90(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() * 9 / 10).min(v.len() - 1)]
}

/// The peak RSS in KiB of a command, from `/usr/bin/time -f %M` (max over `n` runs).
fn peak_rss_kib(args: &[&str], n: usize) -> Option<u64> {
    let time = Path::new("/usr/bin/time");
    if !time.exists() {
        return None;
    }
    let mut best = 0;
    for _ in 0..n {
        let out = Command::new(time)
            .arg("-f")
            .arg("%M")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stderr);
        let kib: u64 = text.lines().last()?.trim().parse().ok()?;
        best = best.max(kib);
    }
    Some(best)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn bench_run_vs_flock(tmp: &Path, n: usize) {
    println!(
        "== tenure run -- true  vs  flock LOCK true, and run --cgroup off ({n} interleaved runs each)"
    );
    let Some(flock) = which("flock") else {
        println!("   skipped: flock(1) is not installed");
        return;
    };
    let state = tmp.join("state");
    let flock_dir = tmp.join("flock");
    fs::create_dir(&flock_dir).unwrap();
    let lock = flock_dir.join("lock");
    let tenure_cmd = || {
        let mut c = Command::new(TENURE);
        c.arg("run").arg("--dir").arg(&state).args(["--", "true"]);
        c
    };
    let flock_cmd = || {
        let mut c = Command::new(&flock);
        c.arg(&lock).arg("true");
        c
    };
    // The same run without the ownership's cgroup (the subreaper and the inherited lock
    // contain the workload instead): what the containment's cgroup costs of the ratio.
    let off_state = tmp.join("state-off");
    let off_cmd = || {
        let mut c = Command::new(TENURE);
        c.arg("run")
            .arg("--dir")
            .arg(&off_state)
            .args(["--cgroup", "off", "--", "true"]);
        c
    };
    // Warm-up: the first run creates the dir, its marker and the store's folders.
    timed(&mut tenure_cmd());
    timed(&mut flock_cmd());
    timed(&mut off_cmd());
    let (mut t, mut f, mut o) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for _ in 0..n {
        t.push(timed(&mut tenure_cmd()));
        f.push(timed(&mut flock_cmd()));
        o.push(timed(&mut off_cmd()));
    }
    let (tm, fm, om) = (median(&mut t), median(&mut f), median(&mut o));
    let (tmin, fmin) = (t[0], f[0]);
    println!(
        "   tenure run: median {:7.2} ms  p90 {:7.2} ms  min {:7.2} ms",
        ms(tm),
        ms(p90(&mut t)),
        ms(tmin)
    );
    println!(
        "   flock(1):   median {:7.2} ms  p90 {:7.2} ms  min {:7.2} ms",
        ms(fm),
        ms(p90(&mut f)),
        ms(fmin)
    );
    println!(
        "   ratio tenure/flock: {:.2}x  (issue 11 target <= 1.3x)",
        tm.as_secs_f64() / fm.as_secs_f64()
    );
    println!(
        "   without the cgroup (--cgroup off): median {:7.2} ms, ratio to flock {:.2}x",
        ms(om),
        om.as_secs_f64() / fm.as_secs_f64()
    );
    // On a loaded machine every sleep of either side (the runner sleeps twice: for the exec and
    // for the exit) waits for a processor; the fastest runs show the work itself.
    println!(
        "   ratio of the fastest runs: {:.2}x",
        tmin.as_secs_f64() / fmin.as_secs_f64()
    );
    // Start-up alone: the binary's loading and argument parsing, which every command pays.
    let (mut tv, mut fv) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        tv.push(timed(Command::new(TENURE).arg("--version")));
        fv.push(timed(Command::new(&flock).arg("--version")));
    }
    let (tvm, fvm) = (median(&mut tv), median(&mut fv));
    println!(
        "   start-up: tenure --version median {:5.2} ms, flock --version {:5.2} ms, ratio {:.2}x",
        ms(tvm),
        ms(fvm),
        tvm.as_secs_f64() / fvm.as_secs_f64()
    );
    let state_s = state.to_str().unwrap();
    let lock_s = lock.to_str().unwrap();
    let flock_s = flock.to_str().unwrap();
    match (
        peak_rss_kib(&[TENURE, "run", "--dir", state_s, "--", "true"], 5),
        peak_rss_kib(&[flock_s, lock_s, "true"], 5),
    ) {
        (Some(a), Some(b)) => println!(
            "   peak RSS: tenure {a} KiB, flock {b} KiB, ratio {:.2}x",
            a as f64 / b as f64
        ),
        _ => println!("   peak RSS: skipped (/usr/bin/time is not installed)"),
    }
}

fn bench_containment(tmp: &Path, n: usize) {
    println!(
        "== containment: tenure run -- true with a cgroup  vs  --cgroup off ({n} interleaved runs each)"
    );
    let run = |dir: &Path, cgroup: &str| {
        let mut c = Command::new(TENURE);
        c.arg("run")
            .arg("--dir")
            .arg(dir)
            .args(["--cgroup", cgroup, "--", "true"]);
        c
    };
    let (a, b) = (tmp.join("contain-cgroup"), tmp.join("contain-off"));
    timed(&mut run(&a, "auto"));
    timed(&mut run(&b, "off"));
    let events = fs::read_to_string(a.join(".tenure/events.jsonl")).unwrap_or_default();
    let mechanism = if events.contains("\"mechanism\":\"cgroup\"") {
        "cgroup"
    } else {
        "no cgroup here (not writable): both runs use the subreaper and the inherited lock"
    };
    let (mut with, mut without) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        with.push(timed(&mut run(&a, "auto")));
        without.push(timed(&mut run(&b, "off")));
    }
    let (w, o) = (median(&mut with), median(&mut without));
    println!("   mechanism of `--cgroup auto`: {mechanism}");
    println!(
        "   --cgroup auto: median {:7.2} ms  p90 {:7.2} ms",
        ms(w),
        ms(p90(&mut with))
    );
    println!(
        "   --cgroup off:  median {:7.2} ms  p90 {:7.2} ms",
        ms(o),
        ms(p90(&mut without))
    );
    println!(
        "   cgroup cost per run: {:+.2} ms  (ratio {:.3}x)",
        ms(w) - ms(o),
        w.as_secs_f64() / o.as_secs_f64()
    );
    // The parts alone, in this process.
    let me = rustix::process::getpid();
    let k = 10_000;
    let t = Instant::now();
    for _ in 0..k {
        rustix::process::set_child_subreaper(Some(me)).unwrap();
    }
    let per = t.elapsed() / k;
    rustix::process::set_child_subreaper(None).unwrap();
    println!(
        "   PR_SET_CHILD_SUBREAPER: {:.2} us per call",
        per.as_secs_f64() * 1e6
    );
    let m = 50u32;
    let t = Instant::now();
    let mut made = 0u32;
    for i in 0..m {
        match tenure::lease::cgroup::Cgroup::create(&format!(
            "tenure-bench-{}-{i}",
            std::process::id()
        )) {
            Ok(cg) => {
                cg.remove().unwrap();
                made += 1;
            }
            Err(e) => {
                println!("   cgroup create + remove: skipped ({e})");
                break;
            }
        }
    }
    if made == m {
        println!(
            "   cgroup create + remove: {:.1} us per ownership (mkdir, open events/procs, rmdir)",
            t.elapsed().as_secs_f64() * 1e6 / f64::from(m)
        );
    }
}

fn main() {
    let tmp = tempfile::Builder::new()
        .prefix("tenure-bench-")
        .tempdir()
        .expect("tempdir");
    println!(
        "tenure runner benchmarks (binary {TENURE}, scratch {})",
        tmp.path().display()
    );
    bench_run_vs_flock(tmp.path(), runs("TENURE_BENCH_RUNS", 40));
    bench_containment(tmp.path(), runs("TENURE_BENCH_RUNS", 40));
}
