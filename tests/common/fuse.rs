//! A FUSE filesystem with one file whose lookup is never answered: the way to get a real
//! process that survives SIGKILL (card G6), as test infrastructure.
//!
//! The kernel waits for a FUSE answer in three stages (`request_wait_answer` in fs/fuse/dev.c):
//! interruptibly, then killably, and — once the daemon has *read* the request — with a plain
//! `wait_event`, which no signal ends. So a process that opens `MNT/stuck` sleeps in `S` until a
//! fatal signal arrives, and from then on in `D` until the daemon answers or the connection is
//! aborted. The daemon here is a thread of the test process: it answers `FUSE_INIT`, root
//! `GETATTR` and other lookups (`ENOENT`), and holds the `LOOKUP` of `stuck` for ever.
//!
//! Cleaning up cannot be forgotten: [`FuseStall::abort`] (also run by `Drop`) stops the thread
//! and closes the last `/dev/fuse` descriptor, which aborts the connection (every held request
//! fails with `ECONNABORTED`, so the stuck process goes on and dies of its pending SIGKILL), then
//! lazily unmounts. If the test process dies instead, the kernel closes `/dev/fuse` for it and the
//! stuck process is freed the same way; only an empty, disconnected mount point may remain in
//! the temporary directory until it is unmounted.

use rustix::event::{PollFd, PollFlags, poll};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::{MountFlags, UnmountFlags};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

/// The name whose lookup is held.
pub const STUCK: &str = "stuck";

const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_BATCH_FORGET: u32 = 42;

/// The protocol we speak: 7.31 (fixed 64-byte `fuse_init_out`, no `flags2`); the kernel accepts
/// any older minor than its own and adapts.
const MAJOR: u32 = 7;
const MINOR: u32 = 31;
const MAX_WRITE: u32 = 128 * 1024;
/// `/dev/fuse` refuses reads into buffers smaller than a whole write request.
const READ_BUFFER: usize = MAX_WRITE as usize + 64 * 1024;
const IN_HEADER: usize = 40;
const ROOT_ID: u64 = 1;

/// Why FUSE cannot be used on this machine (the caller skips its test).
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the daemon thread reports.
enum Seen {
    /// `FUSE_INIT` was answered.
    Init,
    /// The `LOOKUP` of [`STUCK`] by this pid was read and will never be answered.
    Held(u32),
    /// The daemon failed (a protocol error): the test must fail, not skip.
    Failed(String),
}

/// A mounted stalling filesystem; see the module docs.
pub struct FuseStall {
    mnt: PathBuf,
    mounted: bool,
    stop: Option<UnixStream>,
    daemon: Option<JoinHandle<OwnedFd>>,
    seen: Receiver<Seen>,
    /// Removed only after `Drop::drop` has aborted and unmounted (fields drop after it).
    _tmp: tempfile::TempDir,
}

impl FuseStall {
    /// Opens `/dev/fuse`, mounts it on a fresh temporary directory and waits until `FUSE_INIT`
    /// is answered. `Err` only when the machine has no usable FUSE (no device, no permission,
    /// no `fuse` filesystem); any other failure panics.
    pub fn mount(deadline: Duration) -> Result<FuseStall, Unavailable> {
        let dev = match rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
        {
            Ok(fd) => fd,
            Err(e @ (Errno::NOENT | Errno::NODEV | Errno::PERM | Errno::ACCESS | Errno::NXIO)) => {
                return Err(Unavailable(format!("cannot open /dev/fuse: {e}")));
            }
            Err(e) => panic!("cannot open /dev/fuse: {e}"),
        };
        let tmp = tempfile::Builder::new()
            .prefix("tenure-fuse-")
            .tempdir()
            .expect("tempdir for the mount point");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        let data = CString::new(format!(
            "fd={},rootmode=40000,user_id={},group_id={}",
            dev.as_raw_fd(),
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw()
        ))
        .expect("no NUL in the mount options");
        match rustix::mount::mount(
            "tenure-g6",
            &mnt,
            "fuse",
            MountFlags::NOSUID | MountFlags::NODEV,
            data.as_c_str(),
        ) {
            Ok(()) => {}
            Err(e @ (Errno::PERM | Errno::NODEV | Errno::NOENT | Errno::ACCESS)) => {
                return Err(Unavailable(format!(
                    "cannot mount a FUSE filesystem on {}: {e}",
                    mnt.display()
                )));
            }
            Err(e) => panic!("cannot mount a FUSE filesystem on {}: {e}", mnt.display()),
        }
        let (stop, stop_rx) = UnixStream::pair().expect("stop socket");
        let (tx, seen) = channel();
        let daemon = std::thread::Builder::new()
            .name("fuse-stall".into())
            .spawn(move || serve(dev, stop_rx, tx))
            .expect("spawn the FUSE daemon thread");
        let mut me = FuseStall {
            mnt,
            mounted: true,
            stop: Some(stop),
            daemon: Some(daemon),
            seen,
            _tmp: tmp,
        };
        match me.seen.recv_timeout(deadline) {
            Ok(Seen::Init) => Ok(me),
            Ok(Seen::Failed(why)) => panic!("FUSE daemon: {why}"),
            Ok(Seen::Held(pid)) => panic!("a lookup by {pid} came before FUSE_INIT"),
            Err(e) => {
                me.abort();
                panic!("no FUSE_INIT within {deadline:?}: {e}")
            }
        }
    }

