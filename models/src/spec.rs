//! The exit-code table of spec/lifecycle.md, read from the document itself, as an oracle for
//! invariant I10 that does not go through `Outcome::code`.
//!
//! The table lists example end records (`stopped/SIGTERM`, `exited/3`, ...) with their codes.
//! Three readings turn it into a function of an end record:
//! 1. a row with exactly this record gives its code;
//! 2. `exited/N` is the child's code passed through: N;
//! 3. `reason/SIGX` where the table has a `reason/SIGY` row whose words say `128 + N` is
//!    128 + the number of SIGX;
//! 4. `reason/anything` where every row of that reason has the same code is that code (e.g.
//!    `publish-failed/SIGTERM` is 74: the detail names the drain's cause, not the code).
//!
//! A record none of these cover is a gap in the spec table and is reported as such.

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The spec document, compiled in so the models check the text that is in the tree.
const LIFECYCLE_MD: &str = include_str!("../../spec/lifecycle.md");

/// The exit-code table as read from spec/lifecycle.md.
#[derive(Debug, Clone)]
pub struct ExitTable {
    /// End record → code, for rows that name one.
    exact: BTreeMap<String, u8>,
    /// Reasons whose signal rows are `128 + N`.
    signal_reasons: Vec<String>,
    /// Reason → the codes its rows give.
    by_reason: BTreeMap<String, Vec<u8>>,
}

/// Why an end record has no code in the spec table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap(pub String);

impl ExitTable {
    /// Parses the table between the `exit-codes` markers of a lifecycle document.
    pub fn parse(doc: &str) -> ExitTable {
        let begin = "<!-- exit-codes:begin -->";
        let end = "<!-- exit-codes:end -->";
        let b = doc
            .find(begin)
            .expect("spec/lifecycle.md has the exit-codes:begin marker");
        let e = doc
            .find(end)
            .expect("spec/lifecycle.md has the exit-codes:end marker");
        let mut exact = BTreeMap::new();
        let mut signal_reasons = Vec::new();
        let mut by_reason: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for line in doc[b + begin.len()..e].lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // `| code | when | record |` splits into ["", code, when, record, ""].
            if cells.len() != 5 {
                continue;
            }
            let Ok(code) = cells[1].parse::<u8>() else {
                continue;
            };
            let Some(record) = cells[3].strip_prefix('`').and_then(|r| r.strip_suffix('`')) else {
                continue;
            };
            exact.insert(record.to_string(), code);
            if let Some((reason, _)) = record.split_once('/') {
                let codes = by_reason.entry(reason.to_string()).or_default();
                if !codes.contains(&code) {
                    codes.push(code);
                }
            }
            if cells[2].contains("128 +")
                && let Some((reason, sig)) = record.split_once('/')
                && sig.starts_with("SIG")
            {
                signal_reasons.push(reason.to_string());
            }
        }
        assert!(
            exact.len() >= 10,
            "the exit-code table in spec/lifecycle.md looks empty"
        );
        ExitTable {
            exact,
            signal_reasons,
            by_reason,
        }
    }

    /// The table of the spec in this tree.
    pub fn spec() -> &'static ExitTable {
        static TABLE: OnceLock<ExitTable> = OnceLock::new();
        TABLE.get_or_init(|| ExitTable::parse(LIFECYCLE_MD))
    }

    /// The code the spec table gives for an end record such as `stopped/SIGINT`.
    pub fn code_of(&self, record: &str) -> Result<u8, Gap> {
        if let Some(c) = self.exact.get(record) {
            return Ok(*c);
        }
        let (reason, detail) = record
            .split_once('/')
            .ok_or_else(|| Gap(format!("`{record}` is not reason/detail")))?;
        if reason == "exited"
            && let Ok(n) = detail.parse::<u8>()
        {
            return Ok(n);
        }
        if self.signal_reasons.iter().any(|r| r == reason)
            && let Some(n) = signal_number(detail)
        {
            return Ok(128 + n);
        }
        if let Some([only]) = self.by_reason.get(reason).map(Vec::as_slice) {
            return Ok(*only);
        }
        Err(Gap(format!(
            "the exit-code table in spec/lifecycle.md has no row for `{record}`"
        )))
    }
}

fn signal_number(name: &str) -> Option<u8> {
    Some(match name {
        "SIGHUP" => 1,
        "SIGINT" => 2,
        "SIGKILL" => 9,
        "SIGTERM" => 15,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_spec_table() {
        let t = ExitTable::spec();
        assert_eq!(t.code_of("stopped/SIGTERM"), Ok(143));
        assert_eq!(t.code_of("stopped/SIGHUP"), Ok(129));
        assert_eq!(t.code_of("exited/0"), Ok(0));
        assert_eq!(t.code_of("exited/42"), Ok(42));
        assert_eq!(t.code_of("busy/75"), Ok(75));
        assert_eq!(t.code_of("refused/SIGINT"), Ok(130));
        assert_eq!(t.code_of("killed/SIGKILL"), Ok(137));
        assert_eq!(t.code_of("did-not-stop/SIGKILL"), Ok(70));
        assert_eq!(t.code_of("publish-failed/SIGTERM"), Ok(74));
        assert_eq!(t.code_of("busy/SIGTERM"), Ok(75));
        assert!(t.code_of("nonsense").is_err());
        assert!(t.code_of("stopped/xyz").is_err());
    }
}
