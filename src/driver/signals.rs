//! Signal intake. No catchable signal ends the runner by its default action (card T3): every one
//! of them is caught and becomes a readable byte on one of two self-pipes, plus a flag per signal
//! number, so the event loop can `poll` them together with the child's pidfd.
//!
//! - **Stop signals** (TERM, INT, HUP) go to the *stop pipe*. The lease wait watches it as its
//!   cancel descriptor, so a stop signal ends a wait at once (card G1); nothing else does.
//! - **Every other catchable signal** (QUIT, USR1, USR2, ALRM, WINCH, the real-time signals, ...)
//!   and SIGCHLD go to the *other pipe*: the former are relayed to the workload,
//!   SIGCHLD says that a child (the main process or an orphan the runner adopted as subreaper)
//!   changed state.
//!
//! - **The fault signals** ILL, TRAP, BUS, FPE, SEGV and SYS are told apart by who sent them
//!   (`si_code`). One *sent* by a process (`kill`, `sigqueue`, `tgkill`: `si_code <= 0`) is a
//!   stray signal like the others: it goes to the other pipe and is relayed to the workload (card
//!   T3), and the runner goes on. One the *kernel* raised for a real fault of the runner is a
//!   bug: the previous handler runs first (the Rust runtime's reports a stack overflow), then the
//!   signal's default action ends the runner, with a core dump where the system keeps one. A
//!   handler that returned from a real fault would re-run the faulting instruction forever.
//!
//! Left alone, with their default action: SIGKILL and SIGSTOP (they cannot be caught); SIGPIPE
//! (ignored by the Rust runtime, so a closed stderr is an `EPIPE` error, not a signal to
//! forward); and the job control signals TSTP, TTIN, TTOU and CONT (they suspend and resume the
//! runner, never end it; SIGSTOP, their uncatchable partner, could not be relayed either).
//!
//! The handler is this module's own (one `sigaction` per signal, once per process), not a
//! registry's: `tenure run -- true` is a benchmark row (issue 11), and registering 49 signals
//! through `signal-hook` cost two `rt_sigaction` calls and a copy of the whole registry each,
//! plus two socket pairs. The read and write ends are non-blocking pipes, made once per
//! slot and never closed, so a handler that races with a [`SignalIntake`] being dropped
//! writes into its own pipe, never into a descriptor number that was reused. A handler that was
//! installed before ours (a host's) is still called first, as `signal-hook` chained it.
//!
//! The flags are `std` atomics, not `crate::sync` ones: they are written from a signal handler,
//! which only `std`'s lock-free atomics are safe for. The handler sets the flag before it writes
//! the byte, so a reader woken by the byte always finds the flag.

use crate::machine::Signal;
use rustix::event::{PollFd, PollFlags, poll};
use std::cell::UnsafeCell;
use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// SIGCHLD.
const SIGCHLD: u8 = 17;

/// The signals relayed to the workload, by number (Linux): QUIT, ABRT, USR1, USR2, ALRM, STKFLT,
/// URG, XCPU, XFSZ, VTALRM, PROF, WINCH, IO, PWR and SIGRTMIN (34) to SIGRTMAX (64).
pub const RELAYED: [u8; 45] = {
    let mut v = [0u8; 45];
    let classic = [3, 6, 10, 12, 14, 16, 23, 24, 25, 26, 27, 28, 29, 30];
    let mut i = 0;
    while i < classic.len() {
        v[i] = classic[i];
        i += 1;
    }
    let mut rt = 34;
    while rt <= 64 {
        v[i] = rt;
        i += 1;
        rt += 1;
    }
    v
};

/// The fault signals, by number (Linux): ILL, TRAP, BUS, FPE, SEGV and SYS. Caught to tell a
/// sent one (relayed, as [`RELAYED`]) from a real fault of the runner (its default action).
pub const FAULTS: [u8; 6] = [4, 5, 7, 8, 11, 31];

/// Whether a signal that arrived is relayed to the workload: [`RELAYED`], and the [`FAULTS`]
/// another process sent (a real fault never returns to be relayed).
fn relayable(n: u8) -> bool {
    RELAYED.contains(&n) || FAULTS.contains(&n)
}

/// What arrived besides stop signals.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Others {
    /// Signals to relay to the workload, by number, in ascending order, each at most once.
    pub relay: Vec<u8>,
    /// SIGCHLD arrived: a child changed state.
    pub child: bool,
}

