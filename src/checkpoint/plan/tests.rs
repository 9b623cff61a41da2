//! Unit tests of the plans that need no filesystem: the sha256 state a plan holds.

use super::HashState;

#[test]
fn hash_states_compare_by_what_they_hashed() {
    let mut a = HashState::default();
    let mut b = HashState::default();
    a.update(b"abc");
    assert_ne!(a, b);
    b.update(b"ab");
    b.update(b"c");
    assert_eq!(a, b);
    assert_eq!(a.digest(), crate::checkpoint::hash::digest_bytes(b"abc"));
    let hash = |h: &HashState| {
        use std::hash::{Hash, Hasher};
        let mut s = std::collections::hash_map::DefaultHasher::new();
        h.hash(&mut s);
        s.finish()
    };
    assert_eq!(hash(&a), hash(&b));
}
