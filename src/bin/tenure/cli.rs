//! The command line: clap definitions, the value parsers that name what they accept, and the
//! translation of clap's errors into the runner's usage messages (exit 64).
//!
//! Every check here runs before anything touches the disk (card H6): a bad value, a repeated
//! option or a contradiction is a usage error and the state dir is not even opened.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// The top-level usage lines (clap's `Usage:` section).
const USAGE: &str = "\
tenure run    [--dir DIR] [options] -- CMD [ARGS...]
       tenure up     [--dir DIR] [--wait S] [run options] -- CMD [ARGS...]
       tenure stop   [--dir DIR] [--grace S]
       tenure status [--dir DIR] [--json]
       tenure verify [--dir DIR]
       tenure init   [--dir DIR] [--adopt]
       tenure checkpoint list|show N|rollback --to N [--dir DIR]
       tenure completions bash|zsh|fish
       tenure man [COMMAND]
       tenure demo";

/// What `tenure --help` says after the list of commands.
const AFTER_HELP: &str = "\
DIR defaults to $TENURE_DIR. Durations are seconds (1.5) or carry units (250ms, 2s, 1h30m).
Run options (`tenure run --help`): --wait, --nonblock, --grace, --kill-wait, --type, --ready-timeout,
--pidfile, --kill-mode, --hup, --watchdog, --cgroup, --user, --env-allow, --keep, --trace,
and the cluster lease (`etcd` feature, spec/cluster.md): --lease, --lease-ttl, --store.

THE CHILD GETS:
    TENURE_DIR              the state dir
    TENURE_EPOCH            this ownership's fencing epoch
    TENURE_CHECKPOINT       a read-only copy of the current checkpoint (unset when none)
    TENURE_CHECKPOINT_OUT   an empty dir: files left here after exit 0 become the next checkpoint
    NOTIFY_SOCKET           with --type notify: send READY=1 here (sd_notify protocol)

LIFECYCLE:
    cold -> recovering -> ready -> draining -> released, or cancelled / refused.
    SIGTERM, SIGINT or SIGHUP while waiting cancels; while recovering refuses (nothing is
    published); while ready drains: the signal is forwarded, the grace runs, SIGKILL follows,
    the checkpoint is published if the main process exited 0, then the lease is released. The
    lease is never released while any process of the workload may still run. Every other
    signal (USR1, USR2, WINCH, QUIT, ... and HUP while ready) is forwarded to the workload.

EXIT CODES (spec/runner.md, spec/lifecycle.md):
    run, up:   N the child's own code when it exits by itself; 128+N stopped (or cancelled, or
               refused while recovering) by signal N, e.g. 143; 137 the child was killed after
               the grace; 126/127 the command could not be executed / was not found
    all:       64 usage error   65 refused state   69 not ready, or watchdog
               70 did not stop  74 I/O or publish error   75 busy (-E to change)
               76 the cluster lease was lost (--lease)
    status:    0 owned   3 not running   4 unknown or refused (LSB)
    stop:      0 stopped in order, or nothing was running; 137 killed after the grace
";

/// tenure — run a command as the single owner of a state directory.
#[derive(Debug, Parser)]
#[command(
    name = "tenure",
    version,
    about = "Run a command as the single owner of a state directory",
    override_usage = USAGE,
    after_help = AFTER_HELP,
    subcommand_required = true,
    disable_help_subcommand = true,
    max_term_width = 100
)]
pub struct Cli {
    /// Print warnings and errors only, not the progress of the run
    // Not `global`: clap merges a global flag given before and after the command into one
    // without complaint. Each command that works on a dir has its own (`DirArg`), and
    // `main` refuses both at once as a repeated option.
    #[arg(short, long)]
    pub quiet: bool,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// `--quiet` given before the command and `--quiet` given after it; `None` when both.
    pub fn quiet(&self) -> Option<bool> {
        let after = match &self.command {
            Command::Run(a) | Command::Up(a) => a.dir.quiet,
            Command::Stop(a) => a.dir.quiet,
            Command::Status(a) => a.dir.quiet,
            Command::Verify(a) => a.dir.quiet,
            Command::Init(a) => a.dir.quiet,
            Command::Checkpoint(
                CheckpointCommand::List { dir, .. }
                | CheckpointCommand::Show { dir, .. }
                | CheckpointCommand::Rollback { dir, .. },
            ) => dir.quiet,
            Command::Completions { .. }
            | Command::Man { .. }
            | Command::Demo
            | Command::DemoChild => false,
        };
        if after && self.quiet {
            None
        } else {
            Some(after || self.quiet)
        }
    }
}

