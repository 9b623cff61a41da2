//! Planted bugs for the models' mutation table.
//!
//! The models claim to check the real code, so the claim is tested by planting plausible bugs in
//! the real code and showing that a model property fails for each. Product code marks the place
//! of such a bug with [`on`]: `if mutant::on("gc-deletes-current") { ... the bug ... }`. Without
//! the `mutants` cargo feature `on` is a constant `false` that the compiler removes, so release
//! builds carry no trace of it. With the feature, the one active mutant comes from a `scoped`
//! selection (in-process tests, `tenure-models check MODEL --mutant NAME`) or else from the
//! environment variable `TENURE_MUTANT` (child processes).
//!
//! One mutant at a time: the selection is process-wide (the model checker runs on threads of its
//! own), so `scoped` hands it out to one test at a time, and tests that must never see a
//! mutant live in another test binary than the tests that plant them.
//!
//! The catalogue of names, with the property that must fail for each, is the models' mutation
//! table (`models/README.md`).

#[cfg(feature = "mutants")]
mod enabled {
    // Test-only process-global state; loom never enables the `mutants` feature.
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, MutexGuard, PoisonError};

    static ACTIVE: Mutex<Option<&'static str>> = Mutex::new(None);
    /// Whether any mutant may be planted: the models ask [`on`] millions of times per second,
    /// and almost always none is.
    static ANY: AtomicBool = AtomicBool::new(false);
    /// Held by the one [`Scoped`] selection in force.
    static SCOPE: Mutex<()> = Mutex::new(());

    /// A mutant selected in this process (overriding `TENURE_MUTANT`) until it is dropped, even
    /// when the test panics.
    #[must_use = "the mutant is removed when the guard is dropped"]
    pub struct Scoped {
        _one_at_a_time: MutexGuard<'static, ()>,
    }

    /// Plants the mutant `name` in this process until the returned guard is dropped. Waits while
    /// another thread's mutant is planted.
    pub fn scoped(name: &'static str) -> Scoped {
        let one = SCOPE.lock().unwrap_or_else(PoisonError::into_inner);
        *ACTIVE.lock().unwrap_or_else(PoisonError::into_inner) = Some(name);
        ANY.store(true, Ordering::SeqCst);
        Scoped {
            _one_at_a_time: one,
        }
    }

    impl Drop for Scoped {
        fn drop(&mut self) {
            *ACTIVE.lock().unwrap_or_else(PoisonError::into_inner) = None;
            ANY.store(from_env().is_some(), Ordering::SeqCst);
        }
    }

    fn from_env() -> &'static Option<String> {
        static ENV: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        ENV.get_or_init(|| {
            let v = std::env::var("TENURE_MUTANT")
                .ok()
                .filter(|v| !v.is_empty());
            if v.is_some() {
                ANY.store(true, Ordering::SeqCst);
            }
            v
        })
    }

    /// Whether the mutant `name` is planted.
    pub fn on(name: &str) -> bool {
        if from_env().is_none() && !ANY.load(Ordering::Relaxed) {
            return false;
        }
        if let Some(active) = *ACTIVE.lock().unwrap_or_else(PoisonError::into_inner) {
            return active == name;
        }
        from_env().as_deref() == Some(name)
    }

    /// The planted mutant, if any.
    pub fn active() -> Option<String> {
        if let Some(active) = *ACTIVE.lock().unwrap_or_else(PoisonError::into_inner) {
            return Some(active.to_owned());
        }
        from_env().clone()
    }
}

#[cfg(feature = "mutants")]
pub use enabled::{Scoped, active, on, scoped};

/// Without the `mutants` feature no mutant is ever planted.
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub const fn on(_name: &str) -> bool {
    false
}

#[cfg(all(test, feature = "mutants"))]
mod tests {
    use super::*;

    #[test]
    fn a_scoped_mutant_is_planted_only_while_its_guard_lives() {
        assert!(!on("test-only-mutant"));
        {
            let _m = scoped("test-only-mutant");
            assert!(on("test-only-mutant"));
            assert!(!on("another-mutant"));
            assert_eq!(active().as_deref(), Some("test-only-mutant"));
        }
        assert!(!on("test-only-mutant"));
    }
}
