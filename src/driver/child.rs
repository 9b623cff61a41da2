//! The supervised child: spawned with a restricted environment in a process group of its own
//! (so a signal to the runner's group reaches it only through the runner, once: card T3), inside
//! the ownership's cgroup from before it execs (card T1), held by a pidfd (so it is signalled and
//! reaped by identity, never by a pid that may have been recycled), its stderr teed to ours with
//! the last 4 KiB kept (card D5).

use crate::machine::{ChildStatus, ExecFailure};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::process::{Pid, PidfdFlags, WaitId, WaitIdOptions, pidfd_open, pidfd_send_signal};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{ChildStderr, Command, Stdio};

/// How many bytes of the child's stderr are kept for the end record.
pub const STDERR_TAIL: usize = 4096;

/// What to run and with which environment.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// The program (looked up in `PATH` like a shell does when it has no `/`).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// When set, the child's environment is exactly these inherited variables plus `set`
    /// (card D2); otherwise it inherits everything except `remove`.
    pub allow: Option<Vec<OsString>>,
    /// Variables removed from the inherited environment.
    pub remove: Vec<OsString>,
    /// Variables set for the child (tenure's own, `NOTIFY_SOCKET`).
    pub set: Vec<(OsString, OsString)>,
    /// The workload's cgroup directory: the child is created inside it
    /// (`clone3(CLONE_INTO_CGROUP)`), so nothing it starts is ever outside.
    pub cgroup_dir: Option<RawFd>,
    /// `cgroup.procs` of the same cgroup, open for writing: where the kernel has no
    /// `CLONE_INTO_CGROUP`, the forked child enters the cgroup (writes `0`) before it execs.
    pub cgroup_procs: Option<RawFd>,
    /// Descriptors the child keeps across exec (the shared lock descriptor, the directories
    /// handed to another user); the parent's copies are `O_CLOEXEC`, the child clears the flag
    /// on its own.
    pub inherit: Vec<RawFd>,
    /// Run the child as this user (`--user`): it switches after entering its cgroup and
    /// before it execs.
    pub user: Option<Credentials>,
    /// The runner's process group has the terminal on stdin in the foreground: the child's own
    /// group takes it over, as a shell's foreground job does (so the workload can read the
    /// terminal and Ctrl-C reaches it).
    pub foreground: bool,
}

/// The identity a child switches to before it execs (`--user`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// Real, effective and saved uid.
    pub uid: u32,
    /// Real, effective and saved gid.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