/// The subcommands.
// Each command's options are defined only when that command is parsed (`defer`): building all
// of them was most of the runner's start-up after the process itself (issue 11: `tenure run
// -- true` against `flock`). Help, completions and man pages build them all, as before. The
// structs of options carry plain comments, not doc comments: a deferred struct's doc comment
// would replace the command's own description.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Own DIR, recover from its checkpoint, run CMD, drain on a stop signal, publish, release
    Run(RunArgs),
    /// Connect or spawn: print the ready owner's registration, or launch one detached owner
    /// and wait for it (--wait, default 30s)
    Up(RunArgs),
    /// Stop the owner of DIR: SIGTERM, wait for its orderly release, SIGKILL after the grace
    Stop(StopArgs),
    /// Show the owner, waiters, workload and checkpoint of DIR (exit 0 owned, 3 not running,
    /// 4 unknown)
    Status(StatusArgs),
    /// Verify the current checkpoint, naming the bad file; changes nothing
    Verify(VerifyArgs),
    /// Create DIR with its identity marker, or adopt a non-empty or moved one
    Init(InitArgs),
    /// List, show and roll back checkpoints
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Print a shell completion script (e.g. `tenure completions bash > /etc/bash_completion.d/tenure`)
    Completions {
        /// The shell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page of tenure, or of one command (e.g. `tenure man run | man -l -`)
    Man {
        /// The command whose page to print (default: the whole tool)
        command: Option<String>,
    },
    /// The whole lifecycle in a temporary dir, printed as it happens
    Demo,
    /// The demo's own child process; not part of the command-line contract.
    #[command(name = "demo-child", hide = true)]
    DemoChild,
}

// `--dir` and `--quiet`, shared by every command that works on a state dir.
#[derive(Debug, Args)]
pub struct DirArg {
    /// Print warnings and errors only, not the progress of the run
    #[arg(short, long)]
    pub quiet: bool,
    /// The state directory
    #[arg(
        short,
        long,
        value_name = "DIR",
        env = "TENURE_DIR",
        hide_env_values = true,
        value_parser = path_parser()
    )]
    pub dir: PathBuf,
}

// The cluster lease (issue 14, spec/cluster.md): `--lease`, `--lease-ttl`, `--store`, shared by
// `run`, `up`, `status`, `verify` and `stop`. Accepted by every build so the command line is the
// same; a build without the `etcd` feature refuses them as a usage error.
#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// Own PREFIX on an etcd cluster instead of the lock of --dir (needs the `etcd` feature): the
    /// epoch is the cluster's revision, CURRENT lives on etcd and moves only while the lease
    /// holds; --dir keeps this machine's records
    #[arg(long, value_name = "etcd://HOST:PORT[,HOST:PORT...]/PREFIX")]
    pub lease: Option<String>,
    /// The cluster lease's TTL in whole seconds (default 10); a lost lease kills the workload at
    /// once and the run exits 76
    #[arg(long, value_name = "S", value_parser = duration, allow_hyphen_values = true)]
    pub lease_ttl: Option<Duration>,
    /// With --lease: blobs and manifests go to DIR, a directory the machines share (default: the
    /// store inside --dir)
    #[arg(long, value_name = "DIR", value_parser = path_parser())]
    pub store: Option<PathBuf>,
}

// The options of `verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub dir: DirArg,
    #[command(flatten)]
    pub lease: LeaseArgs,
}

