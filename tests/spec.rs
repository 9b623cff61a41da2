//! The spec moves with the code: spec/transitions.md and the exit-code table in
//! spec/lifecycle.md are renderings of `tenure::machine`, and every invariant the spec names is
//! checked somewhere.

use std::path::Path;
use tenure::machine::table;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn bless() -> bool {
    std::env::var_os("TENURE_BLESS").is_some()
}

/// spec/transitions.md is exactly the rendered table (and the insta snapshot pins it too).
#[test]
fn transitions_md_is_rendered_from_the_machine() {
    let rendered = table::render();
    insta::assert_snapshot!("transitions", rendered);
    let path = root().join("spec/transitions.md");
    if bless() {
        std::fs::write(&path, &rendered).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == rendered,
        "spec/transitions.md differs from the machine's rules: run `TENURE_BLESS=1 cargo test --test spec` and review the diff"
    );
}

/// The exit-code table between the markers in spec/lifecycle.md is the rendered one.
#[test]
fn lifecycle_md_exit_codes_are_rendered_from_the_machine() {
    let path = root().join("spec/lifecycle.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- exit-codes:begin -->\n", "<!-- exit-codes:end -->");
    let b = text.find(begin).expect("exit-codes:begin marker") + begin.len();
    let e = text.find(end).expect("exit-codes:end marker");
    let rendered = table::render_exit_codes();
    if bless() && text[b..e] != rendered {
        let new = format!("{}{}{}", &text[..b], rendered, &text[e..]);
        std::fs::write(&path, new).unwrap();
        return;
    }
    assert!(
        text[b..e] == rendered,
        "the exit-code table in spec/lifecycle.md differs from the machine: run `TENURE_BLESS=1 cargo test --test spec`"
    );
}

/// Every row of the table stands for all reachable states with the same label: same decision,
/// same next row, same action kinds. Otherwise the representative would hide a rule.
#[test]
fn representatives_are_faithful() {
    for (name, config) in table::profiles() {
        let reps = table::representatives(config);
        for m in table::reachable(config) {
            let label = table::row_label(&m);
            let rep = reps.iter().find(|r| table::row_label(r) == label).unwrap();
            for e in tenure::machine::Event::samples() {
                let shape = |c: table::Cell| match c {
                    table::Cell::Move(next, actions) => format!(
                        "move {next} [{}]",
                        actions
                            .iter()
                            .map(|a| a.split('(').next().unwrap().to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                    table::Cell::Ignored => "ignored".into(),
                    table::Cell::Rejected => "rejected".into(),
                };
                assert_eq!(
                    shape(table::cell(&m, e)),
                    shape(table::cell(rep, e)),
                    "{name}: state {:?} and its representative differ on {e}",
                    m.phase()
                );
            }
        }
    }
}

/// Every invariant id in spec/lifecycle.md is referenced by at least one test or model outside
/// spec/, so no invariant is left unchecked.
#[test]
fn every_invariant_is_checked_somewhere() {
    let spec = std::fs::read_to_string(root().join("spec/lifecycle.md")).unwrap();
    let ids: Vec<String> = spec
        .lines()
        .filter_map(|l| l.strip_prefix("- **I"))
        .map(|rest| format!("I{}", rest.split(' ').next().unwrap()))
        .collect();
    assert!(
        ids.len() >= 10,
        "expected the invariant list, found {ids:?}"
    );
    let mut corpus = String::new();
    for dir in ["tests", "models/src", "models/tests", "src"] {
        collect(&root().join(dir), &mut corpus);
    }
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| {
            // An id counts when it appears as a whole word (I1 must not match I12).
            !corpus
                .match_indices(id.as_str())
                .any(|(i, _)| !corpus[i + id.len()..].starts_with(|c: char| c.is_ascii_digit()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "invariants referenced by no test or model: {missing:?}"
    );
}

fn collect(dir: &Path, out: &mut String) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "snapshots") {
                collect(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("tests/spec.rs") {
            out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            out.push('\n');
        }
    }
}
