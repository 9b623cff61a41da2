//! The `tenure` runner: parses arguments and hands them to `tenure::driver`. Nothing here
//! touches the state dir; every run is validated before anything on disk changes (card H6).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tenure::driver::{self, CgroupMode, RunOptions, signals::SignalIntake};
use tenure::lease::WaitBound;
use tenure::machine::{EXIT_BUSY, EXIT_USAGE, HupPolicy, KillMode, ReadyMode};

const HELP: &str = "\
tenure — run a command as the single owner of a state directory

USAGE:
    tenure run    --dir DIR [options] -- CMD [ARGS...]
    tenure up     --dir DIR [--wait SECONDS] [run options] -- CMD [ARGS...]
    tenure stop   --dir DIR [--grace SECONDS]   (default grace 30)
    tenure status --dir DIR [--json]
    tenure verify --dir DIR
    tenure init   --dir DIR [--adopt]
    tenure demo

RUN OPTIONS:
    -w, --wait SECONDS        wait at most this long for the lease (default: forever)
    -n, --nonblock            do not wait: exit busy at once if the lease is held
    -E, --conflict-exit-code N  exit code when busy (default 75)
        --grace SECONDS       after forwarding a stop signal, wait this long, then SIGKILL (default 10)
        --kill-wait SECONDS   after SIGKILL, wait this long before reporting `did not stop` (default 5)
        --type simple|notify|forking
                              ready when spawned (default), when the workload sends READY=1,
                              or when the first process exits 0 leaving its daemon behind
        --ready start|notify  the same as --type simple|notify
        --ready-timeout SECONDS  with notify or forking: stop the workload if not ready in time
        --pidfile FILE        with forking: ready once FILE names the daemon's main process
        --kill-mode tree|main stop signals go to every process at once (tree, the default), or
                              to the main process first (main, the default for forking); what
                              remains after the main process exits is always stopped too
        --hup forward|stop    SIGHUP is forwarded to the workload (default) or stops it
        --watchdog SECONDS    the ready workload must send WATCHDOG=1 this often (WATCHDOG_USEC)
        --cgroup auto|off     contain the workload in a cgroup of its own where possible
                              (default auto); off: subreaper and inherited lock only
        --env-allow VAR,...   pass only these variables (plus TENURE_*) to the child
        --keep K              checkpoints kept by garbage collection (default 2)
        --trace FILE          write every lifecycle step as JSONL to FILE
        --lease etcd://HOST:PORT[,HOST:PORT...]/PREFIX
                              own PREFIX on an etcd cluster instead of the lock of --dir (needs
                              the `etcd` feature): the epoch is the cluster's revision, CURRENT
                              lives on etcd and moves only while the lease holds; --dir keeps
                              this machine's records (see spec/cluster.md)
        --lease-ttl SECONDS   the cluster lease's TTL (default 10); a lost lease kills the
                              workload at once and exits 76
        --store DIR           with --lease: blobs and manifests go to DIR, shared by the machines

THE CHILD GETS:
    TENURE_DIR              the state dir
    TENURE_EPOCH            this ownership's fencing epoch
    TENURE_CHECKPOINT       a read-only copy of the current checkpoint (unset when none)
    TENURE_CHECKPOINT_OUT   an empty dir: files left here after exit 0 become the next checkpoint
    NOTIFY_SOCKET           with --ready notify: send READY=1 here (sd_notify protocol)

LIFECYCLE:
    cold -> recovering -> ready -> draining -> released, or cancelled / refused.
    SIGTERM, SIGINT or SIGHUP while waiting cancels; while recovering refuses (nothing is
    published); while ready drains: the signal is forwarded, the grace runs, SIGKILL follows,
    the checkpoint is published if the main process exited 0, then the lease is released. The
    lease is never released while any process of the workload may still run: what the main
    process leaves behind gets the stop signal, the grace and SIGKILL too. Every other signal
    (USR1, USR2, WINCH, QUIT, ... and HUP while ready) is forwarded to the workload.

EXIT CODES (see spec/lifecycle.md):
    N          the child's own exit code when it exits by itself
    128+N      stopped (or cancelled, or refused while recovering) by signal N, e.g. 143
    64         usage error          65  refused state        69  not ready, or watchdog
    70         did not stop         74  I/O or publish error 75  busy (-E to change)
    76         the cluster lease was lost (--lease)
    126, 127   the command could not be executed / was not found
    137        the child was killed after the grace period