// The options of `run` and `up`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub dir: DirArg,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// Wait at most this long for the lease (default: forever; for `up`, how long to wait for
    /// a ready owner, default 30s)
    #[arg(short, long, visible_alias = "timeout", value_name = "S", value_parser = duration_zero_ok, allow_hyphen_values = true)]
    pub wait: Option<Duration>,
    /// Do not wait: exit busy at once if the lease is held
    #[arg(short, long)]
    pub nonblock: bool,
    /// Exit code when busy
    #[arg(short = 'E', long, value_name = "N", default_value_t = tenure::machine::EXIT_BUSY,
          value_parser = exit_code, allow_hyphen_values = true)]
    pub conflict_exit_code: u8,
    /// After forwarding a stop signal, wait this long, then SIGKILL
    #[arg(long, value_name = "S", default_value = GRACE_DEFAULT, value_parser = duration, allow_hyphen_values = true)]
    pub grace: Duration,
    /// After SIGKILL, wait this long before reporting `did not stop`
    #[arg(long, value_name = "S", default_value = KILL_WAIT_DEFAULT, value_parser = duration, allow_hyphen_values = true)]
    pub kill_wait: Duration,
    /// Ready when spawned (simple), when the workload sends READY=1 (notify), or when the first
    /// process exits 0 leaving its daemon behind (forking)
    #[arg(long = "type", value_name = "TYPE", value_enum)]
    pub service_type: Option<ServiceType>,
    /// The same as --type simple|notify
    #[arg(long, value_name = "MODE", value_enum)]
    pub ready: Option<ReadyArg>,
    /// With notify or forking: stop the workload if it is not ready in time
    #[arg(long, value_name = "S", value_parser = duration, allow_hyphen_values = true)]
    pub ready_timeout: Option<Duration>,
    /// With forking: ready once FILE names the daemon's main process
    #[arg(long, value_name = "FILE", value_parser = path_parser())]
    pub pidfile: Option<PathBuf>,
    /// Stop signals go to every process at once (tree; the default), or to the main process
    /// first (main; the default for forking)
    #[arg(long, value_name = "MODE", value_enum)]
    pub kill_mode: Option<KillModeArg>,
    /// SIGHUP is forwarded to the workload, or stops it
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = HUP_DEFAULT)]
    pub hup: HupArg,
    /// The ready workload must send WATCHDOG=1 this often (it gets WATCHDOG_USEC)
    #[arg(long, value_name = "S", value_parser = duration, allow_hyphen_values = true)]
    pub watchdog: Option<Duration>,
    /// Contain the workload in a cgroup of its own where possible (auto), or never (off)
    #[arg(long, value_name = "MODE", value_enum, default_value_t = CGROUP_DEFAULT)]
    pub cgroup: CgroupArg,
    /// Run the child as this user (and group; numeric ids too); needs root
    #[arg(long, value_name = "USER[:GROUP]", value_parser = user_spec)]
    pub user: Option<UserSpec>,
    /// Pass only these variables (plus TENURE_*) to the child; may be repeated
    #[arg(long, value_name = "VAR,...", value_parser = env_list, action = clap::ArgAction::Append)]
    pub env_allow: Vec<EnvList>,
    /// Checkpoints kept by garbage collection
    #[arg(long, value_name = "K", default_value_t = KEEP_DEFAULT, value_parser = keep)]
    pub keep: usize,
    /// Write every lifecycle step as JSONL to FILE
    #[arg(long, value_name = "FILE", value_parser = path_parser())]
    pub trace: Option<PathBuf>,
    /// The command and its arguments (after `--`, or after the last option)
    #[arg(value_name = "CMD", trailing_var_arg = true)]
    pub command: Vec<OsString>,
}

// The options of `stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    #[command(flatten)]
    pub dir: DirArg,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// Wait this long for an orderly release before SIGKILL (longer than the runner's own
    /// grace, so the owner can stop its workload and publish first)
    #[arg(long, value_name = "S", default_value = "30s", value_parser = duration, allow_hyphen_values = true)]
    pub grace: Duration,
}

// The options of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub dir: DirArg,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// Print JSON (also on a refusal: an `error` object with the exit code and message)
    #[arg(long)]
    pub json: bool,
}

// The options of `init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Adopt a non-empty or moved dir (the only way past the foreign-state refusals)
    #[arg(long)]
    pub adopt: bool,
}