/// In the child, before exec: the supplementary groups, then the gid, then the uid (the order
/// in which each step still has the privilege the next needs). Raw system calls only: the
/// child of `clone3` is not a `fork` that the C library knows about, so its `setuid` (which
/// signals every thread it believes exists) must not run there. Async-signal-safe.
///
/// # Safety
/// Call only in a freshly forked or cloned child, before exec.
unsafe fn switch_user(c: &Credentials) -> io::Result<()> {
    // SAFETY: plain system calls on memory owned by this process; `groups` outlives the call.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, c.groups.len(), c.groups.as_ptr()) != 0
            || libc::syscall(libc::SYS_setresgid, c.gid, c.gid, c.gid) != 0
            || libc::syscall(libc::SYS_setresuid, c.uid, c.uid, c.uid) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether stdin is a terminal whose foreground process group is this process's.
pub fn holds_terminal() -> bool {
    // SAFETY: plain queries of this process's own descriptor 0 and process group.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Makes this process's group the foreground of the terminal on stdin again, after the
/// workload's group had it. A background process group may do so only while it ignores
/// SIGTTOU, so it is ignored for the call.
pub fn take_terminal_back() {
    // SAFETY: the disposition of SIGTTOU is changed for the duration of one `tcsetpgrp` on the
    // thread that runs the event loop; no handler of ours is involved.
    unsafe {
        let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::tcsetpgrp(0, libc::getpgrp());
        libc::signal(libc::SIGTTOU, old);
    }
}

/// In the child, after it has a process group of its own: take the terminal's foreground.
/// Async-signal-safe (system call wrappers only).
fn take_terminal_in_child() {
    // SAFETY: see above; runs in the forked child before exec.
    unsafe {
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::tcsetpgrp(0, libc::getpid());
        libc::signal(libc::SIGTTOU, libc::SIG_DFL);
    }
}

/// Why the child could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot execute {program:?}: {source} [{errno}]")]
pub struct SpawnError {
    /// The program.
    pub program: OsString,
    /// 127 (not found) or 126 (not executable).
    pub failure: ExecFailure,
    /// The errno's name, e.g. `ENOENT`.
    pub errno: &'static str,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// A running (or exited, not yet reaped) child.
pub struct Child {
    pid: u32,
    pidfd: OwnedFd,
    stderr: Option<ChildStderr>,
    tail: VecDeque<u8>,
    dropped: bool,
    status: Option<ChildStatus>,
}

/// The errno name for the messages (`ENOENT`, ...), as operators search for it.
pub fn errno_name(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(2) => "ENOENT",
        Some(13) => "EACCES",
        Some(8) => "ENOEXEC",
        Some(20) => "ENOTDIR",
        Some(21) => "EISDIR",
        Some(26) => "ETXTBSY",
        Some(40) => "ELOOP",
        Some(7) => "E2BIG",
        Some(12) => "ENOMEM",
        Some(36) => "ENAMETOOLONG",
        Some(1) => "EPERM",
        _ => "EIO",
    }
}

/// The child's whole environment: the inherited variables (all, or the allowlist), minus
/// `remove`, plus `set`.
fn child_env(spec: &SpawnSpec) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = match &spec.allow {
        Some(allow) => allow
            .iter()
            .filter_map(|n| std::env::var_os(n).map(|v| (n.clone(), v)))
            .collect(),
        None => std::env::vars_os().collect(),
    };
    env.retain(|(k, _)| !spec.remove.contains(k) && !spec.set.iter().any(|(s, _)| s == k));
    env.extend(spec.set.iter().cloned());
    env
}

fn spawn_error(spec: &SpawnSpec, source: io::Error) -> SpawnError {
    let failure = match source.kind() {
        io::ErrorKind::NotFound => ExecFailure::NotFound,
        _ if source.raw_os_error() == Some(20) => ExecFailure::NotFound,
        _ => ExecFailure::NotExecutable,
    };
    SpawnError {
        program: spec.program.clone(),
        failure,
        errno: errno_name(&source),
        source,
    }
}

impl Child {
    /// Starts the child. It gets SIGKILL if this process dies first (so a crashed runner never
    /// leaves an unsupervised child behind while a successor takes the lease). With a cgroup it
    /// is created inside it by `clone3(CLONE_INTO_CGROUP)`: moving a forked child in through
    /// `cgroup.procs` costs the kernel an RCU grace period (about 10 ms on a busy machine, a
    /// third of a whole `tenure run -- true`), creating it there costs nothing.
    ///
    /// Without a cgroup the same `clone3` starts it (sharing this process's memory until its
    /// exec, as `posix_spawn` does), not a `fork` that copies the runner's address space; the
    /// fork remains for a kernel without `clone3`.
    pub fn spawn(spec: &SpawnSpec) -> Result<Child, SpawnError> {
        // A spec with only `cgroup.procs` asks for the fork that enters the cgroup through it.
        if (spec.cgroup_dir.is_some() || spec.cgroup_procs.is_none())
            && let Some(child) = clone3::spawn(spec, spec.cgroup_dir)?
        {
            return Ok(child);
        }
        Child::spawn_forked(spec)
    }

    /// `fork` + `exec` through `std::process::Command`, entering the cgroup (if any) through
    /// `cgroup.procs`: for a kernel without `clone3` (or without `CLONE_INTO_CGROUP`).
    fn spawn_forked(spec: &SpawnSpec) -> Result<Child, SpawnError> {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args);
        cmd.env_clear();
        cmd.envs(child_env(spec));
        cmd.stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped());
        // A process group of its own: a signal to the runner's group (Ctrl-C, systemd's
        // KillMode=control-group) reaches the child only through the runner, once.
        cmd.process_group(0);
        let parent = rustix::process::getpid();
        let (procs, foreground) = (spec.cgroup_procs, spec.foreground);
        let (inherit, user) = (spec.inherit.clone(), spec.user.clone());
        // SAFETY: the closure runs in the forked child before exec and only makes raw system
        // calls (write, fcntl, prctl, getppid) on descriptors the parent keeps open until the
        // spawn returns; they are async-signal-safe, and it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if foreground {
                    // The group exists already (`process_group` runs first); setpgid is
                    // idempotent and makes that independent of std's order.
                    rustix::process::setpgid(None, None)?;
                    take_terminal_in_child();
                }
                if let Some(fd) = procs {
                    // Into the workload's cgroup before anything else can fork.
                    rustix::io::write(BorrowedFd::borrow_raw(fd), b"0")?;
                }
                for fd in &inherit {
                    rustix::io::fcntl_setfd(
                        BorrowedFd::borrow_raw(*fd),
                        rustix::io::FdFlags::empty(),
                    )?;
                }
                // After the cgroup (entering it needs the runner's rights) and before the
                // parent-death signal (a change of uid clears it).
                if let Some(c) = &user {
                    switch_user(c)?;
                }
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))?;
                // The parent may have died between fork and prctl: then nobody would kill us.
                if rustix::process::getppid() != Some(parent) {
                    return Err(io::Error::from_raw_os_error(3));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| spawn_error(spec, source))?;
        let pid = child.id();
        // We are the parent and have not reaped it, so the pid cannot have been recycled.
        let raw = Pid::from_raw(pid as i32).expect("a spawned child has a positive pid");
        let pidfd = match pidfd_open(raw, PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SpawnError {
                    program: spec.program.clone(),
                    failure: ExecFailure::NotExecutable,
                    errno: errno_name(&e.into()),
                    source: io::Error::other("pidfd_open failed for the child"),
                });
            }
        };
        let stderr = child.stderr.take();
        if let Some(s) = &stderr {
            let _ = rustix::io::ioctl_fionbio(s, true);
        }
        // The std handle is not needed any more: the pidfd reaps. Forget it without waiting.
        drop(child);
        Ok(Child::started(pid, pidfd, stderr))
    }

    fn started(pid: u32, pidfd: OwnedFd, stderr: Option<ChildStderr>) -> Child {
        Child {
            pid,
            pidfd,
            stderr,
            tail: VecDeque::with_capacity(STDERR_TAIL),
            dropped: false,
            status: None,
        }
    }

    /// The child's pid (for records and messages; never used to signal it).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Makes `pid` the main process from now on (a forking daemon's, named by its pid file or
    /// the only child left): it must be a child of this process (the subreaper adopted it when
    /// its parent exited), so its exit status can be read. The stderr pipe stays as it was: the
    /// daemon may still write to it.
    pub fn adopt(&mut self, pid: u32) -> io::Result<()> {
        let raw = Pid::from_raw(pid as i32).ok_or_else(|| io::Error::other("pid 0"))?;
        let pidfd = pidfd_open(raw, PidfdFlags::empty())?;
        self.pid = pid;
        self.pidfd = pidfd;
        self.status = None;
        Ok(())
    }

    /// The pidfd; readable once the child exited.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// The stderr pipe, while open.
    pub fn stderr_fd(&self) -> Option<BorrowedFd<'_>> {
        self.stderr.as_ref().map(|s| s.as_fd())
    }

    /// Whether the child has exited (reaped or not).
    pub fn has_exited(&self) -> bool {
        if self.status.is_some() {
            return true;
        }
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        matches!(poll(&mut fds, Some(&rustix::time::Timespec::default())), Ok(n) if n > 0)
    }

    /// Sends `sig` through the pidfd unless the child already exited: a run that ended by itself
    /// is never signalled afterwards (card R1). Returns whether the signal was sent.
    pub fn signal(&self, sig: rustix::process::Signal) -> io::Result<bool> {
        if self.has_exited() {
            return Ok(false);
        }
        match pidfd_send_signal(&self.pidfd, sig) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::SRCH) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Reaps the child if it exited; `None` while it runs.
    pub fn try_reap(&mut self) -> io::Result<Option<ChildStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let st = rustix::process::waitid(
            WaitId::PidFd(self.pidfd.as_fd()),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        )?;
        let Some(st) = st else { return Ok(None) };
        let status = if let Some(sig) = st.terminating_signal() {
            ChildStatus::Signaled(sig as u8)
        } else if let Some(code) = st.exit_status() {
            ChildStatus::Exited(code as u8)
        } else {
            return Ok(None);
        };
        // All of what the pipe still holds: the tail is complete when the exit is reported.
        self.pump_stderr(true);
        self.status = Some(status);
        Ok(Some(status))
    }

    /// Copies what the child wrote to stderr to our stderr and keeps the last 4 KiB. Returns
    /// false once the pipe reached end of file. Our stderr never blocks this (see
    /// [`crate::stdio`]): unless `all`, reading stops while [`crate::stdio::ERR_RELAY_ROOM`]
    /// bytes wait for it, and the child waits in its own `write` meanwhile. One call reads at
    /// most 1 MiB (more than a pipe holds), so a workload that writes as fast as this reads
    /// never keeps the caller from its other work.
    pub fn pump_stderr(&mut self, all: bool) -> bool {
        let Some(pipe) = self.stderr.as_mut() else {
            return false;
        };
        let mut buf = [0u8; 8192];
        let mut budget = 1usize << 20;
        loop {
            if budget == 0 || (!all && !crate::stdio::err_relay_room()) {
                return true;
            }
            match pipe.read(&mut buf) {
                Ok(0) => {
                    self.stderr = None;
                    return false;
                }
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    crate::stdio::err_bytes(&buf[..n]);
                    for &b in &buf[..n] {
                        if self.tail.len() == STDERR_TAIL {
                            self.tail.pop_front();
                            self.dropped = true;
                        }
                        self.tail.push_back(b);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.stderr = None;
                    return false;
                }
            }
        }
    }

    /// The last 4 KiB of the child's stderr and whether earlier bytes were dropped (exactly
    /// 4 KiB is not truncated).
    pub fn stderr_tail(&self) -> (Vec<u8>, bool) {
        (self.tail.iter().copied().collect(), self.dropped)
    }
}

