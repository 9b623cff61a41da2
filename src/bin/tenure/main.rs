//! The `tenure` runner: parses arguments (`cli.rs`) and hands them to `tenure::driver`. Nothing
//! here touches the state dir; every run is validated before anything on disk changes (card
//! H6). `main → run() -> exit code`, as ripgrep splits it. `main` is the C entry point: std's
//! runtime start-up is replaced by the parts of it the runner needs (`rt.rs`).

// No std `main`: see `rt.rs` (issue 11). The unit tests keep the test harness's `main`.
#![cfg_attr(not(test), no_main)]

mod cli;
#[cfg_attr(test, allow(dead_code))]
mod rt;

use cli::{CheckpointCommand, Cli, Command, Parsed, RunArgs};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use tenure::driver::{
    self, CgroupMode, RunOptions,
    signals::{SignalHold, SignalIntake},
};
use tenure::lease::WaitBound;
use tenure::machine::{EXIT_USAGE, HupPolicy, KillMode, ReadyMode};

// Prints never panic on a closed pipe or stream: see `tenure::stdio`.
macro_rules! print {
    ($($arg:tt)*) => { tenure::stdio::out(format_args!($($arg)*)) };
}
macro_rules! eprintln {
    ($($arg:tt)*) => { tenure::stdio::err(format_args!("{}\n", format_args!($($arg)*))) };
}

// The unwinder comes from GCC's static `libgcc_eh` instead of the shared `libgcc_s` (what
// `gcc -static-libgcc` does for C programs): every command of the runner starts faster without
// loading, relocating and initialising a second shared library (`libgcc_s` probes the CPU with
// `cpuid` in a constructor, a trap to the hypervisor on a VM). The objects of this binary need
// `_Unwind_Resume`, so the archive is searched before the standard library's `-lgcc_s`, which
// `--as-needed` then leaves out. Only the binary links it this way: a program that links the
// library keeps its own unwinder. Issue 11: `tenure run -- true` against `flock`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[link(name = "gcc_eh", kind = "static", modifiers = "-bundle")]
unsafe extern "C" {}

/// The runner's diagnostics: every `log` record of the library, one line on stderr prefixed
/// `tenure: ` (`tenure: warning: ` for warnings), written without ever panicking.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let kind = match record.level() {
            log::Level::Error | log::Level::Info => "",
            log::Level::Warn => "warning: ",
            log::Level::Debug => "debug: ",
            log::Level::Trace => "trace: ",
        };
        eprintln!("tenure: {kind}{}", record.args());
    }

    fn flush(&self) {}
}

/// Installs [`StderrLogger`]: progress, warnings and errors, or (`quiet`) warnings and errors
/// only.
fn install_logger(quiet: bool) {
    static LOGGER: StderrLogger = StderrLogger;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(if quiet {
            log::LevelFilter::Warn
        } else {
            log::LevelFilter::Info
        });
    }
}

/// A usage error: printed with a hint, exit 64, nothing on disk changed.
struct Usage(String);

/// The process's entry point, called by the C runtime (std reads the arguments itself).
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    rt::start(tenure_main)
}

#[cfg_attr(test, allow(dead_code))]
fn tenure_main() -> u8 {
    // Before anything opens a file: a closed stdout must not become a state file's descriptor.
    tenure::stdio::reserve_std_fds();
    let code = match run() {
        Ok(code) => code,
        Err(Usage(msg)) => {
            eprintln!(
                "tenure: {msg}\nRun `tenure --help` for usage (`tenure COMMAND --help` for one command)."
            );
            EXIT_USAGE
        }
    };
    // Stderr never blocked the command; what waited for it goes out before the exit.
    tenure::stdio::flush_err();
    code
}