/// How many intakes may be installed at the same time in one process (the runner has one; a
/// library host that runs several drivers at once, or a test binary running tests in parallel,
/// has a few). A slot's four pipe descriptors are made only when it is first claimed.
const SLOTS: usize = 64;

/// One intake's pipes and flags. The pipes are made when the slot is first claimed and kept
/// for the life of the process (see the module comment); `live` says whether the handler
/// delivers to this slot.
struct Slot {
    live: AtomicBool,
    /// Read and write ends of the stop pipe and of the other pipe; -1 until made.
    stop_r: AtomicI32,
    stop_w: AtomicI32,
    other_r: AtomicI32,
    other_w: AtomicI32,
    flags: [AtomicBool; 65],
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            live: AtomicBool::new(false),
            stop_r: AtomicI32::new(-1),
            stop_w: AtomicI32::new(-1),
            other_r: AtomicI32::new(-1),
            other_w: AtomicI32::new(-1),
            flags: [const { AtomicBool::new(false) }; 65],
        }
    }

    /// Empties the pipes and clears the flags (before the slot is handed to a new intake).
    fn clear(&self) {
        for fd in [&self.stop_r, &self.other_r] {
            // SAFETY: made when the slot was first claimed and never closed.
            drain(unsafe { BorrowedFd::borrow_raw(fd.load(Ordering::SeqCst)) });
        }
        for f in &self.flags {
            f.store(false, Ordering::SeqCst);
        }
    }
}

static SLOTS_TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];

/// The action each signal had before ours was installed, to chain to; written once per signal
/// (under [`SETUP`]) and read by the handler once [`PREV_SET`] says so.
struct Prev(UnsafeCell<[Option<libc::sigaction>; 65]>);

// SAFETY: each element is written once, under `SETUP`, and read (by the handler) only after
// its `PREV_SET` flag was set, which is stored after the write.
unsafe impl Sync for Prev {}

static PREV: Prev = Prev(UnsafeCell::new([None; 65]));

/// Whether [`PREV`]'s entry of a signal is written (the handler reads it only then).
static PREV_SET: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

/// The process that installed the handlers (0 before the first install). A child that shares
/// this process's memory until it execs (`clone(CLONE_VM | CLONE_VFORK)`, how the workload is
/// started: `child::clone3`) inherits the handler; run there, it must neither set the flags
/// nor write to the pipes of its parent, nor call a host's handler on its parent's memory. A
/// signal that reaches such a child before its exec is the child's, and is dropped as its
/// exec would have reset the handler anyway.
static INSTALLER: AtomicI32 = AtomicI32::new(0);

/// Whether signal `n` is caught by this module's handler (installed once per process, never
/// removed). A child started with `CLONE_VM` leaves such a signal alone before its exec (the
/// handler does nothing there, see [`INSTALLER`]) and resets every other caught one.
pub(crate) fn caught_here(n: usize) -> bool {
    n < 65 && PREV_SET[n].load(Ordering::SeqCst)
}

/// Serialises installing and dropping intakes (never taken by the handler).
static SETUP: Mutex<[bool; 65]> = Mutex::new([false; 65]);