/// `tenure checkpoint ...`.
#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {
    /// Every checkpoint of DIR (id, epoch, time, files, size, whether it verifies) and the kept
    /// outputs of failed publishes
    List {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// One checkpoint and its files, verified
    Show {
        #[command(flatten)]
        dir: DirArg,
        /// The checkpoint id
        #[arg(value_name = "N", value_parser = checkpoint_id)]
        id: u64,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Make checkpoint N current again: verify it, take the lease, publish its files as a new
    /// checkpoint under a new epoch. Nothing newer is deleted; garbage collection (--keep)
    /// removes old checkpoints as after any publish
    Rollback {
        #[command(flatten)]
        dir: DirArg,
        /// The checkpoint to go back to
        #[arg(long, value_name = "N", value_parser = checkpoint_id)]
        to: u64,
        /// Wait at most this long for the lease (default: do not wait)
        #[arg(short, long, value_name = "S", value_parser = duration_zero_ok, allow_hyphen_values = true)]
        wait: Option<Duration>,
        /// Checkpoints kept by garbage collection after the publish
        #[arg(long, value_name = "K", default_value_t = KEEP_DEFAULT, value_parser = keep)]
        keep: usize,
    },
}

/// The default of `--grace`.
const GRACE_DEFAULT: &str = "10s";
/// The default of `--kill-wait`.
const KILL_WAIT_DEFAULT: &str = "5s";
/// The default of `--hup`.
const HUP_DEFAULT: HupArg = HupArg::Forward;
/// The default of `--cgroup`.
const CGROUP_DEFAULT: CgroupArg = CgroupArg::Auto;
/// The default of `--keep` (of `run`, `up` and `checkpoint rollback`).
const KEEP_DEFAULT: usize = 2;

/// The command line `tenure run --dir DIR -- CMD [ARGS...]` (also `-d DIR` and `--dir=DIR`),
/// the form scripts and supervisors write, read without clap; `None` for any other command
/// line, which clap parses as before. Building clap's parser and its first parse cost about
/// 0.12 ms of every run on the reference machine (most of it the first touch of clap's code),
/// a third of what the runner had to lose against `flock(1)` (issue 11). On what this accepts
/// it returns what clap returns, defaults included (test `plain_run_is_what_clap_parses`):
/// every other option, a second `--dir`, a DIR that starts with `-`, `--quiet`, help and
/// usage errors are left to clap.
pub fn plain_run(args: &[OsString]) -> Option<Cli> {
    use std::os::unix::ffi::OsStrExt as _;
    let [_, cmd, rest @ ..] = args else {
        return None;
    };
    if cmd != "run" {
        return None;
    }
    let (dir, command) = match rest {
        [flag, dir, sep, command @ ..] if (flag == "--dir" || flag == "-d") && sep == "--" => {
            (dir.clone(), command)
        }
        [flag, sep, command @ ..] if sep == "--" => (
            OsString::from(std::ffi::OsStr::from_bytes(
                flag.as_bytes().strip_prefix(b"--dir=")?,
            )),
            command,
        ),
        _ => return None,
    };
    // Clap reads `-d -x` as two options, and a missing command is its usage error to report.
    if dir.as_bytes().first() == Some(&b'-') || command.is_empty() {
        return None;
    }
    let dir = non_empty_path(dir).ok()?;
    Some(Cli {
        quiet: false,
        command: Command::Run(RunArgs {
            dir: DirArg { quiet: false, dir },
            lease: LeaseArgs {
                lease: None,
                lease_ttl: None,
                store: None,
            },
            wait: None,
            nonblock: false,
            conflict_exit_code: tenure::machine::EXIT_BUSY,
            grace: duration(GRACE_DEFAULT).ok()?,
            kill_wait: duration(KILL_WAIT_DEFAULT).ok()?,
            service_type: None,
            ready: None,
            ready_timeout: None,
            pidfile: None,
            kill_mode: None,
            hup: HUP_DEFAULT,
            watchdog: None,
            cgroup: CGROUP_DEFAULT,
            user: None,
            env_allow: Vec::new(),
            keep: KEEP_DEFAULT,
            trace: None,
            command: command.to_vec(),
        }),
    })
}

/// `--type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServiceType {
    /// Ready when spawned
    Simple,
    /// Ready when the workload sends READY=1
    Notify,
    /// Ready when the first process exits 0 leaving its daemon behind
    Forking,
}

/// `--ready` (the older spelling of `--type simple|notify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadyArg {
    /// Ready when spawned
    Start,
    /// Ready when the workload sends READY=1
    Notify,
}

/// `--kill-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KillModeArg {
    /// Every process of the workload at once
    Tree,
    /// The main process first, then what remains
    Main,
}

/// `--hup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HupArg {
    /// Forward SIGHUP to the workload
    Forward,
    /// SIGHUP stops like SIGTERM
    Stop,
}