    /// A path inside the mount.
    pub fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    /// Waits until some process's `LOOKUP` of [`STUCK`] has been read (and so will never be
    /// answered) and returns that process's pid.
    pub fn wait_held(&self, deadline: Duration) -> u32 {
        match self.seen.recv_timeout(deadline) {
            Ok(Seen::Held(pid)) => pid,
            Ok(Seen::Init) => panic!("FUSE_INIT twice"),
            Ok(Seen::Failed(why)) => panic!("FUSE daemon: {why}"),
            Err(RecvTimeoutError::Timeout) => {
                panic!("no lookup of {STUCK} reached the FUSE daemon within {deadline:?}")
            }
            Err(RecvTimeoutError::Disconnected) => panic!("the FUSE daemon thread ended"),
        }
    }

    /// Aborts the connection (every held request fails, so the stuck process goes on) and
    /// lazily unmounts. Idempotent.
    pub fn abort(&mut self) {
        // The daemon polls the other end of this socket beside /dev/fuse: closing ours wakes it
        // (end of file), and it returns.
        drop(self.stop.take());
        if let Some(d) = self.daemon.take() {
            // The thread hands back /dev/fuse; dropping the last descriptor aborts the
            // connection (`fuse_dev_release` → `fuse_abort_conn`). A panicked thread dropped it
            // already while unwinding.
            if let Ok(fd) = d.join() {
                drop(fd);
            }
        }
        if self.mounted {
            self.mounted = false;
            if let Err(e) = rustix::mount::unmount(&self.mnt, UnmountFlags::DETACH) {
                eprintln!("cannot unmount {}: {e}", self.mnt.display());
            }
        }
    }
}

impl Drop for FuseStall {
    fn drop(&mut self) {
        self.abort();
    }
}

