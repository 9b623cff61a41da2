//! [`Shared`]: a value that the states holding it unchanged share, hashed once.
//!
//! A model state is cloned for every successor and fingerprinted (hashed whole) once per
//! successor. Most of a state is the same in a state and its successors — the inodes of the
//! crash filesystem a step did not touch, the plan of a process that did not step — so those
//! parts are kept behind a reference count (a clone is an increment) and carry the hash of
//! their value, computed the first time it is asked for and forgotten when the value is
//! changed ([`Shared::make_mut`]). Equality is by value (with a shortcut for the same
//! allocation), so two states are equal exactly when their values are; the hash of a
//! [`Shared`] is the hash of its value, so equal values hash alike.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{self, AtomicU64};

/// A shared, copy-on-write value with a cached hash.
pub struct Shared<T>(Arc<Inner<T>>);

/// The value and its hash once computed ([`UNKNOWN`] until then). A plain atomic, not a
/// `OnceLock`: two threads that both compute the hash store the same number, so nothing but
/// the atomic is needed, and every new inode of every state goes through this (a
/// `OnceLock`'s initialisation cost about as much as the hash itself).
struct Inner<T> {
    value: T,
    hash: AtomicU64,
}

/// The cached hash of a value whose hash is not computed yet; a value that hashes to it is
/// stored as [`UNKNOWN`] + 1 (equal values still hash alike).
const UNKNOWN: u64 = 0;

impl<T: Clone> Clone for Inner<T> {
    fn clone(&self) -> Inner<T> {
        Inner {
            value: self.value.clone(),
            hash: AtomicU64::new(self.hash.load(atomic::Ordering::Relaxed)),
        }
    }
}

impl<T> Shared<T> {
    /// `value`, not shared yet.
    pub fn new(value: T) -> Shared<T> {
        Shared(Arc::new(Inner {
            value,
            hash: AtomicU64::new(UNKNOWN),
        }))
    }

    /// Whether `a` and `b` are the same allocation (then they are equal).
    pub fn ptr_eq(a: &Shared<T>, b: &Shared<T>) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<T: Clone> Shared<T> {
    /// The value, to change it: copied first if another state shares it; its cached hash is
    /// forgotten.
    pub fn make_mut(&mut self) -> &mut T {
        let inner = Arc::make_mut(&mut self.0);
        *inner.hash.get_mut() = UNKNOWN;
        &mut inner.value
    }

    /// The value, taken out (copied if another state shares it).
    pub fn into_inner(self) -> T {
        match Arc::try_unwrap(self.0) {
            Ok(inner) => inner.value,
            Err(shared) => shared.value.clone(),
        }
    }
}

impl<T: Hash> Shared<T> {
    /// The hash of the value (a fixed-key hasher: the same in every state and every run).
    fn value_hash(&self) -> u64 {
        match self.0.hash.load(atomic::Ordering::Relaxed) {
            UNKNOWN => {
                let h = match crate::run::fingerprint(&self.0.value) {
                    UNKNOWN => UNKNOWN + 1,
                    h => h,
                };
                self.0.hash.store(h, atomic::Ordering::Relaxed);
                h
            }
            h => h,
        }
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Shared<T> {
        Shared(Arc::clone(&self.0))
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0.value
    }
}

impl<T: Hash> Hash for Shared<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.value_hash());
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Shared<T>) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.value == other.0.value
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: PartialOrd> PartialOrd for Shared<T> {
    fn partial_cmp(&self, other: &Shared<T>) -> Option<Ordering> {
        if Arc::ptr_eq(&self.0, &other.0) {
            return Some(Ordering::Equal);
        }
        self.0.value.partial_cmp(&other.0.value)
    }
}

impl<T: Ord> Ord for Shared<T> {
    fn cmp(&self, other: &Shared<T>) -> Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return Ordering::Equal;
        }
        self.0.value.cmp(&other.0.value)
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.value.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_of<T: Hash>(v: &T) -> u64 {
        crate::run::fingerprint(v)
    }

    /// Equal values are equal and hash alike whether or not they share an allocation; a
    /// change forgets the cached hash.
    #[test]
    fn equal_values_hash_alike_and_changes_rehash() {
        let a = Shared::new(vec![1, 2, 3]);
        let b = Shared::new(vec![1, 2, 3]);
        assert_eq!(a, b);
        assert_eq!(hash_of(&a), hash_of(&b));
        let mut c = a.clone();
        assert!(Shared::ptr_eq(&a, &c));
        c.make_mut().push(4);
        assert_ne!(a, c);
        assert_ne!(hash_of(&a), hash_of(&c));
        assert_eq!(*a, vec![1, 2, 3]);
        c.make_mut().pop();
        assert_eq!(a, c);
        assert_eq!(hash_of(&a), hash_of(&c));
        assert_eq!(c.into_inner(), vec![1, 2, 3]);
    }
}
