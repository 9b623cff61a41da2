//! The behaviour cards resolve inside the repository: every card id the code and the tests cite
//! is defined in spec/scenarios.md, and every card there names tests that exist.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The card groups and their letters.
const GROUPS: &[char] = &['L', 'G', 'D', 'H', 'R', 'T', 'P'];

/// A card as spec/scenarios.md defines it: its id and the tests it names.
#[derive(Debug)]
struct Card {
    tests: Vec<String>,
}

/// Parses spec/scenarios.md: `### L1 title`, then a paragraph, then `Tests:` with a list of
/// backquoted `path::function` names (the list may wrap over several lines).
fn cards() -> BTreeMap<String, Card> {
    let text = std::fs::read_to_string(root().join("spec/scenarios.md")).unwrap();
    let mut cards = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut in_tests = false;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            let id = h.split(' ').next().unwrap().to_owned();
            assert!(is_card_id(&id), "bad card heading {line:?}");
            assert!(
                cards
                    .insert(id.clone(), Card { tests: Vec::new() })
                    .is_none(),
                "card {id} is defined twice"
            );
            current = Some(id);
            in_tests = false;
            continue;
        }
        if line.starts_with("## ") || line.trim().is_empty() {
            in_tests = false;
            continue;
        }
        let rest = match line.strip_prefix("Tests:") {
            Some(r) => {
                in_tests = true;
                r
            }
            None if in_tests => line,
            None => continue,
        };
        let id = current.as_ref().expect("a Tests: line before any card");
        let card = cards.get_mut(id).unwrap();
        for (i, part) in rest.split('`').enumerate() {
            if i % 2 == 1 {
                card.tests.push(part.to_owned());
            }
        }
    }
    cards
}

/// `L1`, `G6`, `L10`: a group letter and a number.
fn is_card_id(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|g| GROUPS.contains(&g))
        && !c.as_str().is_empty()
        && c.as_str().len() <= 3
        && c.as_str().bytes().all(|b| b.is_ascii_digit())
        && !c.as_str().starts_with('0')
}

/// Every card id a source text cites: whole words like `L2` (not `0xD5`, not `L2a`), and the
/// leading parts of test names like `fn l2_g3_...`.
fn cited(src: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for word in src.split(|c: char| !c.is_ascii_alphanumeric()) {
        if is_card_id(word) {
            out.insert(word.to_owned());
        }
    }
    for l in src.lines() {
        let Some(name) = l.split("fn ").nth(1) else {
            continue;
        };
        let name: String = name
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // Only leading parts followed by more of the name (`l2_...`), never a whole name
        // (`fn p90(`, a percentile).
        let parts: Vec<&str> = name.split('_').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            let upper = part.to_ascii_uppercase();
            if **part != upper && is_card_id(&upper) {
                out.insert(upper);
            } else {
                break;
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every card id cited in src/, tests/, models/ and benches/ is defined in spec/scenarios.md.
#[test]
fn every_cited_card_is_defined() {
    let cards = cards();
    assert!(
        cards.len() >= 40,
        "expected every card, found {:?}",
        cards.keys()
    );
    let mut files = Vec::new();
    for dir in [
        "src",
        "tests",
        "models/src",
        "models/tests",
        "benches",
        "fuzz/fuzz_targets",
    ] {
        rust_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} sources", files.len());
    let mut undefined: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        for id in cited(&src) {
            if !cards.contains_key(&id) {
                let shown = f.strip_prefix(root()).unwrap_or(f).display().to_string();
                undefined.entry(id).or_default().push(shown);
            }
        }
    }
    assert!(
        undefined.is_empty(),
        "card ids cited but not defined in spec/scenarios.md: {undefined:?}"
    );
}

/// Every card names at least one test, and every test it names exists: the file is there and
/// holds a test function of that name.
#[test]
fn every_card_names_existing_tests() {
    let mut missing = Vec::new();
    for (id, card) in cards() {
        assert!(!card.tests.is_empty(), "card {id} names no test");
        for t in &card.tests {
            let (file, name) = t
                .rsplit_once("::")
                .unwrap_or_else(|| panic!("card {id}: {t:?} is not `path::function`"));
            let Ok(src) = std::fs::read_to_string(root().join(file)) else {
                missing.push(format!("{id}: {file} does not exist"));
                continue;
            };
            if !is_test_fn(&src, name) {
                missing.push(format!("{id}: no test `{name}` in {file}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "spec/scenarios.md names tests that do not exist: {missing:#?}"
    );
}

/// Whether `src` defines a function `name` marked `#[test]` (or a proptest case).
fn is_test_fn(src: &str, name: &str) -> bool {
    let lines: Vec<&str> = src.lines().collect();
    lines.iter().enumerate().any(|(n, l)| {
        let Some(after) = l.split("fn ").nth(1) else {
            return false;
        };
        let defined: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        defined == name
            && lines[..n]
                .iter()
                .rev()
                .take_while(|p| {
                    let p = p.trim();
                    p.starts_with("#[") || p.starts_with("///") || p.starts_with("//")
                })
                .any(|p| p.trim().starts_with("#[test") || p.contains("proptest"))
    })
}

/// The extractors themselves: what counts as a citation and a test.
#[test]
fn citations_and_tests_are_recognised() {
    let src =
        "// card L2 and G6, not 0xD5 nor L2a nor L0\nfn t3_p1_named() {}\nfn helper_d4() {}\n";
    let got: Vec<String> = cited(src).into_iter().collect();
    assert_eq!(got, ["G6", "L2", "P1", "T3"]);
    let src = "/// doc\n#[test]\nfn real() {}\nfn helper() {}\n";
    assert!(is_test_fn(src, "real"));
    assert!(!is_test_fn(src, "helper"));
    assert!(!is_test_fn(src, "absent"));
}