";

// Prints never panic on a closed pipe or stream (issue 10): see `tenure::stdio`.
macro_rules! println {
    ($($arg:tt)*) => { tenure::stdio::out(format_args!("{}\n", format_args!($($arg)*))) };
}
macro_rules! print {
    ($($arg:tt)*) => { tenure::stdio::out(format_args!($($arg)*)) };
}
macro_rules! eprintln {
    ($($arg:tt)*) => { tenure::stdio::err(format_args!("{}\n", format_args!($($arg)*))) };
}

/// A usage error: printed with a hint, exit 64, nothing on disk changed.
struct Usage(String);

fn main() -> ExitCode {
    // Before anything opens a file: a closed stdout must not become a state file's descriptor.
    tenure::stdio::reserve_std_fds();
    match real_main() {
        Ok(code) => ExitCode::from(code),
        Err(Usage(msg)) => {
            eprintln!("tenure: {msg}\nRun `tenure --help` for usage.");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn real_main() -> Result<u8, Usage> {
    // Signals first: a stop at any moment from here on is seen (card G1).
    let intake = match SignalIntake::install() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("tenure: cannot install signal handlers: {e}");
            return Ok(tenure::machine::EXIT_IO);
        }
    };
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.is_empty() {
        return Err(Usage("a subcommand is required".into()));
    }
    let sub = args.remove(0);
    match sub.to_str() {
        Some("-h" | "--help" | "help") => {
            print!("{HELP}");
            Ok(0)
        }
        Some("-V" | "--version") => {
            println!("tenure {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
        Some("run") => {
            let opts = parse_run(args, true)?;
            report(driver::run(&opts, &intake))
        }
        Some("up") => {
            let opts = parse_run(args, true)?;
            Ok(driver::up::up(&opts, &intake))
        }
        Some("stop") => {
            let mut p = Parser::new(args);
            let mut dir = None;
            // Longer than the runner's own default grace, so the owner can stop its child and
            // publish before `stop` escalates to SIGKILL.
            let mut grace = Duration::from_secs(30);
            // The owner this machine runs is stopped through its local records; the cluster
            // options are accepted (and checked) so one set of options serves every command.
            let mut lease = ClusterArgs::default();
            while let Some(a) = p.next_flag()? {
                match a.as_str() {
                    "--dir" | "-d" => dir = Some(p.path(&a)?),
                    "--grace" => grace = p.duration(&a, false)?,
                    _ if lease.take(&a, &mut p)? => {}
                    _ => return Err(unknown(&a)),
                }
            }
            p.no_rest("stop")?;
            lease.options()?;
            let dir = dir.ok_or_else(|| Usage("stop needs --dir DIR".into()))?;
            Ok(driver::ops::stop(&dir, grace))
        }
        Some("status") => {
            let mut p = Parser::new(args);
            let (mut dir, mut json) = (None, false);
            let mut lease = ClusterArgs::default();
            while let Some(a) = p.next_flag()? {
                match a.as_str() {
                    "--dir" | "-d" => dir = Some(p.path(&a)?),
                    "--json" => json = true,
                    _ if lease.take(&a, &mut p)? => {}
                    _ => return Err(unknown(&a)),
                }
            }
            p.no_rest("status")?;
            let dir = dir.ok_or_else(|| Usage("status needs --dir DIR".into()))?;
            #[cfg(feature = "etcd")]
            if let Some((spec, _)) = lease.options()? {
                return Ok(driver::ops::cluster_status(&dir, &spec, json));
            }
            #[cfg(not(feature = "etcd"))]
            lease.options()?;
            Ok(driver::ops::status(&dir, json))
        }
        Some("verify") => {
            let mut p = Parser::new(args);
            let mut dir = None;
            let mut lease = ClusterArgs::default();
            while let Some(a) = p.next_flag()? {
                match a.as_str() {
                    "--dir" | "-d" => dir = Some(p.path(&a)?),
                    _ if lease.take(&a, &mut p)? => {}
                    _ => return Err(unknown(&a)),
                }
            }
            p.no_rest("verify")?;
            let dir = dir.ok_or_else(|| Usage("verify needs --dir DIR".into()))?;
            #[cfg(feature = "etcd")]
            if let Some((spec, store)) = lease.options()? {
                // The store a cluster's CURRENT names is the shared one (or the one in --dir).
                let store = store.unwrap_or(dir);
                return Ok(driver::ops::cluster_verify(&spec, &store));
            }
            #[cfg(not(feature = "etcd"))]
            lease.options()?;
            Ok(driver::ops::verify(&dir))
        }
        Some("init") => {
            let mut p = Parser::new(args);
            let (mut dir, mut adopt) = (None, false);
            while let Some(a) = p.next_flag()? {
                match a.as_str() {
                    "--dir" | "-d" => dir = Some(p.path(&a)?),
                    "--adopt" => adopt = true,
                    _ => return Err(unknown(&a)),
                }
            }
            p.no_rest("init")?;
            let dir = dir.ok_or_else(|| Usage("init needs --dir DIR".into()))?;
            Ok(driver::ops::init(&dir, adopt))
        }
        // The demo's own child process; not part of the command-line contract.
        Some("demo-child") => Ok(driver::demo::child(&intake)),
        Some("demo") => {
            Parser::new(args).no_rest("demo")?;
            Ok(driver::demo::demo(&intake))
        }
        _ => Err(Usage(format!(
            "unknown subcommand {:?}; expected run, up, stop, status, verify, init or demo",
            sub
        ))),
    }
}

/// `--lease`, `--lease-ttl` and `--store` of `status`, `verify` and `stop`.
#[derive(Default)]
struct ClusterArgs {
    lease: Option<String>,
    ttl: Option<Duration>,
    store: Option<PathBuf>,
}

impl ClusterArgs {
    /// Takes `flag` (and its value) if it is one of the three.
    fn take(&mut self, flag: &str, p: &mut Parser) -> Result<bool, Usage> {
        match flag {
            "--lease" => {
                self.lease = Some(
                    p.value(flag)?
                        .into_string()
                        .map_err(|_| Usage("--lease must be UTF-8".into()))?,
                )
            }
            "--lease-ttl" => self.ttl = Some(p.duration(flag, false)?),
            "--store" => self.store = Some(p.path(flag)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    #[cfg(feature = "etcd")]
    fn options(&self) -> Result<Option<(tenure::cluster::ClusterSpec, Option<PathBuf>)>, Usage> {
        cluster_options(self.lease.as_deref(), self.ttl, self.store.as_deref())
    }

    #[cfg(not(feature = "etcd"))]
    fn options(&self) -> Result<Option<()>, Usage> {
        cluster_options(self.lease.as_deref(), self.ttl, self.store.as_deref())
    }
}

fn report(r: Result<driver::RunReport, driver::DriverError>) -> Result<u8, Usage> {
    match r {
        Ok(rep) => Ok(rep.code),
        Err(e) => {
            eprintln!("tenure: {e}");
            Ok(tenure::machine::EXIT_IO)
        }
    }
}

fn unknown(flag: &str) -> Usage {
    Usage(format!("unknown option {flag}"))
}

fn parse_run(args: Vec<OsString>, needs_command: bool) -> Result<RunOptions, Usage> {
    let mut p = Parser::new(args);
    let mut dir = None;
    let mut wait: Option<Duration> = None;
    let mut nonblock = false;
    let mut grace = Duration::from_secs(10);
    let mut kill_wait = Duration::from_secs(5);
    let mut ready = ReadyMode::Start;
    let mut ready_timeout = None;
    let mut kill_mode = None;
    let mut hup = HupPolicy::Forward;
    let mut pid_file = None;
    let mut watchdog = None;
    let mut cgroup = CgroupMode::Auto;
    let mut env_allow = None;
    let mut keep = 2usize;
    let mut busy_code = EXIT_BUSY;
    let mut trace = None;
    let mut lease: Option<String> = None;
    let mut lease_ttl: Option<Duration> = None;
    let mut store: Option<PathBuf> = None;
    while let Some(a) = p.next_flag()? {
        match a.as_str() {
            "--dir" | "-d" => dir = Some(p.path(&a)?),
            "--wait" | "-w" | "--timeout" => wait = Some(p.duration(&a, true)?),
            "--nonblock" | "-n" => nonblock = true,
            "--grace" => grace = p.duration(&a, false)?,
            "--kill-wait" => kill_wait = p.duration(&a, false)?,
            "--ready" => {
                ready = match p.value(&a)?.to_str() {
                    Some("start") => ReadyMode::Start,
                    Some("notify") => ReadyMode::Notify,
                    other => {
                        let given = other
                            .map_or_else(|| "a non-UTF-8 value".to_owned(), |v| format!("{v:?}"));
                        return Err(Usage(format!(
                            "--ready takes `start` or `notify`, not {given}"
                        )));
                    }
                }
            }
            "--type" => {
                ready = match p.value(&a)?.to_str() {
                    Some("simple") => ReadyMode::Start,
                    Some("notify") => ReadyMode::Notify,
                    Some("forking") => ReadyMode::Forking,
                    other => {
                        return Err(Usage(format!(
                            "--type takes `simple`, `notify` or `forking`, not {other:?}"
                        )));
                    }
                }
            }
            "--kill-mode" => {
                kill_mode = Some(match p.value(&a)?.to_str() {
                    Some("tree") => KillMode::Tree,
                    Some("main") => KillMode::Main,
                    other => {
                        return Err(Usage(format!(
                            "--kill-mode takes `tree` or `main`, not {other:?}"
                        )));
                    }
                })
            }
            "--hup" => {
                hup = match p.value(&a)?.to_str() {
                    Some("forward") => HupPolicy::Forward,
                    Some("stop") => HupPolicy::Stop,
                    other => {
                        return Err(Usage(format!(
                            "--hup takes `forward` or `stop`, not {other:?}"
                        )));
                    }
                }
            }
            "--cgroup" => {
                cgroup = match p.value(&a)?.to_str() {
                    Some("auto") => CgroupMode::Auto,
                    Some("off") => CgroupMode::Off,
                    other => {
                        return Err(Usage(format!(
                            "--cgroup takes `auto` or `off`, not {other:?}"
                        )));
                    }
                }
            }
            "--pidfile" => pid_file = Some(p.path(&a)?),
            "--watchdog" => watchdog = Some(p.duration(&a, false)?),
            "--ready-timeout" => ready_timeout = Some(p.duration(&a, false)?),
            "--env-allow" => {
                let v = p.value(&a)?;
                let list: Vec<OsString> = v
                    .to_str()
                    .ok_or_else(|| Usage("--env-allow must be UTF-8".into()))?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(OsString::from)
                    .collect();
                for name in &list {
                    if !driver::child::valid_env_name(name) {
                        return Err(Usage(format!(
                            "--env-allow: {name:?} is not a variable name"
                        )));
                    }
                }
                env_allow.get_or_insert_with(Vec::new).extend(list);
            }
            "--keep" => {
                keep = p
                    .value(&a)?
                    .to_str()
                    .and_then(|s| s.parse().ok())
                    .filter(|k| *k >= 1)
                    .ok_or_else(|| Usage("--keep takes a whole number of at least 1".into()))?
            }
            "--conflict-exit-code" | "-E" => {
                busy_code = p
                    .value(&a)?
                    .to_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| Usage(format!("{a} takes an exit code from 0 to 255")))?
            }
            "--trace" => trace = Some(PathBuf::from(p.value(&a)?)),
            "--lease" => {
                lease = Some(
                    p.value(&a)?
                        .into_string()
                        .map_err(|_| Usage("--lease must be UTF-8".into()))?,
                )
            }
            "--lease-ttl" => lease_ttl = Some(p.duration(&a, false)?),
            "--store" => store = Some(p.path(&a)?),
            _ => return Err(unknown(&a)),
        }
    }
    let command = p.rest();
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    let cluster = cluster_options(lease.as_deref(), lease_ttl, store.as_deref())?;
    if needs_command && command.is_empty() {
        return Err(Usage("a command is required after `--`".into()));
    }
    if ready_timeout.is_some() && ready == ReadyMode::Start {
        return Err(Usage(
            "--ready-timeout needs --type notify or --type forking".into(),
        ));
    }
    if pid_file.is_some() && ready != ReadyMode::Forking {
        return Err(Usage("--pidfile needs --type forking".into()));
    }
    // A relative pid file is the daemon's, relative to where tenure was started (the detached
    // owner of `tenure up` runs elsewhere).
    let pid_file = pid_file.map(|p| std::path::absolute(&p).unwrap_or(p));
    let kill_mode = kill_mode.unwrap_or(match ready {
        ReadyMode::Forking => KillMode::Main,
        ReadyMode::Start | ReadyMode::Notify => KillMode::Tree,
    });
    if nonblock && wait.is_some_and(|w| !w.is_zero()) {
        return Err(Usage("--nonblock and --wait contradict each other".into()));
    }
    let dir = dir.ok_or_else(|| Usage("--dir DIR is required".into()))?;
    // A trace written into the state dir would itself make the dir look foreign (card L8).
    if let Some(t) = &trace
        && is_inside(&dir, t)
    {
        return Err(Usage(format!(
            "--trace {} is inside the state dir {}; write the trace elsewhere",
            t.display(),
            dir.display()
        )));
    }
    let wait = if nonblock {
        WaitBound::Try
    } else {
        WaitBound::from_option(wait)
    };
    Ok(RunOptions {
        dir,
        wait,
        grace,
        kill_wait,
        ready,
        ready_timeout,
        kill_mode,
        hup,
        pid_file,
        watchdog,
        cgroup,
        env_allow,
        keep,
        busy_code,
        trace,
        command,
        #[cfg(feature = "etcd")]
        cluster: cluster.as_ref().map(|(c, _)| c.clone()),
        #[cfg(feature = "etcd")]
        store: cluster.and_then(|(_, s)| s),
    })
}

/// The cluster lease options (`--lease`, `--lease-ttl`, `--store`), validated before anything
/// is touched: a spec and the shared store, or `None` for the kernel lock of `--dir`.
#[cfg(feature = "etcd")]
fn cluster_options(
    lease: Option<&str>,
    ttl: Option<Duration>,
    store: Option<&std::path::Path>,
) -> Result<Option<(tenure::cluster::ClusterSpec, Option<PathBuf>)>, Usage> {
    let Some(url) = lease else {
        if ttl.is_some() || store.is_some() {
            return Err(Usage(
                "--lease-ttl and --store go with --lease etcd://HOST:PORT/PREFIX".into(),
            ));
        }
        return Ok(None);
    };
    let spec =
        tenure::cluster::ClusterSpec::parse(url, ttl.unwrap_or(tenure::cluster::DEFAULT_TTL))
            .map_err(|e| Usage(e.to_string()))?;
    let store = store.map(|s| std::path::absolute(s).unwrap_or_else(|_| s.to_path_buf()));
    Ok(Some((spec, store)))
}

/// Without the `etcd` feature there is no cluster lease to ask for.
#[cfg(not(feature = "etcd"))]
fn cluster_options(
    lease: Option<&str>,
    ttl: Option<Duration>,
    store: Option<&std::path::Path>,
) -> Result<Option<()>, Usage> {
    if lease.is_some() || ttl.is_some() || store.is_some() {
        return Err(Usage(
            "--lease, --lease-ttl and --store need a tenure built with the `etcd` feature (cargo build --features etcd)".into(),
        ));
    }
    Ok(None)
}

/// Whether `path` lies inside `dir`, compared on absolute paths with existing parts resolved
/// (neither needs to exist; nothing is created).
fn is_inside(dir: &std::path::Path, path: &std::path::Path) -> bool {
    fn resolve(p: &std::path::Path) -> PathBuf {
        let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        // Resolve the longest existing prefix (symlinks included), keep the rest as written.
        let mut existing = abs.clone();
        let mut rest = Vec::new();
        loop {
            if let Ok(c) = std::fs::canonicalize(&existing) {
                return rest
                    .iter()
                    .rev()
                    .fold(c, |acc: PathBuf, part| acc.join(part));
            }
            match (
                existing.file_name().map(|n| n.to_os_string()),
                existing.parent(),
            ) {
                (Some(name), Some(parent)) => {
                    rest.push(name);
                    existing = parent.to_path_buf();
                }
                _ => return abs,
            }
        }
    }
    resolve(path).starts_with(resolve(dir))
}

/// The long name of an option, whatever spelling was used (`-d` is `--dir`); `None` for an
/// unknown option, which the subcommand reports.
fn canonical(flag: &str) -> Option<&'static str> {
    Some(match flag {
        "--dir" | "-d" => "--dir",
        "--wait" | "-w" | "--timeout" => "--wait",
        "--nonblock" | "-n" => "--nonblock",
        "--conflict-exit-code" | "-E" => "--conflict-exit-code",
        "--grace" => "--grace",
        "--kill-wait" => "--kill-wait",
        "--ready" => "--ready",
        "--ready-timeout" => "--ready-timeout",
        "--env-allow" => "--env-allow",
        "--keep" => "--keep",
        "--trace" => "--trace",
        "--json" => "--json",
        "--adopt" => "--adopt",
        "--lease" => "--lease",
        "--lease-ttl" => "--lease-ttl",
        "--store" => "--store",
        _ => return None,
    })
}

/// A small argument parser: flags with values (`--flag VALUE` or `--flag=VALUE`), then `--` and
/// the command.
struct Parser {
    args: std::collections::VecDeque<OsString>,
    pending: Option<OsString>,
    rest: Vec<OsString>,
    /// Options already given, by their long name: a repeated option is a usage error rather
    /// than a silent "last one wins" (issue 10).
    seen: Vec<&'static str>,
}

impl Parser {
    fn new(args: Vec<OsString>) -> Parser {
        Parser {
            args: args.into(),
            pending: None,
            rest: Vec::new(),
            seen: Vec::new(),
        }
    }

    fn next_flag(&mut self) -> Result<Option<String>, Usage> {
        let Some(a) = self.args.pop_front() else {
            return Ok(None);
        };
        let s = a
            .to_str()
            .ok_or_else(|| Usage(format!("unexpected argument {a:?}")))?
            .to_string();
        if s == "--" {
            self.rest = self.args.drain(..).collect();
            return Ok(None);
        }
        if !s.starts_with('-') {
            // The command may follow the options without `--`, as with flock(1).
            self.rest = std::iter::once(a).chain(self.args.drain(..)).collect();
            return Ok(None);
        }
        let s = match s.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                self.pending = Some(value.into());
                flag.to_string()
            }
            _ => s,
        };
        // `--env-allow` adds to a list, so it may be repeated; every other option is given
        // at most once.
        if let Some(long) = canonical(&s)
            && long != "--env-allow"
        {
            self.once(long)?;
        }
        Ok(Some(s))
    }

    /// Records that the option `long` was given; a second time is a usage error (exit 64).
    fn once(&mut self, long: &'static str) -> Result<(), Usage> {
        if self.seen.contains(&long) {
            return Err(Usage(format!("{long} was given twice; give it once")));
        }
        self.seen.push(long);
        Ok(())
    }

    fn value(&mut self, flag: &str) -> Result<OsString, Usage> {
        if let Some(v) = self.pending.take() {
            return Ok(v);
        }
        self.args
            .pop_front()
            .ok_or_else(|| Usage(format!("{flag} needs a value")))
    }

    fn path(&mut self, flag: &str) -> Result<PathBuf, Usage> {
        let v = self.value(flag)?;
        if v.is_empty() {
            return Err(Usage(format!("{flag} needs a non-empty path")));
        }
        Ok(PathBuf::from(v))
    }

    /// A duration in seconds (`1.5`, `10`) or with a unit (`500ms`, `2s`, `1m`). Negative,
    /// non-finite and (unless `zero_ok`) zero durations are usage errors (card H6).
    fn duration(&mut self, flag: &str, zero_ok: bool) -> Result<Duration, Usage> {
        let v = self.value(flag)?;
        let s = v.to_str().unwrap_or("");
        parse_duration(s, zero_ok).map_err(|why| Usage(format!("{flag} {s:?}: {why}")))
    }

    fn rest(self) -> Vec<OsString> {
        self.rest
    }

    fn no_rest(mut self, sub: &str) -> Result<(), Usage> {
        while self.next_flag()?.is_some() {}
        if !self.rest.is_empty() {
            return Err(Usage(format!("{sub} takes no command")));
        }
        Ok(())
    }
}

fn parse_duration(s: &str, zero_ok: bool) -> Result<Duration, &'static str> {
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("expected a non-negative number of seconds, e.g. 1.5, 500ms or 2m");
    }
    let secs: f64 = num.parse().map_err(|_| "not a number of seconds")?;
    let secs = secs * scale;
    if !secs.is_finite() || secs > 1e9 {
        return Err("too large");
    }
    // A duration too small to be represented (it rounds to zero nanoseconds) is zero.
    let d = Duration::from_secs_f64(secs);
    if d.is_zero() && !zero_ok {
        return Err("must be greater than zero");
    }
    Ok(d)
}