/// Whether `n` is a stop signal (TERM, INT, HUP).
fn is_stop(n: u8) -> bool {
    Signal::ALL.iter().any(|s| s.number() == n)
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: reading and restoring the thread's errno is what every handler must do.
    let errno = unsafe { *libc::__errno_location() };
    if rustix::process::getpid().as_raw_nonzero().get() != INSTALLER.load(Ordering::SeqCst) {
        // A child of ours before its exec (see `INSTALLER`); `getpid` is a plain system call.
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        return;
    }
    let Ok(n) = u8::try_from(sig) else { return };
    if usize::from(n) < 65 {
        // SAFETY: the entry is written and never written again once its flag is set.
        let prev = if PREV_SET[usize::from(n)].load(Ordering::SeqCst) {
            unsafe { &(*PREV.0.get())[usize::from(n)] }
        } else {
            &None
        };
        if let Some(prev) = prev {
            // SAFETY: a host's handler, called as it asked to be called.
            unsafe { call(prev, sig, info, ctx) };
        }
        deliver(n, is_stop(n));
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The handler of the [`FAULTS`]: a signal another process sent is delivered like any other
/// (see [`deliver`]); a real fault goes to the previous handler if there was one (the Rust
/// runtime's stack-overflow report, a host's), and otherwise ends the process by the signal's
/// default action. In a child that shares our memory before its exec (see [`INSTALLER`]) a sent
/// one is dropped, a real fault ends that child, and nothing of the parent's is touched.
extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: reading and restoring the thread's errno is what every handler must do.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid `siginfo_t` to an `SA_SIGINFO` handler.
    let sent = info.is_null() || unsafe { (*info).si_code } <= 0;
    let ours = rustix::process::getpid().as_raw_nonzero().get() == INSTALLER.load(Ordering::SeqCst);
    if sent {
        if ours && let Ok(n) = u8::try_from(sig) {
            deliver(n, false);
        }
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        return;
    }
    if ours
        && let Ok(n) = usize::try_from(sig)
        && n < 65
        && PREV_SET[n].load(Ordering::SeqCst)
        // SAFETY: the entry is written and never written again once its flag is set.
        && let Some(prev) = unsafe { &(*PREV.0.get())[n] }
        && prev.sa_sigaction != libc::SIG_DFL
        && prev.sa_sigaction != libc::SIG_IGN
    {
        // The fault is the previous handler's: the Rust runtime's reports a stack overflow, or
        // puts back the default action and returns to fault again; a host's (a JIT's, a wasm
        // engine's) may have handled it and changed where this thread resumes.
        // SAFETY: the previous handler, called as it asked to be called.
        unsafe { call(prev, sig, info, ctx) };
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        return;
    }
    // No handler before ours: the default action, for this very thread, pending until this
    // handler returns (the signal is blocked while it runs), which then ends the process. Raw
    // system calls: in a child before its exec, libc's idea of the current thread is its
    // parent's.
    // SAFETY: a zeroed `sigaction` is `SIG_DFL` with no flags; `tgkill` with our own ids.
    unsafe {
        let dfl: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        libc::syscall(
            libc::SYS_tgkill,
            rustix::process::getpid().as_raw_nonzero().get(),
            libc::syscall(libc::SYS_gettid),
            sig,
        );
    }
}

/// Calls a previous handler `prev` of `sig` as it asked to be called (nothing for `SIG_DFL`
/// and `SIG_IGN`).
///
/// # Safety
/// From a signal handler of `sig`, with the arguments the kernel passed it.
unsafe fn call(
    prev: &libc::sigaction,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    let f = prev.sa_sigaction;
    if f == libc::SIG_DFL || f == libc::SIG_IGN {
        return;
    }
    // SAFETY: a handler installed with these flags takes these arguments.
    unsafe {
        if prev.sa_flags & libc::SA_SIGINFO != 0 {
            type Action = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
            let f = std::mem::transmute::<*mut (), Action>(f as *mut ());
            f(sig, info, ctx);
        } else {
            type Handler = extern "C" fn(libc::c_int);
            let f = std::mem::transmute::<*mut (), Handler>(f as *mut ());
            f(sig);
        }
    }
}

/// Sets signal `n`'s flag in every live intake and wakes it: a byte on its stop pipe (`stop`)
/// or its other pipe. Async-signal-safe.
fn deliver(n: u8, stop: bool) {
    for slot in &SLOTS_TABLE {
        if !slot.live.load(Ordering::SeqCst) {
            continue;
        }
        slot.flags[usize::from(n)].store(true, Ordering::SeqCst);
        let fd = if stop { &slot.stop_w } else { &slot.other_w };
        // SAFETY: a non-blocking pipe end that is never closed; `write` is async-signal-safe.
        // A full pipe loses nothing: the flag is set, and one byte waiting is enough to wake
        // the reader.
        unsafe { libc::write(fd.load(Ordering::SeqCst), [n].as_ptr().cast(), 1) };
    }
}

/// A non-blocking, close-on-exec pipe: (read end, write end), as raw descriptors kept for
/// the life of the process.
fn pipe() -> io::Result<(RawFd, RawFd)> {
    let (r, w) = rustix::pipe::pipe_with(
        rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
    )?;
    Ok((r.into_raw_fd(), w.into_raw_fd()))
}

/// Reads a non-blocking descriptor until it is empty.
fn drain(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 64];
    while matches!(rustix::io::read(fd, &mut buf), Ok(n) if n > 0) {}
}

