//! Helpers shared by the lease integration tests: spawning probe children (this very test
//! binary, re-executed with `TENURE_PROBE`), waiting for their lines and exits with deadlines
//! (event waits, never bare sleeps), and snapshots of a tree (modes + bytes) to prove that a
//! refusal changed nothing.
#![allow(dead_code)]

pub mod probe;
// The rule for tests that need what the machine may lack (root here), shared with tests/common.
#[path = "../common/skip.rs"]
pub mod skip;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// Generous deadline for anything a child must do on a loaded 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The first line any of `probes` says (those marked in `skip` are not asked), with its
/// index, within [`DEADLINE`]: an event wait over several probes at once.
pub fn first_line(probes: &[Probe], skip: &[bool]) -> Option<(usize, String)> {
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        for (i, p) in probes.iter().enumerate() {
            if skip.get(i) == Some(&true) {
                continue;
            }
            if let Ok(line) = p.lines.try_recv() {
                return Some((i, line));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// A probe child process.
pub struct Probe {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Probe {
    /// Spawns this test binary as a probe with the given role arguments.
    pub fn spawn(args: &[&str]) -> Probe {
        Probe::spawn_with_env(args, &[])
    }

    /// Spawns a probe with extra environment variables (e.g. `TENURE_FAILPOINTS`).
    pub fn spawn_with_env(args: &[&str], env: &[(&str, &str)]) -> Probe {
        let spec = args.join(&probe::SEP.to_string());
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "probe_entry",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(probe::PROBE_ENV, spec)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn probe");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness prints `test probe_entry ... ` without a newline before the
                // probe runs, so the marker may sit mid-line.
                if let Some(at) = line.find("PROBE ")
                    && tx.send(line[at + "PROBE ".len()..].to_owned()).is_err()
                {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Probe {
            child,
            stdin,
            lines: rx,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line from the probe, within the deadline.
    pub fn next_line(&self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// Waits for a line starting with `prefix`; panics with what came instead.
    pub fn expect(&self, prefix: &str) -> String {
        match self.next_line(DEADLINE) {
            Some(l) if l.starts_with(prefix) => l,
            Some(l) => panic!(
                "probe {} said {l:?} while {prefix:?} was expected",
                self.pid()
            ),
            None => panic!("probe {} said nothing starting with {prefix:?}", self.pid()),
        }
    }

    /// Sends a command line on stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Closes stdin (the probe releases and exits, or stops watching).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Waits for the exit within the deadline (through a pidfd, an event wait), then reaps.
    pub fn wait(&mut self) -> ExitStatus {
        self.wait_within(DEADLINE)
            .unwrap_or_else(|| panic!("probe {} did not exit within {DEADLINE:?}", self.pid()))
    }

    pub fn wait_within(&mut self, within: Duration) -> Option<ExitStatus> {
        if let Some(st) = self.child.try_wait().unwrap() {
            return Some(st);
        }
        // Not reaped yet, so the pid cannot have been recycled: the pidfd names our child.
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap();
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let mut fds = [rustix::event::PollFd::new(
                &pidfd,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::event::Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            };
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) => return None,
                Ok(_) => return Some(self.child.wait().unwrap()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => panic!("poll pidfd: {e}"),
            }
        }
    }

    /// Sends a real signal to the probe.
    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // A failed assertion must not leave children behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The exit code, or 128+N for a death by signal N (the shell's convention).
pub fn code(st: ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// A 0700 temp dir (tempfile's default on Linux, made explicit).
pub fn private_tempdir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    t
}

/// Modes, owners, link counts and bytes (or link targets) of every path under `root`.
pub type Snapshot = BTreeMap<PathBuf, (u32, u32, u64, Vec<u8>)>;

pub fn snapshot(root: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        let content = if md.file_type().is_symlink() {
            std::fs::read_link(&p).unwrap().into_os_string().into_vec()
        } else if md.is_file() {
            std::fs::read(&p).unwrap()
        } else {
            Vec::new()
        };
        if md.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
        out.insert(p, (md.mode(), md.uid(), md.nlink(), content));
    }
    out
}

/// Writes a file with mode 0600.
pub fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// True when `TENURE_LONG=1` asks for the full-size sweeps.
pub fn long() -> bool {
    std::env::var("TENURE_LONG").is_ok_and(|v| v == "1")
}
