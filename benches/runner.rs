//! Benchmarks of the `tenure` runner, each printed against a baseline measured in the
//! same run on the same filesystem, so the ratios survive a slow or loaded machine:
//!
//! 1. `tenure run --dir D -- true` against `flock F/lock true` (both spawn `true`): medians of N
//!    interleaved runs and their ratio (issue 11 target ≤ 1.3×); the start-up alone
//!    (`tenure --version` against `flock --version`, interleaved); and the peak RSS of each (from
//!    `/usr/bin/time -f %M` when it is installed).
//! 2. SIGTERM → exit of a ready owner whose child staged a 100 MiB checkpoint, against the
//!    publish of the same 100 MiB through the library alone (issue 11 target ≤ +10 ms).
//! 3. The cost of containment, separately: `tenure run -- true` with a cgroup per
//!    ownership against `--cgroup off` (subreaper and inherited lock only), interleaved; and the
//!    parts alone — `PR_SET_CHILD_SUBREAPER`, and a cgroup's create + record-free remove.
//! 4. Nothing on the run path grows with history: `tenure run -- true` in a dir with 10,000
//!    older manifests and 10,000 kept failed outputs (`TENURE_BENCH_HISTORY` sets the count)
//!    against a dir with one checkpoint, interleaved (target ratio about 1).
//!
//! Run with `cargo bench --bench runner`; `TENURE_BENCH_RUNS` (default 40) and
//! `TENURE_BENCH_PUBLISH_RUNS` (default 5) set the repetitions. Nothing is asserted: speed is
//! reported, never tested.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tenure::checkpoint::{CheckpointStore, StoreOptions};
use tenure::lease::{self, AcquireOptions, WaitBound};
use tenure::machine::PhaseKind;
use tenure::privfs::StateDir;

const TENURE: &str = env!("CARGO_BIN_EXE_tenure");
const MIB: usize = 1 << 20;