fn run() -> Result<u8, Usage> {
    // The signals an intake catches are held (blocked, one system call) while the arguments
    // are parsed: `--version`, `--help`, a usage error, `completions` and `man` only print and
    // pay for no signal handlers (when the hold ends, a signal that came meanwhile has its
    // default action), and every other command installs its handlers before the hold ends,
    // so a stop that arrives while it parses is seen (card G1).
    let hold = SignalHold::start();
    let argv: Vec<OsString> = std::env::args_os().collect();
    // The plain `run -- CMD` is read without building clap's parser (issue 11).
    let parsed = match cli::plain_run(&argv) {
        Some(a) => Ok(a),
        None => <Cli as clap::Parser>::try_parse_from(argv),
    };
    let args = match parsed {
        Ok(a) => a,
        Err(e) => {
            return match cli::usage_message(e) {
                Parsed::Print(text) => {
                    print!("{text}");
                    Ok(0)
                }
                Parsed::Usage(msg) => Err(Usage(msg)),
            };
        }
    };
    let Some(quiet) = args.quiet() else {
        return Err(Usage("--quiet was given twice; give it once".into()));
    };
    match &args.command {
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut cli::command(), "tenure", &mut out);
            print!("{}", String::from_utf8_lossy(&out));
            return Ok(0);
        }
        Command::Man { command } => return man(command.as_deref()),
        _ => {}
    }
    // Then signals, before any command touches a state dir: a stop at any moment from here on
    // is seen (card G1).
    let intake = match SignalIntake::install() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("tenure: cannot install signal handlers: {e}");
            return Ok(tenure::machine::EXIT_IO);
        }
    };
    drop(hold);
    install_logger(quiet);
    match args.command {
        Command::Run(a) => {
            let opts = run_options(a)?;
            report(driver::run(&opts, &intake))
        }
        Command::Up(a) => {
            let opts = run_options(a)?;
            Ok(driver::up::up(&opts, &intake))
        }
        Command::Stop(a) => {
            // The owner this machine runs is stopped through its local records; the cluster
            // options are accepted (and checked) so one set of options serves every command.
            cluster_options(&a.lease)?;
            Ok(driver::ops::stop(&a.dir.dir, a.grace))
        }
        Command::Status(a) => {
            #[cfg(feature = "etcd")]
            if let Some((spec, _)) = cluster_options(&a.lease)? {
                return Ok(driver::ops::cluster_status(&a.dir.dir, &spec, a.json));
            }
            #[cfg(not(feature = "etcd"))]
            cluster_options(&a.lease)?;
            Ok(driver::ops::status(&a.dir.dir, a.json))
        }
        Command::Verify(a) => {
            #[cfg(feature = "etcd")]
            if let Some((spec, store)) = cluster_options(&a.lease)? {
                // The store a cluster's CURRENT names is the shared one (or the one in --dir).
                let store = store.unwrap_or(a.dir.dir);
                return Ok(driver::ops::cluster_verify(&spec, &store));
            }
            #[cfg(not(feature = "etcd"))]
            cluster_options(&a.lease)?;
            Ok(driver::ops::verify(&a.dir.dir))
        }
        Command::Init(a) => Ok(driver::ops::init(&a.dir.dir, a.adopt)),
        Command::Checkpoint(c) => Ok(checkpoint(c, &intake)),
        // Printed above, before the signal handlers.
        Command::Completions { .. } | Command::Man { .. } => Ok(0),
        Command::Demo => Ok(driver::demo::demo(&intake)),
        Command::DemoChild => Ok(driver::demo::child(&intake)),
    }
}

fn checkpoint(c: CheckpointCommand, intake: &SignalIntake) -> u8 {
    match c {
        CheckpointCommand::List { dir, json } => driver::ops::checkpoint_list(&dir.dir, json),
        CheckpointCommand::Show { dir, id, json } => {
            driver::ops::checkpoint_show(&dir.dir, id, json)
        }
        CheckpointCommand::Rollback {
            dir,
            to,
            wait,
            keep,
        } => driver::ops::rollback(
            &dir.dir,
            to,
            WaitBound::from_option(Some(wait.unwrap_or_default())),
            keep,
            intake,
        ),
    }
}