/// `--cgroup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CgroupArg {
    /// A cgroup per ownership where cgroup v2 is writable
    Auto,
    /// Subreaper and inherited lock only
    Off,
}

/// One `--env-allow` list.
#[derive(Debug, Clone)]
pub struct EnvList(pub Vec<OsString>);

/// `--user USER[:GROUP]` as given; names are resolved when the run starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSpec {
    /// A user name or a numeric uid.
    pub user: String,
    /// A group name or a numeric gid; the user's primary group when absent.
    pub group: Option<String>,
}

/// A value a parser refused, and why: rendered with the option's name by [`usage_message`].
#[derive(Debug)]
struct BadValue(String);

impl std::fmt::Display for BadValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadValue {}

fn bad(why: impl Into<String>) -> BadValue {
    BadValue(why.into())
}

/// A path that is not empty (any bytes: paths need not be UTF-8).
fn path_parser() -> impl clap::builder::TypedValueParser<Value = PathBuf> {
    use clap::builder::TypedValueParser as _;
    clap::builder::OsStringValueParser::new().try_map(non_empty_path)
}

fn non_empty_path(s: OsString) -> Result<PathBuf, BadValue> {
    if s.is_empty() {
        return Err(bad("needs a non-empty path"));
    }
    Ok(PathBuf::from(s))
}

fn duration(s: &str) -> Result<Duration, BadValue> {
    parse_duration(s, false).map_err(bad)
}

fn duration_zero_ok(s: &str) -> Result<Duration, BadValue> {
    parse_duration(s, true).map_err(bad)
}

fn exit_code(s: &str) -> Result<u8, BadValue> {
    s.parse()
        .map_err(|_| bad("takes an exit code from 0 to 255"))
}

fn keep(s: &str) -> Result<usize, BadValue> {
    s.parse()
        .ok()
        .filter(|k| *k >= 1)
        .ok_or_else(|| bad("takes a whole number of at least 1"))
}

fn checkpoint_id(s: &str) -> Result<u64, BadValue> {
    s.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
        bad("takes a checkpoint id: a whole number of at least 1 (see `tenure checkpoint list`)")
    })
}

fn env_list(s: &str) -> Result<EnvList, BadValue> {
    let list: Vec<OsString> = s
        .split(',')
        .filter(|s| !s.is_empty())
        .map(OsString::from)
        .collect();
    for name in &list {
        if !tenure::driver::child::valid_env_name(name) {
            return Err(bad(format!("{name:?} is not a variable name")));
        }
    }
    Ok(EnvList(list))
}

fn user_spec(s: &str) -> Result<UserSpec, BadValue> {
    let (user, group) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    let word = |w: &str| {
        !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'))
    };
    if !word(user) || group.is_some_and(|g| !word(g)) {
        return Err(bad(
            "takes USER or USER:GROUP (names or numeric ids, e.g. nobody, 65534:65534)",
        ));
    }
    Ok(UserSpec {
        user: user.to_owned(),
        group: group.map(str::to_owned),
    })
}

/// The largest duration accepted: timers add it to the monotonic clock.
const MAX_SECS: f64 = 1e9;

