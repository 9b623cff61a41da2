//! What the runner keeps of std's runtime start-up, which it does without (`#![no_main]`, issue
//! 11: `tenure run -- true` against `flock`). std's start-up finds the main thread's stack guard
//! with `pthread_getattr_np`, which reads and parses `/proc/self/maps`, and maps an alternate
//! signal stack with a guard page of its own: together about a twentieth of a run's time. The
//! runner keeps what it relies on, done without reading `/proc`:
//! - SIGPIPE ignored, so a write to a closed pipe is an `EPIPE` the prints drop (`tenure::stdio`;
//!   the workload gets the default disposition back before its exec);
//! - a panic exits with 101 after the panic message, as a Rust `main` does;
//! - stdout is flushed after `main` returns, as std's runtime does at exit;
//! - a stack overflow of the main thread says so on stderr and aborts, as std's handler does;
//!   the guard is where the kernel stops growing the stack, `RLIMIT_STACK` below its top, and
//!   the top is the page end above the executable's name, the first thing the kernel copied
//!   onto the new stack (`AT_EXECFN`).
//!
//! std's descriptor check is `tenure::stdio::reserve_std_fds`, which `main` calls first.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `body` as std's runtime runs `main` and returns the process's exit status.
pub fn start(body: fn() -> u8) -> i32 {
    // SAFETY: called first, on the only thread; SIG_IGN needs no handler.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    guard::install();
    // The default panic hook has printed the message by the time the unwinding ends here.
    let code = std::panic::catch_unwind(body).map_or(101, i32::from);
    // std's runtime flushes stdout after `main` (its buffer is a line buffer: a last line
    // without a newline would be lost at exit); an error there is the reader's.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    code
}

mod guard {
    use super::{AtomicUsize, Ordering};

    /// The page below the lowest address the main thread's stack may grow to (0: unknown).
    static GUARD: AtomicUsize = AtomicUsize::new(0);

    /// The alternate stack the handler runs on: an overflowed stack has no room for it. Large
    /// enough for any signal frame (an AVX-512 frame is under 4 KiB) and the handler's few
    /// calls.
    static mut ALT_STACK: AltStack = AltStack([0; 64 << 10]);

    #[repr(align(16))]
    struct AltStack([u8; 64 << 10]);

    const PAGE: usize = 4096;

    type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

    /// Notes where the main thread's stack ends and installs the SIGSEGV and SIGBUS handler.
    pub fn install() {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Stack).current;
        if let (Some(top), Some(limit)) = (stack_top(), limit) {
            let low = top.saturating_sub(limit as usize);
            if low >= PAGE {
                GUARD.store(low - PAGE, Ordering::Relaxed);
            }
        }
        // SAFETY: the alternate stack is a static that nothing else uses; the handler is
        // async-signal-safe (atomics, write, abort, sigaction).
        unsafe {
            let stack = libc::stack_t {
                ss_sp: (&raw mut ALT_STACK.0).cast(),
                ss_flags: 0,
                ss_size: size_of::<AltStack>(),
            };
            if libc::sigaltstack(&stack, std::ptr::null_mut()) != 0 {
                return;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            let handler: Handler = handler;
            action.sa_sigaction = handler as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            for sig in [libc::SIGSEGV, libc::SIGBUS] {
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
    }

    /// The end of the main thread's stack mapping: the page end above the executable's name,
    /// which the kernel copied there first (one pointer's width, the end marker, below the end).
    pub(super) fn stack_top() -> Option<usize> {
        // SAFETY: getauxval only reads the auxiliary vector; AT_EXECFN points at the NUL-
        // terminated name on the initial stack, which lives as long as the process.
        let execfn = unsafe { libc::getauxval(libc::AT_EXECFN) } as usize;
        if execfn == 0 {
            return None;
        }
        // SAFETY: see above.
        let len = unsafe { libc::strlen(execfn as *const libc::c_char) };
        Some((execfn + len + 1 + size_of::<usize>()).next_multiple_of(PAGE))
    }

    /// A fault in the guard page is a stack overflow: said, then abort (std's words and
    /// action). Any other fault gets the default action back and happens again on return.
    extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() } as usize;
        let guard = GUARD.load(Ordering::Relaxed);
        if guard != 0 && (guard..guard + PAGE).contains(&addr) {
            let msg = b"\nthread 'main' has overflowed its stack\nfatal runtime error: stack overflow, aborting\n";
            // SAFETY: write and abort are async-signal-safe; the message is a static.
            unsafe {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::abort();
            }
        }
        // SAFETY: restoring the default disposition is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    /// The stack's top found without `/proc` is where `/proc/self/maps` ends the `[stack]`
    /// mapping, from which glibc and std derive the main thread's guard.
    #[test]
    fn stack_top_is_the_end_of_the_stack_mapping() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|l| l.ends_with("[stack]")).unwrap();
        let end = line.split(['-', ' ']).nth(1).unwrap();
        let end = usize::from_str_radix(end, 16).unwrap();
        assert_eq!(super::guard::stack_top(), Some(end));
    }
}