/// `tenure man [COMMAND]`: the roff source of tenure(1) or tenure-COMMAND(1).
fn man(command: Option<&str>) -> Result<u8, Usage> {
    let top = cli::command();
    let cmd = match command {
        None => top,
        Some(name) => {
            let Some(sub) = top.find_subcommand(name).filter(|s| !s.is_hide_set()) else {
                return Err(Usage(format!(
                    "man: no command {name:?}; expected one of {}",
                    top.get_subcommands()
                        .filter(|s| !s.is_hide_set())
                        .map(|s| s.get_name().to_owned())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            sub.clone()
                // Built once per process: leaking the name is the simplest `'static` str.
                .name(&*Box::leak(format!("tenure-{name}").into_boxed_str()))
                .version(env!("CARGO_PKG_VERSION"))
        }
    };
    let mut out = Vec::new();
    if let Err(e) = clap_mangen::Man::new(cmd).render(&mut out) {
        eprintln!("tenure: cannot render the man page: {e}");
        return Ok(tenure::machine::EXIT_IO);
    }
    print!("{}", String::from_utf8_lossy(&out));
    Ok(0)
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

/// The options of `run`/`up`, with the checks clap cannot express: contradictions, a
/// missing command, a trace inside the state dir.
/// The cluster lease options (`--lease`, `--lease-ttl`, `--store`), validated before anything
/// is touched: a spec and the shared store, or `None` for the kernel lock of `--dir`.
#[cfg(feature = "etcd")]
fn cluster_options(
    a: &cli::LeaseArgs,
) -> Result<Option<(tenure::cluster::ClusterSpec, Option<PathBuf>)>, Usage> {
    let Some(url) = &a.lease else {
        if a.lease_ttl.is_some() || a.store.is_some() {
            return Err(Usage(
                "--lease-ttl and --store go with --lease etcd://HOST:PORT/PREFIX".into(),
            ));
        }
        return Ok(None);
    };
    let spec = tenure::cluster::ClusterSpec::parse(
        url,
        a.lease_ttl.unwrap_or(tenure::cluster::DEFAULT_TTL),
    )
    .map_err(|e| Usage(e.to_string()))?;
    let store = a
        .store
        .as_ref()
        .map(|s| std::path::absolute(s).unwrap_or_else(|_| s.clone()));
    Ok(Some((spec, store)))
}

/// Without the `etcd` feature the cluster options are a usage error.
#[cfg(not(feature = "etcd"))]
fn cluster_options(a: &cli::LeaseArgs) -> Result<Option<()>, Usage> {
    if a.lease.is_some() || a.lease_ttl.is_some() || a.store.is_some() {
        return Err(Usage(
            "--lease, --lease-ttl and --store need a tenure built with the `etcd` feature (cargo build --features etcd)".into(),
        ));
    }
    Ok(None)
}

fn run_options(a: RunArgs) -> Result<RunOptions, Usage> {
    if a.command.is_empty() {
        return Err(Usage("a command is required after `--`".into()));
    }
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    let cluster = cluster_options(&a.lease)?;
    let ready = match (a.service_type, a.ready) {
        (Some(_), Some(_)) => {
            return Err(Usage(
                "--type and --ready both say when the workload is ready; give one".into(),
            ));
        }
        (Some(cli::ServiceType::Simple), None)
        | (None, Some(cli::ReadyArg::Start))
        | (None, None) => ReadyMode::Start,
        (Some(cli::ServiceType::Notify), None) | (None, Some(cli::ReadyArg::Notify)) => {
            ReadyMode::Notify
        }
        (Some(cli::ServiceType::Forking), None) => ReadyMode::Forking,
    };
    if a.ready_timeout.is_some() && ready == ReadyMode::Start {
        return Err(Usage(
            "--ready-timeout needs --type notify or --type forking".into(),
        ));
    }
    if a.pidfile.is_some() && ready != ReadyMode::Forking {
        return Err(Usage("--pidfile needs --type forking".into()));
    }
    if a.nonblock && a.wait.is_some_and(|w| !w.is_zero()) {
        return Err(Usage("--nonblock and --wait contradict each other".into()));
    }
    // A relative pid file is the daemon's, relative to where tenure was started (the detached
    // owner of `tenure up` runs elsewhere).
    let pid_file = a.pidfile.map(|p| std::path::absolute(&p).unwrap_or(p));
    let kill_mode = match a.kill_mode {
        Some(cli::KillModeArg::Tree) => KillMode::Tree,
        Some(cli::KillModeArg::Main) => KillMode::Main,
        None => match ready {
            ReadyMode::Forking => KillMode::Main,
            ReadyMode::Start | ReadyMode::Notify => KillMode::Tree,
        },
    };
    let dir = a.dir.dir;
    // A trace written into the state dir would itself make the dir look foreign (card L8).
    if let Some(t) = &a.trace
        && is_inside(&dir, t)
    {
        return Err(Usage(format!(
            "--trace {} is inside the state dir {}; write the trace elsewhere",
            t.display(),
            dir.display()
        )));
    }
    let wait = if a.nonblock {
        WaitBound::Try
    } else {
        WaitBound::from_option(a.wait)
    };
    let env_allow = if a.env_allow.is_empty() {
        None
    } else {
        Some(a.env_allow.into_iter().flat_map(|l| l.0).collect())
    };
    let user = match a.user {
        None => None,
        Some(spec) => Some(
            tenure::driver::user::RunAs::resolve(&spec.user, spec.group.as_deref())
                .map_err(|e| Usage(format!("--user: {e}")))?,
        ),
    };
    Ok(RunOptions {
        dir,
        wait,
        grace: a.grace,
        kill_wait: a.kill_wait,
        ready,
        ready_timeout: a.ready_timeout,
        kill_mode,
        hup: match a.hup {
            cli::HupArg::Forward => HupPolicy::Forward,
            cli::HupArg::Stop => HupPolicy::Stop,
        },
        pid_file,
        watchdog: a.watchdog,
        cgroup: match a.cgroup {
            cli::CgroupArg::Auto => CgroupMode::Auto,
            cli::CgroupArg::Off => CgroupMode::Off,
        },
        env_allow,
        keep: a.keep,
        busy_code: a.conflict_exit_code,
        trace: a.trace,
        user,
        command: a.command,
        #[cfg(feature = "etcd")]
        cluster: cluster.as_ref().map(|(c, _)| c.clone()),
        #[cfg(feature = "etcd")]
        store: cluster.and_then(|(_, s)| s),
    })
}

/// Whether `path` lies inside `dir`, compared on absolute paths with existing parts resolved
/// (neither needs to exist; nothing is created).
fn is_inside(dir: &Path, path: &Path) -> bool {
    fn resolve(p: &Path) -> PathBuf {
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