/// A duration: seconds (`1.5`, `10`), a number with one unit (`500ms`, `2s`, `0.5h`), or
/// humantime's forms (`1h30m`, `2min 5s`). Negative, non-finite and (unless `zero_ok`) zero
/// durations are refused (card H6); one that rounds to zero nanoseconds is zero, refused
/// (unless `zero_ok`) as too small, naming the smallest duration (1ns).
pub fn parse_duration(s: &str, zero_ok: bool) -> Result<Duration, String> {
    const EXPECTED: &str = "expected a duration: seconds (1.5) or with units (250ms, 2s, 1h30m)";
    const TOO_SMALL: &str =
        "too small: it rounds to zero nanoseconds (the smallest duration is 1ns)";
    let decimal = |n: &str| -> Option<f64> {
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return None;
        }
        n.parse().ok()
    };
    let units: [(&str, f64); 9] = [
        ("ns", 1e-9),
        ("us", 1e-6),
        ("µs", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
        ("min", 60.0),
        ("m", 60.0),
        ("h", 3600.0),
        ("d", 86400.0),
    ];
    let secs = match decimal(s) {
        Some(secs) => secs,
        None => match units
            .iter()
            .find_map(|(u, scale)| s.strip_suffix(u).and_then(decimal).map(|n| n * scale))
        {
            Some(secs) => secs,
            None => match humantime::parse_duration(s) {
                Ok(d) => d.as_secs_f64(),
                // Exponent forms are not taken (`1e3`), but one that is too small for any
                // form (`1e-10`) says so: written out it would be refused as too small too.
                Err(_) => {
                    let loose = s.parse::<f64>().ok().or_else(|| {
                        units.iter().find_map(|(u, scale)| {
                            s.strip_suffix(u)
                                .and_then(|n| n.parse::<f64>().ok())
                                .map(|n| n * scale)
                        })
                    });
                    // Below one second first, so that no value can overflow the conversion.
                    return Err(match loose {
                        Some(x)
                            if !zero_ok
                                && x > 0.0
                                && x < 1.0
                                && Duration::from_secs_f64(x).is_zero() =>
                        {
                            TOO_SMALL
                        }
                        _ => EXPECTED,
                    }
                    .into());
                }
            },
        },
    };
    if !secs.is_finite() || secs > MAX_SECS {
        return Err(format!("too large (at most {MAX_SECS:e} seconds)"));
    }
    // A duration too small to be represented (it rounds to zero nanoseconds) is zero: where
    // zero is refused, a positive one is refused as too small, not as zero.
    let d = Duration::from_secs_f64(secs);
    if d.is_zero() && !zero_ok {
        return Err(if secs > 0.0 {
            TOO_SMALL
        } else {
            "must be greater than zero"
        }
        .into());
    }
    Ok(d)
}

/// The first word of a clap context value (`--grace <S>` → `--grace`).
fn context(err: &clap::Error, kind: ContextKind) -> Option<String> {
    match err.get(kind)? {
        ContextValue::String(s) => Some(s.clone()),
        ContextValue::Strings(v) => v.first().cloned(),
        ContextValue::StyledStr(s) => Some(s.to_string()),
        ContextValue::StyledStrs(v) => v.first().map(ToString::to_string),
        ContextValue::Bool(_) | ContextValue::Number(_) | ContextValue::None => None,
        _ => None,
    }
}

fn flag_of(arg: &str) -> String {
    arg.split_whitespace().next().unwrap_or(arg).to_owned()
}

/// `a`, `a or b`, `a, b or c` with backquotes.
fn one_of(values: &[String]) -> String {
    let q: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
    match q.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// What the user asked for when parsing did not produce a [`Cli`].
pub enum Parsed {
    /// Help or version text, printed to stdout, exit 0.
    Print(String),
    /// A usage error: the message (without the `tenure: ` prefix), exit 64.
    Usage(String),
}

/// Translates a clap error into help/version text or a usage message naming the option, the
/// value and what is accepted.
pub fn usage_message(err: clap::Error) -> Parsed {
    let arg = context(&err, ContextKind::InvalidArg).map(|a| flag_of(&a));
    let value = context(&err, ContextKind::InvalidValue);
    let msg = match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            return Parsed::Print(err.render().to_string());
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            "a subcommand is required".to_owned()
        }
        ErrorKind::ArgumentConflict => {
            let prior = context(&err, ContextKind::PriorArg).map(|a| flag_of(&a));
            match (arg, prior) {
                (Some(a), Some(p)) if a == p => format!("{a} was given twice; give it once"),
                (Some(a), Some(p)) => format!("{a} and {p} contradict each other"),
                (a, _) => format!("{} cannot be used here", a.unwrap_or_default()),
            }
        }
        ErrorKind::InvalidValue => {
            let valid: Vec<String> = match err.get(ContextKind::ValidValue) {
                Some(ContextValue::Strings(v)) => v.clone(),
                _ => Vec::new(),
            };
            let flag = arg.unwrap_or_default();
            match value.as_deref() {
                Some("") | None => format!("{flag} needs a value: {}", one_of(&valid)),
                Some(v) => format!("{flag} takes {}, not {v:?}", one_of(&valid)),
            }
        }
        ErrorKind::ValueValidation => {
            let flag = arg.unwrap_or_default();
            let why = std::error::Error::source(&err)
                .map(ToString::to_string)
                .unwrap_or_default();
            match value {
                Some(v) if !why.starts_with("takes") && !why.starts_with("needs") => {
                    format!("{flag} {v:?}: {why}")
                }
                _ => format!("{flag} {why}"),
            }
        }
        ErrorKind::InvalidUtf8 => format!("{} must be UTF-8", arg.unwrap_or_default()),
        ErrorKind::UnknownArgument => format!("unknown option {}", arg.unwrap_or_default()),
        ErrorKind::InvalidSubcommand => format!(
            "unknown subcommand {:?}; expected run, up, stop, status, verify, init, checkpoint, completions, man or demo",
            context(&err, ContextKind::InvalidSubcommand).unwrap_or_default()
        ),
        ErrorKind::MissingRequiredArgument => {
            let missing = context(&err, ContextKind::InvalidArg).unwrap_or_default();
            if missing.starts_with("--dir") {
                "--dir DIR is required (or set TENURE_DIR)".to_owned()
            } else {
                format!("{} is required", flag_of(&missing))
            }
        }
        ErrorKind::NoEquals
        | ErrorKind::TooManyValues
        | ErrorKind::TooFewValues
        | ErrorKind::WrongNumberOfValues
        | ErrorKind::Io
        | ErrorKind::Format => first_line(&err),
        _ => first_line(&err),
    };
    Parsed::Usage(msg)
}

