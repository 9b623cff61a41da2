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

/// Every invariant id in spec/lifecycle.md is claimed by at least one test or model in tests/
/// or models/, so no invariant is left unchecked.
///
/// What counts as a claim (a bare mention anywhere used to count, even a comment in
/// src/): the id in the name of a `#[test]` function (`fn i3_...`), in the doc comment of a
/// `#[test]` function (the test says it checks it), or inside a string literal — an assertion
/// or panic message, or a model property's catalogue entry (`models/src/catalog.rs` maps each
/// property to its invariant). Plain comments, doc comments of other items and everything in
/// src/ do not count: they can name an invariant that nothing checks.
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
    let mut claims = Vec::new();
    for dir in ["tests", "models/src", "models/tests"] {
        collect(&root().join(dir), &mut claims);
    }
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| !claims.iter().any(|c| names(c, id)))
        .collect();
    assert!(
        missing.is_empty(),
        "invariants no test or model claims (in a test's name or doc comment, or an assertion \
         message or property catalogue entry): {missing:?}"
    );
}

/// The claim extractor itself: comments and non-test docs are not claims; test names, test
/// docs and string literals are.
#[test]
fn invariant_claims_are_only_tests_and_assertions() {
    let src = r##"
// I91 in a plain comment
/// I92 in the doc of a helper
fn helper_i93() { let c = 'x'; let r = r#"I94 in a raw string"#; }
/* I95 in a block comment */
/// Checks invariant I96.
#[test]
#[cfg(unix)]
fn i97_named_test() { assert!(true, "I98 in an assertion"); }
"##;
    let claims = claims_of(src);
    for (id, claimed) in [
        ("I91", false),
        ("I92", false),
        ("I93", false),
        ("I94", true),
        ("I95", false),
        ("I96", true),
        ("I97", true),
        ("I98", true),
        ("I9", false),
    ] {
        assert_eq!(
            claims.iter().any(|c| names(c, id)),
            claimed,
            "{id} in {claims:?}"
        );
    }
}

/// Whether `text` names `id` as a whole word (I1 must not match I12), or as a `_`-separated
/// part of a test name (`i1_...`).
fn names(text: &str, id: &str) -> bool {
    let lower = id.to_lowercase();
    text.match_indices(id).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + id.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric())
            && !after.is_some_and(|c| c.is_ascii_digit())
    }) || text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w == lower)
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn collect(dir: &Path, out: &mut Vec<String>) {
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
            out.extend(claims_of(&std::fs::read_to_string(&p).unwrap_or_default()));
        }
    }
}

/// The claims in one Rust source: its string literals, and the name and doc comment of each
/// `#[test]` function.
fn claims_of(src: &str) -> Vec<String> {
    let (strings, masked) = lex(src);
    let mut claims = strings;
    let lines: Vec<&str> = src.lines().collect();
    let masked_lines: Vec<&str> = masked.lines().collect();
    for (n, l) in masked_lines.iter().enumerate() {
        if l.trim() != "#[test]" {
            continue;
        }
        // The function: the first `fn NAME` after the attribute.
        if let Some(name) = masked_lines[n..]
            .iter()
            .find_map(|l| l.split("fn ").nth(1))
            .and_then(|rest| {
                rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
            })
        {
            claims.push(name.to_owned());
        }
        // Its doc comment: the `///` lines above, across other attributes.
        let mut doc = String::new();
        for l in lines[..n].iter().rev() {
            let t = l.trim_start();
            if let Some(d) = t.strip_prefix("///") {
                doc.insert_str(0, &format!("{d}\n"));
            } else if !t.starts_with("#[") {
                break;
            }
        }
        claims.push(doc);
    }
    claims
}

/// Splits Rust source into its string literals (contents) and a copy with every comment,
/// string and char literal blanked out (newlines kept), so attributes and names can be found
/// by line.
fn lex(src: &str) -> (Vec<String>, String) {
    let b: Vec<char> = src.chars().collect();
    let mut strings = Vec::new();
    let mut masked = String::with_capacity(src.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                masked.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    masked.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    masked.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    masked.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if (c == 'r' || (c == 'b' && next == Some('r')))
            && !b[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
            && {
                let j = if c == 'b' { i + 2 } else { i + 1 };
                let mut k = j;
                while b.get(k) == Some(&'#') {
                    k += 1;
                }
                b.get(k) == Some(&'"')
            }
        {
            // A raw string: r"..", r#".."#, br"..".
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            let mut hashes = 0;
            while b[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            let start = j;
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while j < b.len() && b[j..].iter().take(close.len()).ne(close.iter()) {
                j += 1;
            }
            strings.push(b[start..j.min(b.len())].iter().collect());
            let end = (j + close.len()).min(b.len());
            masked.extend(b[i..end].iter().map(|c| blank(*c)));
            i = end;
        } else if c == '"' {
            let mut j = i + 1;
            let mut s = String::new();
            while j < b.len() && b[j] != '"' {
                if b[j] == '\\' {
                    s.push(b[j]);
                    j += 1;
                }
                if j < b.len() {
                    s.push(b[j]);
                }
                j += 1;
            }
            strings.push(s);
            let end = (j + 1).min(b.len());
            masked.extend(b[i..end].iter().map(|c| blank(*c)));
            i = end;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only the former closes.
            let end = if next == Some('\\') {
                b[i + 2..]
                    .iter()
                    .position(|c| *c == '\'')
                    .map(|p| i + 3 + p)
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(e) => {
                    masked.extend(b[i..e].iter().map(|c| blank(*c)));
                    i = e;
                }
                None => {
                    masked.push(c);
                    i += 1;
                }
            }
        } else {
            masked.push(c);
            i += 1;
        }
    }
    (strings, masked)
}