/// The daemon loop: answer everything except the lookup of [`STUCK`]. Returns `/dev/fuse` so
/// that the caller decides when the connection is aborted.
fn serve(dev: OwnedFd, stop: UnixStream, tx: Sender<Seen>) -> OwnedFd {
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        let (dev_ready, stop_ready) = {
            let mut fds = [
                PollFd::new(&dev, PollFlags::IN),
                PollFd::from_borrowed_fd(stop.as_fd(), PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(e) => {
                    let _ = tx.send(Seen::Failed(format!("poll: {e}")));
                    return dev;
                }
            }
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
        };
        if stop_ready {
            return dev;
        }
        if !dev_ready {
            continue;
        }
        let n = match rustix::io::read(&dev, &mut buf) {
            Ok(n) => n,
            // Interrupted, or the request was withdrawn before we read it.
            Err(Errno::INTR | Errno::AGAIN | Errno::NOENT) => continue,
            // The connection is gone (unmounted or aborted from outside).
            Err(Errno::NODEV) => return dev,
            Err(e) => {
                let _ = tx.send(Seen::Failed(format!("read /dev/fuse: {e}")));
                return dev;
            }
        };
        if n < IN_HEADER {
            let _ = tx.send(Seen::Failed(format!("short request of {n} bytes")));
            return dev;
        }
        let req = &buf[..n];
        let opcode = u32_at(req, 4);
        let unique = u64_at(req, 8);
        let nodeid = u64_at(req, 16);
        let pid = u32_at(req, 32);
        let body = &req[IN_HEADER..];
        let reply = match opcode {
            FUSE_INIT => {
                let major = u32_at(body, 0);
                if major != MAJOR {
                    let _ = tx.send(Seen::Failed(format!("kernel speaks FUSE {major}")));
                    return dev;
                }
                let max_readahead = u32_at(body, 8);
                let r = answer(&dev, unique, 0, &init_out(max_readahead));
                let _ = tx.send(Seen::Init);
                r
            }
            FUSE_LOOKUP => {
                let name = body.split(|b| *b == 0).next().unwrap_or_default();
                if nodeid == ROOT_ID && name == STUCK.as_bytes() {
                    // Never answered: the requester now waits until the connection is aborted.
                    let _ = tx.send(Seen::Held(pid));
                    Ok(())
                } else {
                    answer(&dev, unique, -Errno::NOENT.raw_os_error(), &[])
                }
            }
            FUSE_GETATTR if nodeid == ROOT_ID => answer(&dev, unique, 0, &root_attr_out()),
            // These take no answer. An interrupt for the held lookup is left unanswered too, so
            // the lookup stays held.
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => Ok(()),
            _ => answer(&dev, unique, -Errno::NOSYS.raw_os_error(), &[]),
        };
        match reply {
            // ENOENT: the requester was interrupted and the request withdrawn meanwhile.
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => {
                let _ = tx.send(Seen::Failed(format!("answer opcode {opcode}: {e}")));
                return dev;
            }
        }
    }
}

/// Writes one answer: `fuse_out_header` (len, error, unique) and the payload.
fn answer(dev: &OwnedFd, unique: u64, error: i32, payload: &[u8]) -> Result<(), Errno> {
    let len = 16 + payload.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&error.to_ne_bytes());
    out.extend_from_slice(&unique.to_ne_bytes());
    out.extend_from_slice(payload);
    let n = rustix::io::write(dev, &out)?;
    if n == len { Ok(()) } else { Err(Errno::IO) }
}

/// `struct fuse_init_out` (64 bytes): no optional features, modest limits.
fn init_out(max_readahead: u32) -> Vec<u8> {
    let mut o = Vec::with_capacity(64);
    o.extend_from_slice(&MAJOR.to_ne_bytes());
    o.extend_from_slice(&MINOR.to_ne_bytes());
    o.extend_from_slice(&max_readahead.to_ne_bytes());
    o.extend_from_slice(&0u32.to_ne_bytes()); // flags
    o.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    o.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
    o.extend_from_slice(&MAX_WRITE.to_ne_bytes());
    o.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    o.extend_from_slice(&0u16.to_ne_bytes()); // max_pages
    o.extend_from_slice(&0u16.to_ne_bytes()); // map_alignment
    o.extend_from_slice(&0u32.to_ne_bytes()); // flags2
    o.extend_from_slice(&0u32.to_ne_bytes()); // max_stack_depth
    o.extend_from_slice(&0u16.to_ne_bytes()); // request_timeout
    o.extend_from_slice(&[0u8; 22]); // unused[11]
    assert_eq!(o.len(), 64);
    o
}

/// `struct fuse_attr_out` (104 bytes) for the root: an empty 0755 directory of the mounter.
fn root_attr_out() -> Vec<u8> {
    let mut o = Vec::with_capacity(104);
    o.extend_from_slice(&1u64.to_ne_bytes()); // attr_valid (s)
    o.extend_from_slice(&0u32.to_ne_bytes()); // attr_valid_nsec
    o.extend_from_slice(&0u32.to_ne_bytes()); // dummy
    for v in [ROOT_ID, 0, 0, 0, 0, 0] {
        o.extend_from_slice(&v.to_ne_bytes()); // ino, size, blocks, atime, mtime, ctime
    }
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    for v in [0, 0, 0, 0o40755, 2, uid, gid, 0, 4096, 0u32] {
        // atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags
        o.extend_from_slice(&v.to_ne_bytes());
    }
    assert_eq!(o.len(), 104);
    o
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