/// clap's own message without its `error: ` prefix and usage block.
fn first_line(err: &clap::Error) -> String {
    let text = err.render().to_string();
    let line = text.lines().next().unwrap_or("invalid arguments");
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

/// The clap command, for completions and man pages.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt as _;

    fn argv(args: &[&[u8]]) -> Vec<OsString> {
        args.iter()
            .map(|a| OsString::from_vec(a.to_vec()))
            .collect()
    }

    /// Issue 11: the command lines `plain_run` reads without clap give exactly what clap gives
    /// them (every default included), and the ones it leaves alone go to clap.
    #[test]
    fn plain_run_is_what_clap_parses() {
        let accepted: &[&[&[u8]]] = &[
            &[b"tenure", b"run", b"--dir", b"D", b"--", b"true"],
            &[
                b"tenure",
                b"run",
                b"-d",
                b"/tmp/x y",
                b"--",
                b"sh",
                b"-c",
                b"exit 3",
            ],
            &[
                b"tenure", b"run", b"--dir=D", b"--", b"cmd", b"--dir", b"x", b"--", b"-q",
            ],
            &[
                b"/usr/bin/tenure",
                b"run",
                b"--dir",
                b"\xff\xfe",
                b"--",
                b"\xfe",
                b"",
            ],
            &[b"tenure", b"run", b"-d", b"D", b"--", b"-x"],
        ];
        for a in accepted {
            let a = argv(a);
            let fast = plain_run(&a).unwrap_or_else(|| panic!("{a:?} is a plain run"));
            let clap = <Cli as Parser>::try_parse_from(&a).expect("clap accepts it");
            assert_eq!(format!("{fast:?}"), format!("{clap:?}"), "{a:?}");
        }
        let left_to_clap: &[&[&[u8]]] = &[
            &[b"tenure", b"run", b"--dir", b"D", b"true"],
            &[b"tenure", b"run", b"--dir", b"D", b"--"],
            &[b"tenure", b"run", b"--dir", b"-x", b"--", b"true"],
            &[b"tenure", b"run", b"--dir", b"--dir=x", b"--", b"true"],
            &[b"tenure", b"run", b"--dir", b"", b"--", b"true"],
            &[b"tenure", b"run", b"--dir=", b"--", b"true"],
            &[b"tenure", b"run", b"--", b"true"],
            &[
                b"tenure", b"run", b"--quiet", b"--dir", b"D", b"--", b"true",
            ],
            &[b"tenure", b"-q", b"run", b"--dir", b"D", b"--", b"true"],
            &[
                b"tenure", b"run", b"--dir", b"D", b"--grace", b"1s", b"--", b"true",
            ],
            &[b"tenure", b"up", b"--dir", b"D", b"--", b"true"],
            &[b"tenure", b"run", b"--help"],
            &[b"tenure"],
        ];
        for a in left_to_clap {
            let a = argv(a);
            assert!(plain_run(&a).is_none(), "{a:?} is left to clap");
        }
    }
}