fn runs(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p90(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() * 9 / 10).min(v.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs a command to its end (stdio discarded) and returns how long it took.
fn timed(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let st = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    let d = t.elapsed();
    assert!(st.success(), "{cmd:?} failed: {st}");
    d
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
    println!("== tenure run -- true  vs  flock LOCK true ({n} interleaved runs each)");
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
    // Warm-up: the first run creates the dir, its marker and the store's folders.
    timed(&mut tenure_cmd());
    timed(&mut flock_cmd());
    let (mut t, mut f) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        t.push(timed(&mut tenure_cmd()));
        f.push(timed(&mut flock_cmd()));
    }
    let (tm, fm) = (median(&mut t), median(&mut f));
    println!(
        "   tenure run: median {:7.2} ms  p90 {:7.2} ms",
        ms(tm),
        ms(p90(&mut t))
    );
    println!(
        "   flock(1):   median {:7.2} ms  p90 {:7.2} ms",
        ms(fm),
        ms(p90(&mut f))
    );
    println!(
        "   ratio tenure/flock: {:.2}x  (issue 11 target <= 1.3x)",
        tm.as_secs_f64() / fm.as_secs_f64()
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

/// 100 MiB whose first bytes make it unique to `tag` (so no publish finds its blob already
/// stored and skips the write).
fn payload(base: &[u8], tag: &str) -> Vec<u8> {
    let mut v = base.to_vec();
    let t = tag.as_bytes();
    v[..t.len()].copy_from_slice(t);
    v
}

/// The library publish alone: own a fresh dir, stage the file, time `publish`.
fn publish_alone(dir: &Path, data: &[u8]) -> Duration {
    let sd = StateDir::open(dir, true).unwrap();
    let opts = AcquireOptions {
        wait: WaitBound::Try,
        cancel: None,
        phase: PhaseKind::Ready,
        fence: None,
    };
    let l = lease::acquire(&sd, &opts, &mut |_| {}).unwrap();
    let store = CheckpointStore::open_owned(&sd, StoreOptions { keep: 2 }).unwrap();
    let staging = store.staging().unwrap();
    let mut f = fs::File::create(staging.path().join("big")).unwrap();
    f.write_all(data).unwrap();
    drop(f);
    let t = Instant::now();
    store.publish(l.epoch(), &staging).unwrap();
    let d = t.elapsed();
    l.release().unwrap();
    d
}

/// A ready owner whose child staged `src` (100 MiB) and waits; SIGTERM → the runner's exit.
fn stop_with_publish(dir: &Path, src: &Path, staged: &Path) -> Duration {
    let script = r#"trap 'exit 0' TERM
cat "$1" > "$TENURE_CHECKPOINT_OUT/big"
: > "$2"
read _"#;
    let mut child = Command::new(TENURE)
        .arg("run")
        .arg("--dir")
        .arg(dir)
        .args(["--", "sh", "-c", script, "sh"])
        .arg(src)
        .arg(staged)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Held until the runner exited: `Child::wait` would close it, and the child's `read _`
    // would end on EOF instead of on the signal.
    let stdin = child.stdin.take();
    let events = dir.join(".tenure/events.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    // Event wait: the owner says ready and the child says its file is staged.
    while !(staged.exists()
        && fs::read_to_string(&events).is_ok_and(|s| s.contains("\"kind\":\"ready\"")))
    {
        assert!(Instant::now() < deadline, "the owner never became ready");
        std::thread::sleep(Duration::from_millis(1));
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    let t = Instant::now();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let st = child.wait().unwrap();
    let d = t.elapsed();
    drop(stdin);
    assert_eq!(st.code(), Some(143), "the owner did not stop in order");
    let log = fs::read_to_string(&events).unwrap_or_default();
    assert!(
        log.contains("checkpoint-published"),
        "nothing was published:\n{log}"
    );
    d
}

fn bench_stop_publish(tmp: &Path, m: usize) {
    println!(
        "== SIGTERM -> exit of a ready owner publishing 100 MiB  vs  the publish alone ({m} runs each)"
    );
    let mut base = vec![0u8; 100 * MIB];
    // Incompressible-looking but cheap bytes: a xorshift stream.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in base.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let (mut alone, mut runner) = (Vec::new(), Vec::new());
    for i in 0..m {
        let data = payload(&base, &format!("library-{i}-"));
        alone.push(publish_alone(&tmp.join(format!("lib-{i}")), &data));
        let data = payload(&base, &format!("runner-{i}-"));
        let src = tmp.join(format!("src-{i}"));
        // Written back before the measurement, so that in both cases only the staged copy is
        // dirty when the publish starts.
        let mut f = fs::File::create(&src).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        runner.push(stop_with_publish(
            &tmp.join(format!("run-{i}")),
            &src,
            &tmp.join(format!("staged-{i}")),
        ));
        fs::remove_file(&src).unwrap();
        // Keep the disk footprint bounded.
        let _ = fs::remove_dir_all(tmp.join(format!("lib-{i}")));
        let _ = fs::remove_dir_all(tmp.join(format!("run-{i}")));
    }
    let (a, r) = (median(&mut alone), median(&mut runner));
    println!("   publish alone (library): median {:8.2} ms", ms(a));
    println!("   SIGTERM -> exit (runner): median {:8.2} ms", ms(r));
    println!(
        "   overhead: {:+.2} ms  (issue 11 target <= +10 ms)",
        ms(r) - ms(a)
    );
}

/// A store's history as the owner's run path meets it: `k` older manifests (as `--keep` `k`
/// keeps them; the same one-file checkpoint under ids `1..=k`, CURRENT naming the last) and
/// `k` kept outputs of failed publishes (`failed/<epoch>.<n>`, empty, as a large keep would
/// leave them). Written directly because `k` real publishes (one `syncfs` each) take minutes.
fn plant_history(dir: &Path, k: usize) {
    let run = Command::new(TENURE)
        .arg("run")
        .arg("--dir")
        .arg(dir)
        .args(["--", "sh", "-c", "echo hi > \"$TENURE_CHECKPOINT_OUT/f\""])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    assert!(run.success());
    let cps = dir.join("checkpoints");
    let manifests = cps.join("manifests");
    let first = fs::read_to_string(manifests.join(format!("{:020}.json", 1))).unwrap();
    let entry = first.lines().nth(1).unwrap().to_string();
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for id in 2..=k {
        let text = format!(
            "{{\"format\":2,\"id\":\"{id:020}\",\"parent\":\"{:020}\",\"epoch\":1,\"created_at_ms\":{at_ms},\"files\":1}}\n{entry}\n",
            id - 1
        );
        // Private, as the store writes them (a manifest open to others is refused unread).
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(manifests.join(format!("{id:020}.json")))
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .unwrap();
    }
    // CURRENT keeps naming checkpoint 1 (its line carries that manifest's digest): the older
    // manifests are history the run path may list, never load.
    let failed = cps.join("failed");
    for n in 0..k {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(failed.join(format!("1.{n}")))
            .unwrap();
    }
}

/// Issue 11: nothing on the run path is O(size of the dir's history). `tenure run -- true` in
/// a dir with 10,000 older manifests and 10,000 kept failed outputs against a dir with one
/// checkpoint, interleaved.
fn bench_history(tmp: &Path, n: usize) {
    let k = runs("TENURE_BENCH_HISTORY", 10_000);
    println!(
        "== tenure run -- true: a dir with {k} old manifests + {k} failed outputs  vs  one checkpoint ({n} interleaved runs each)"
    );
    let (old, fresh) = (tmp.join("history-old"), tmp.join("history-fresh"));
    plant_history(&old, k);
    plant_history(&fresh, 1);
    let run = |dir: &Path| {
        let mut c = Command::new(TENURE);
        c.arg("run").arg("--dir").arg(dir).args(["--", "true"]);
        c
    };
    timed(&mut run(&old));
    timed(&mut run(&fresh));
    let (mut o, mut f) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        o.push(timed(&mut run(&old)));
        f.push(timed(&mut run(&fresh)));
    }
    let (om, fm) = (median(&mut o), median(&mut f));
    println!("   with history: median {:7.2} ms", ms(om));
    println!("   without:      median {:7.2} ms", ms(fm));
    println!(
        "   ratio history/none: {:.2}x  (target ~1.0x: nothing on the run path grows with history)",
        om.as_secs_f64() / fm.as_secs_f64()
    );
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
    bench_stop_publish(tmp.path(), runs("TENURE_BENCH_PUBLISH_RUNS", 5));
    bench_history(tmp.path(), runs("TENURE_BENCH_RUNS", 40));
}