/// The signals an intake catches, blocked in the calling thread from [`SignalHold::start`] until
/// the hold is dropped: a signal that arrives meanwhile stays pending, and is handled by the
/// intake's handler if one was installed by then (or by its default action if none was).
///
/// The runner takes the hold first thing, then parses its arguments, and installs its handlers
/// only for commands that need them (`--version` and `--help` pay for none, issue 11), yet a
/// stop that arrives while it parses is still seen (card G1), as it was when the handlers
/// came first.
#[must_use = "the signals are blocked only while the hold lives"]
pub struct SignalHold {
    old: libc::sigset_t,
}

impl SignalHold {
    /// Blocks, in this thread, every signal an intake catches (one `sigprocmask`).
    pub fn start() -> SignalHold {
        let stops = Signal::ALL.map(Signal::number);
        // SAFETY: zeroed sets are valid values; `sigemptyset`/`sigaddset` fill them, and the
        // pointers are to locals.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            // The fault signals too: one sent meanwhile waits for the intake; a real fault
            // while one is blocked still ends the process (the kernel unblocks it).
            for n in stops
                .into_iter()
                .chain(RELAYED)
                .chain([SIGCHLD])
                .chain(FAULTS)
            {
                libc::sigaddset(&mut set, i32::from(n));
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            SignalHold { old }
        }
    }
}

impl Drop for SignalHold {
    /// Restores the thread's mask as it was; a pending signal is handled now.
    fn drop(&mut self) {
        // SAFETY: a valid set saved by `start`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// The registered handlers and the read ends of their pipes.
pub struct SignalIntake {
    slot: &'static Slot,
}

impl SignalIntake {
    /// Registers the handlers. Signals that arrived before this call were handled by the default
    /// action (the process ended), so call it before anything that must not be interrupted
    /// that way (the runner: after parsing its arguments, before it touches the state dir).
    pub fn install() -> io::Result<SignalIntake> {
        let mut installed = SETUP.lock().unwrap_or_else(|e| e.into_inner());
        let slot = SLOTS_TABLE
            .iter()
            .find(|s| !s.live.load(Ordering::SeqCst))
            .ok_or_else(|| io::Error::other("too many signal intakes in this process"))?;
        if slot.stop_r.load(Ordering::SeqCst) < 0 {
            let (stop_r, stop_w) = pipe()?;
            let (other_r, other_w) = match pipe() {
                Ok(p) => p,
                Err(e) => {
                    // SAFETY: both were just made and are not shared yet.
                    drop(unsafe { (OwnedFd::from_raw_fd(stop_r), OwnedFd::from_raw_fd(stop_w)) });
                    return Err(e);
                }
            };
            slot.stop_r.store(stop_r, Ordering::SeqCst);
            slot.stop_w.store(stop_w, Ordering::SeqCst);
            slot.other_r.store(other_r, Ordering::SeqCst);
            slot.other_w.store(other_w, Ordering::SeqCst);
        }
        // Nothing of an earlier intake of this slot is carried over.
        slot.clear();
        INSTALLER.store(
            rustix::process::getpid().as_raw_nonzero().get(),
            Ordering::SeqCst,
        );
        slot.live.store(true, Ordering::SeqCst);
        let stops = Signal::ALL.map(Signal::number);
        let wanted = stops
            .into_iter()
            .chain(RELAYED)
            .chain([SIGCHLD])
            .chain(FAULTS);
        // One `sigaction` per signal that both installs ours and returns the previous action;
        // the signals are blocked in this thread meanwhile, so none is handled here before
        // its previous action is recorded (another thread of a host may still take one in
        // that window: it is delivered to the intakes, only not chained).
        // SAFETY: a zeroed `sigset_t` is a valid value; `sigemptyset`/`sigaddset` fill it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        let mut old_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointers to local sets.
        unsafe {
            libc::sigemptyset(&mut set);
            for n in wanted.clone().filter(|n| !installed[usize::from(*n)]) {
                libc::sigaddset(&mut set, i32::from(n));
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old_mask);
        }
        let mut result = Ok(());
        for n in wanted {
            let i = usize::from(n);
            if installed[i] {
                continue;
            }
            // SAFETY: a zeroed `sigaction` is a valid value (empty mask, no flags).
            let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
            if FAULTS.contains(&n) {
                // On the alternate stack where the runtime set one up (a stack overflow is a
                // SEGV that the overflowed stack could not handle).
                new.sa_sigaction = on_fault as *const () as usize;
                new.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO | libc::SA_ONSTACK;
            } else {
                new.sa_sigaction = on_signal as *const () as usize;
                new.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
            }
            // SAFETY: as above.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: valid pointers; `on_signal` is async-signal-safe.
            if unsafe { libc::sigaction(i32::from(n), &new, &mut old) } != 0 {
                result = Err(io::Error::last_os_error());
                break;
            }
            // SAFETY: `SETUP` is held, and the handler reads this entry only once `PREV_SET`
            // says it is written.
            unsafe { (*PREV.0.get())[i] = Some(old) };
            PREV_SET[i].store(true, Ordering::SeqCst);
            installed[i] = true;
        }
        // SAFETY: restores this thread's mask as it was; pending signals are handled now.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut()) };
        if let Err(e) = result {
            slot.live.store(false, Ordering::SeqCst);
            return Err(e);
        }
        Ok(SignalIntake { slot })
    }

    /// The fd that becomes readable when a stop signal arrives (not consumed by polling it): the
    /// cancel descriptor of a lease wait.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: made before this intake existed and never closed.
        unsafe { BorrowedFd::borrow_raw(self.slot.stop_r.load(Ordering::SeqCst)) }
    }

    /// The fd that becomes readable when any other signal arrives.
    pub fn other_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: as for `fd`.
        unsafe { BorrowedFd::borrow_raw(self.slot.other_r.load(Ordering::SeqCst)) }
    }