/// Splits `KEY=VALUE` lists and checks environment variable names for `--env-allow`.
pub fn valid_env_name(name: &OsStr) -> bool {
    let b = name.as_encoded_bytes();
    !b.is_empty()
        && !b[0].is_ascii_digit()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Spawning with `clone3(CLONE_PIDFD)`, straight into the workload's cgroup when there is one
/// (`CLONE_INTO_CGROUP`, Linux ≥ 5.7).
///
/// On x86-64 the child shares this process's memory until it execs (`CLONE_VM | CLONE_VFORK`,
/// what `posix_spawn` does): a copy of the runner's address space, write-protected in the
/// parent until the child's exec threw it away, was the larger part of starting a workload
/// (issue 11: `tenure run -- true` against `flock`). The child runs on a stack of its own while
/// the calling thread waits for its exec; elsewhere it is a copy, as after `fork`. Either way it
/// may only make async-signal-safe calls until it execs, and with shared memory it must write
/// nothing the parent reads: everything it needs (argv, envp, every candidate path of the
/// `PATH` search, the `/bin/sh` fallback for a script without `#!`) is built here first. Signals
/// are blocked in the calling thread across the clone; the child resets every handler that
/// could run on the parent's memory (the intake's own handler does nothing in a child, see
/// `signals::INSTALLER`), then does what `std::process::Command` does for the other path — its
/// own process group, an empty signal mask, SIGPIPE back to its default, stderr onto the pipe —
/// plus the parent-death signal, and reports an `exec` failure's errno through a close-on-exec
/// pipe before `_exit(127)`.
mod clone3 {
    use super::{Child, SpawnError, SpawnSpec, child_env, spawn_error};
    use std::ffi::{CString, OsStr, OsString};
    use std::io::{self, Read};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::os::unix::ffi::OsStrExt;
    use std::process::ChildStderr;

    const CLONE_PIDFD: u64 = 0x1000;
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    #[cfg(target_arch = "x86_64")]
    const CLONE_VM: u64 = 0x100;
    #[cfg(target_arch = "x86_64")]
    const CLONE_VFORK: u64 = 0x4000;
    /// The stack of a child that shares our memory: enough for the calls it makes before its
    /// exec and a signal frame; only the pages it touches are ever faulted in.
    #[cfg(target_arch = "x86_64")]
    const CHILD_STACK: usize = 64 * 1024;

    /// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }

    fn cstring(s: &OsStr) -> io::Result<CString> {
        CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    /// A null-terminated array of pointers into `strings` (which must outlive it).
    fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
        strings
            .iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    }

    /// Where `execvp` would look for `program`, in order.
    fn candidates(program: &OsStr, env: &[(OsString, OsString)]) -> Vec<OsString> {
        if program.as_bytes().contains(&b'/') {
            return vec![program.to_owned()];
        }
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var_os("PATH"))
            .unwrap_or_else(|| "/bin:/usr/bin".into());
        path.as_bytes()
            .split(|b| *b == b':')
            .map(|dir| {
                let dir = if dir.is_empty() { b"." as &[u8] } else { dir };
                let mut p = dir.to_vec();
                p.push(b'/');
                p.extend_from_slice(program.as_bytes());
                OsString::from(std::ffi::OsStr::from_bytes(&p))
            })
            .collect()
    }

    /// Spawns the child, inside the cgroup whose directory is `cgroup` if there is one;
    /// `Ok(None)` when the kernel has no `clone3` (or no `CLONE_INTO_CGROUP` for a cgroup):
    /// the caller forks instead.
    pub(super) fn spawn(
        spec: &SpawnSpec,
        cgroup: Option<RawFd>,
    ) -> Result<Option<Child>, SpawnError> {
        let fail = |e: io::Error| spawn_error(spec, e);
        let env = child_env(spec);
        let envp_strings = env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                cstring(OsStr::from_bytes(&kv))
            })
            .collect::<io::Result<Vec<_>>>()
            .map_err(fail)?;
        let mut argv_strings = vec![cstring(&spec.program).map_err(fail)?];
        for a in &spec.args {
            argv_strings.push(cstring(a).map_err(fail)?);
        }
        let paths = candidates(&spec.program, &env)
            .iter()
            .map(|p| cstring(p))
            .collect::<io::Result<Vec<_>>>()
            .map_err(fail)?;
        // `execvp` runs a file without `#!` with /bin/sh; so do we.
        let sh = c"/bin/sh";
        let sh_argv_strings: Vec<Vec<CString>> = paths
            .iter()
            .map(|p| {
                let mut v = vec![CString::from(sh), p.clone()];
                v.extend(argv_strings[1..].iter().cloned());
                v
            })
            .collect();
        let envp = pointers(&envp_strings);
        let argv = pointers(&argv_strings);
        let sh_argvs: Vec<Vec<*const libc::c_char>> =
            sh_argv_strings.iter().map(|v| pointers(v)).collect();
        let path_ptrs: Vec<*const libc::c_char> = paths.iter().map(|p| p.as_ptr()).collect();
        let (err_r, err_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| fail(e.into()))?;
        let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| fail(e.into()))?;
        // The signals whose handlers the child resets (caught, but not by the intake, whose
        // handler does nothing in a child): looked up here, read-only in the child. (A handler
        // a host installed over the intake's is not looked for: it took that signal from the
        // intake already.)
        let mut reset = [false; 65];
        for (n, r) in reset.iter_mut().enumerate().skip(1) {
            *r = !matches!(n, 9 | 19 | 32 | 33) && !crate::driver::signals::caught_here(n);
        }
        let ctx = ChildCtx {
            parent: std::process::id() as libc::pid_t,
            inherit: spec.inherit.as_slice(),
            user: spec.user.as_ref(),
            foreground: spec.foreground,
            err_w: err_w.as_raw_fd(),
            status_w: status_w.as_raw_fd(),
            paths: &path_ptrs,
            argv: &argv,
            sh_argvs: &sh_argvs,
            envp: &envp,
            reset: &reset,
        };
        let mut pidfd: libc::c_int = -1;
        let mut args = CloneArgs {
            flags: CLONE_PIDFD | cgroup.map_or(0, |_| CLONE_INTO_CGROUP),
            pidfd: &mut pidfd as *mut libc::c_int as u64,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: cgroup.map_or(0, |fd| fd as u64),
            ..CloneArgs::default()
        };
        // Every signal blocked in this thread until the child has exec'd (or exited): none is
        // handled in the child before it reset the handlers; the child unblocks its own.
        // SAFETY: a filled set is a valid value; the pointers are to locals.
        let mut old_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old_mask);
        }
        let ret = clone(&mut args, &ctx);
        // SAFETY: the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut()) };
        if ret < 0 {
            let e = io::Error::from_raw_os_error(-ret as i32);
            return match e.raw_os_error() {
                // No clone3, or no CLONE_INTO_CGROUP / CLONE_PIDFD here: fork instead.
                Some(libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EOPNOTSUPP) => Ok(None),
                _ => Err(fail(e)),
            };
        }
        let pid = ret as u32;
        // SAFETY: the kernel stored a new pidfd in `pidfd` for the child it created.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        drop(err_w);
        drop(status_w);
        // End of file: the exec succeeded (the pipe was close-on-exec); four bytes: its errno.
        let mut buf = [0u8; 4];
        let mut got = 0;
        let mut status = std::fs::File::from(status_r);
        while got < 4 {
            match status.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(fail(e)),
            }
        }
        if got == 4 {
            // Reap the child that could not exec, then report why.
            let _ = rustix::process::waitid(
                rustix::process::WaitId::PidFd(std::os::fd::AsFd::as_fd(&pidfd)),
                rustix::process::WaitIdOptions::EXITED,
            );
            return Err(fail(io::Error::from_raw_os_error(i32::from_ne_bytes(buf))));
        }
        let stderr = ChildStderr::from(err_r);
        let _ = rustix::io::ioctl_fionbio(&stderr, true);
        Ok(Some(Child::started(pid, pidfd, Some(stderr))))
    }

    /// What the child needs, prepared by the parent; the child only reads it.
    struct ChildCtx<'a> {
        parent: libc::pid_t,
        inherit: &'a [RawFd],
        user: Option<&'a super::Credentials>,
        foreground: bool,
        err_w: RawFd,
        status_w: RawFd,
        paths: &'a [*const libc::c_char],
        argv: &'a [*const libc::c_char],
        sh_argvs: &'a [Vec<*const libc::c_char>],
        envp: &'a [*const libc::c_char],
        /// By signal number: reset the handler to the default action if one is installed.
        reset: &'a [bool; 65],
    }

    /// `clone3` with `args`, the child running [`child_exec`] on `ctx`: returns the child's
    /// pid, or `-errno`. On x86-64 the child shares our memory on a stack of its own and this
    /// returns once it has exec'd or exited.
    #[cfg(target_arch = "x86_64")]
    fn clone(args: &mut CloneArgs, ctx: &ChildCtx<'_>) -> i64 {
        extern "C" fn entry(ctx: *const libc::c_void) -> ! {
            // SAFETY: `ctx` points to the parent's `ChildCtx`, which outlives the child's use
            // of it: the parent waits (`CLONE_VFORK`) until the child has exec'd or exited.
            unsafe { child_exec(&*ctx.cast::<ChildCtx<'_>>()) }
        }
        let mut stack = Box::<[u8]>::new_uninit_slice(CHILD_STACK);
        args.flags |= CLONE_VM | CLONE_VFORK;
        let base = stack.as_mut_ptr() as u64;
        args.stack = base;
        // The kernel starts the child with its stack pointer at `stack + stack_size`, which
        // the call below needs 16-byte aligned.
        args.stack_size = ((base + CHILD_STACK as u64) & !15) - base;
        let ret: i64;
        // SAFETY: `clone3` returns twice. In the parent, only rax, rcx and r11 change. In the
        // child (rax = 0), on the new stack, the frame pointer is cleared and `entry(ctx)` is
        // called; it never returns. `args`, the stack and `ctx` live until the parent resumes,
        // which is after the child no longer uses them.
        unsafe {
            std::arch::asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "xor ebp, ebp",
                "mov rdi, r12",
                "call r13",
                "ud2",
                "2:",
                inlateout("rax") libc::SYS_clone3 => ret,
                in("rdi") args as *mut CloneArgs,
                in("rsi") std::mem::size_of::<CloneArgs>(),
                in("r12") ctx as *const ChildCtx<'_>,
                in("r13") entry as extern "C" fn(*const libc::c_void) -> !,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        drop(stack);
        ret
    }

    /// `clone3` with `args` as a copy of this process (as `fork`), the child running
    /// [`child_exec`] on `ctx`: returns the child's pid, or `-errno`.
    #[cfg(not(target_arch = "x86_64"))]
    fn clone(args: &mut CloneArgs, ctx: &ChildCtx<'_>) -> i64 {
        // SAFETY: `clone3` without `CLONE_VM` duplicates this process like `fork`; `args` and
        // the `pidfd` slot it points to live across the call. In the child (return value 0)
        // only async-signal-safe system call wrappers run, on memory prepared above, and it
        // never returns: it execs or `_exit`s.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if ret == 0 {
            // SAFETY: see above; every pointer is into memory this copy of the process owns.
            unsafe { child_exec(ctx) }
        }
        if ret < 0 {
            -i64::from(
                io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL),
            )
        } else {
            ret
        }
    }

    /// The child's side: never returns. Async-signal-safe calls only, and nothing written to
    /// memory it may share with the parent but its own stack and the calling thread's `errno`
    /// (which the parent does not read after the clone).
    unsafe fn child_exec(ctx: &ChildCtx<'_>) -> ! {
        let ChildCtx {
            parent,
            inherit,
            user,
            foreground,
            err_w,
            status_w,
            paths,
            argv,
            sh_argvs,
            envp,
            reset,
        } = *ctx;
        unsafe {
            // No handler may run here on the parent's memory: each that is not the intake's
            // goes back to the default action (what the exec would do to it anyway) while
            // every signal is still blocked.
            for (n, r) in reset.iter().enumerate() {
                if !r {
                    continue;
                }
                let mut old: libc::sigaction = std::mem::zeroed();
                let n = n as libc::c_int;
                if libc::sigaction(n, std::ptr::null(), &mut old) == 0
                    && old.sa_sigaction != libc::SIG_DFL
                    && old.sa_sigaction != libc::SIG_IGN
                {
                    libc::signal(n, libc::SIG_DFL);
                }
            }
            let report = |errno: libc::c_int| -> ! {
                let b = errno.to_ne_bytes();
                libc::write(status_w, b.as_ptr().cast(), b.len());
                libc::_exit(127)
            };
            // A process group of its own (card T3), as `Command::process_group(0)`.
            if libc::setpgid(0, 0) != 0 {
                report(*libc::__errno_location());
            }
            if foreground {
                super::take_terminal_in_child();
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            // The Rust runtime ignores SIGPIPE; a program started from it must not.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            for fd in inherit {
                if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                    report(*libc::__errno_location());
                }
            }
            if libc::dup2(err_w, 2) < 0 {
                report(*libc::__errno_location());
            }
            // Created inside the cgroup already; before the parent-death signal, which a
            // change of uid clears.
            if let Some(c) = user
                && let Err(e) = super::switch_user(c)
            {
                report(e.raw_os_error().unwrap_or(libc::EPERM));
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                report(*libc::__errno_location());
            }
            // The parent may have died before the prctl: then nobody would kill us.
            if libc::getppid() != parent {
                report(libc::ESRCH);
            }
            let mut eacces = false;
            let mut last = libc::ENOENT;
            for (i, path) in paths.iter().enumerate() {
                libc::execve(*path, argv.as_ptr(), envp.as_ptr());
                let mut e = *libc::__errno_location();
                if e == libc::ENOEXEC {
                    libc::execve(sh_argvs[i][0], sh_argvs[i].as_ptr(), envp.as_ptr());
                    e = *libc::__errno_location();
                }
                match e {
                    // As `execvp`: remember a permission problem, keep looking.
                    libc::EACCES => eacces = true,
                    libc::ENOENT
                    | libc::ENOTDIR
                    | libc::ESTALE
                    | libc::ENODEV
                    | libc::ETIMEDOUT => {}
                    other => {
                        last = other;
                        eacces = false;
                        break;
                    }
                }
                last = e;
            }
            report(if eacces { libc::EACCES } else { last })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a cgroup the child is started by `clone3` itself, not by the `fork` fallback
    /// (`clone3::spawn` answers `None` only where the kernel has no `clone3`): the runner's
    /// spawn without a cgroup shares its memory until the exec instead of copying it.
    #[test]
    fn a_spawn_without_a_cgroup_takes_clone3_not_the_fork() {
        let spec = SpawnSpec {
            program: "sh".into(),
            args: vec!["-c".into(), "exit 7".into()],
            allow: None,
            remove: Vec::new(),
            set: Vec::new(),
            cgroup_dir: None,
            cgroup_procs: None,
            inherit: Vec::new(),
            user: None,
            foreground: false,
        };
        let mut child = clone3::spawn(&spec, None)
            .expect("spawn sh")
            .expect("clone3 started it (Linux 5.3+), no fall back to fork");
        // Waits for the exit on the pidfd (an event, bounded for a loaded machine).
        {
            let pidfd = child.pidfd();
            let mut fds = [rustix::event::PollFd::new(
                &pidfd,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::time::Timespec {
                tv_sec: 60,
                tv_nsec: 0,
            };
            rustix::event::poll(&mut fds, Some(&ts)).expect("poll the pidfd");
        }
        assert_eq!(child.try_reap().unwrap(), Some(ChildStatus::Exited(7)));
    }
}