    fn flag(&self, n: u8) -> bool {
        self.slot.flags[usize::from(n)].swap(false, Ordering::SeqCst)
    }

    /// Drains the stop pipe and returns the stop signals that arrived since the last call, in a
    /// fixed order (TERM, INT, HUP); each at most once per call.
    pub fn take(&self) -> Vec<Signal> {
        drain(self.fd());
        Signal::ALL
            .into_iter()
            .filter(|s| self.flag(s.number()))
            .collect()
    }

    /// Drains the other pipe and returns what arrived since the last call.
    pub fn take_others(&self) -> Others {
        drain(self.other_fd());
        Others {
            relay: (1..=64u8)
                .filter(|n| relayable(*n) && self.flag(*n))
                .collect(),
            child: self.flag(SIGCHLD),
        }
    }

    /// Whether a stop signal is pending, without consuming it.
    pub fn pending(&self) -> bool {
        let fd = self.fd();
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        matches!(poll(&mut fds, Some(&rustix::time::Timespec::default())), Ok(n) if n > 0)
    }
}

impl Drop for SignalIntake {
    /// The handlers stay installed (a signal that arrives later is dropped, as it was with
    /// `signal-hook`, whose handler also stayed); this intake's slot stops receiving.
    fn drop(&mut self) {
        let _setup = SETUP.lock().unwrap_or_else(|e| e.into_inner());
        self.slot.live.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real signals to this test process: every live intake sees each (flag and byte), a
    /// stop is pending until taken, and a slot handed to a new intake carries nothing over.
    /// Only USR2 and TERM are raised: both are caught by the handler once it is installed, so
    /// neither can end the test process.
    #[test]
    fn every_intake_sees_a_signal_and_a_reused_slot_starts_clean() {
        let raise = |n: i32| {
            // SAFETY: `raise` delivers the signal to this thread before it returns.
            assert_eq!(unsafe { libc::raise(n) }, 0);
        };
        let a = SignalIntake::install().expect("intake a");
        let b = SignalIntake::install().expect("intake b");
        raise(libc::SIGUSR2);
        for i in [&a, &b] {
            assert_eq!(i.take_others().relay, vec![12]);
            assert!(i.take_others().relay.is_empty(), "taken once");
        }
        raise(libc::SIGTERM);
        assert!(a.pending() && b.pending());
        assert_eq!(a.take(), vec![Signal::Term]);
        assert!(!a.pending(), "the byte was consumed");
        drop(b);
        raise(libc::SIGUSR2);
        let c = SignalIntake::install().expect("intake c");
        assert!(!c.pending(), "nothing of b's carried over");
        assert!(c.take().is_empty());
        assert!(c.take_others().relay.is_empty());
        assert_eq!(a.take_others().relay, vec![12]);
    }

    /// A stop that arrives while the runner parses its arguments (a hold, no handlers yet) is
    /// seen by the intake installed afterwards (card G1).
    #[test]
    fn a_stop_during_a_hold_reaches_the_intake_installed_after_it() {
        let hold = SignalHold::start();
        // SAFETY: `raise` only makes SIGTERM pending here: this thread blocks it.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        let intake = SignalIntake::install().expect("intake");
        assert!(!intake.pending(), "still blocked by the hold");
        drop(hold);
        assert!(intake.pending(), "delivered once the hold ended");
        assert_eq!(intake.take(), vec![Signal::Term]);
    }

    /// Card T3: a fault signal another process sends (here the test itself, `tgkill`) is a stray
    /// signal: relayed, and the process goes on (it would have died of its default action).
    #[test]
    fn a_sent_fault_signal_is_relayed_and_the_process_goes_on() {
        let intake = SignalIntake::install().expect("intake");
        for n in FAULTS {
            // SAFETY: `raise` delivers the signal to this thread before it returns.
            assert_eq!(unsafe { libc::raise(i32::from(n)) }, 0);
            assert_eq!(intake.take_others().relay, vec![n], "signal {n}");
        }
    }

    /// What [`a_real_fault_still_ends_the_process_by_its_signal`] runs in a process of its own
    /// (the test binary again, this test only): the intake installed, then a real fault.
    #[test]
    fn fault_child() {
        let Some(kind) = std::env::var_os("TENURE_FAULT_CHILD") else {
            return;
        };
        let _intake = SignalIntake::install().expect("intake");
        match kind.to_str() {
            // SAFETY: none: the point is the fault (a write through a null pointer).
            Some("segv") => unsafe { std::ptr::null_mut::<u8>().write_volatile(1) },
            // SAFETY: none: `ud2` is the undefined instruction, raising SIGILL.
            #[cfg(target_arch = "x86_64")]
            Some("ill") => unsafe { std::arch::asm!("ud2") },
            Some("overflow") => {
                #[allow(unconditional_recursion)]
                fn deeper(n: u64) -> u64 {
                    let pad = std::hint::black_box([n; 64]);
                    deeper(n + 1) + pad[3]
                }
                std::hint::black_box(deeper(0));
            }
            _ => {}
        }
        std::process::exit(3);
    }

    /// A real fault of the process still ends it by the fault's signal (the handler does not
    /// return into the faulting instruction forever, nor swallow it as a sent one), and the
    /// runtime's stack-overflow report still runs before it.
    #[test]
    fn a_real_fault_still_ends_the_process_by_its_signal() {
        use std::os::unix::process::ExitStatusExt;
        let mut kinds = vec![("segv", libc::SIGSEGV)];
        if cfg!(target_arch = "x86_64") {
            kinds.push(("ill", libc::SIGILL));
        }
        kinds.push(("overflow", libc::SIGABRT));
        for (kind, sig) in kinds {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "driver::signals::tests::fault_child",
                    "--nocapture",
                ])
                .args(["--test-threads", "1"])
                .env("TENURE_FAULT_CHILD", kind)
                .output()
                .expect("run the test binary");
            assert_eq!(
                out.status.signal(),
                Some(sig),
                "{kind}: {:?}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            if kind == "overflow" {
                assert!(
                    String::from_utf8_lossy(&out.stderr).contains("overflowed its stack"),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }

    /// What a child started with `CLONE_VM` leaves alone before its exec: exactly the signals
    /// an intake installed its handler for (the others it resets, see `child::clone3`).
    #[test]
    fn caught_here_is_what_an_intake_installed() {
        let _intake = SignalIntake::install().expect("intake");
        let stops = Signal::ALL.map(Signal::number);
        for n in stops
            .into_iter()
            .chain(RELAYED)
            .chain(FAULTS)
            .chain([SIGCHLD])
        {
            assert!(caught_here(usize::from(n)), "signal {n} is caught");
        }
        // KILL, STOP, PIPE, job control, glibc's two, and what is no signal at all.
        for n in [0, 9, 19, 13, 20, 21, 22, 18, 32, 33, 65, 1000] {
            assert!(!caught_here(n), "signal {n} is not caught");
        }
    }

    #[test]
    fn relayed_signals_exclude_stops_faults_and_job_control() {
        for n in [
            1, 2, 15, 4, 5, 7, 8, 11, 31, 9, 19, 13, 17, 20, 21, 22, 32, 33,
        ] {
            assert!(!RELAYED.contains(&n), "{n} must not be relayed");
        }
        assert!(RELAYED.contains(&10) && RELAYED.contains(&12) && RELAYED.contains(&28));
        assert_eq!(RELAYED.last(), Some(&64));
    }
}
