//! `examples/tenure.service` (cards T3, T5) parses and says what the README promises:
//! `systemd-analyze verify` accepts it without a warning (where systemd-analyze is installed; a
//! broken copy shows that the check can fail), its settings fit tenure's (`Type=notify`,
//! `KillMode=mixed`, `SuccessExitStatus=143`, `TimeoutStopSec` longer than the grace plus the
//! kill wait), and its `ExecStart` is a command line the real `tenure` accepts.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn unit_text() -> String {
    read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tenure.service"))
}

/// `[Service]` keys and values (the last assignment wins, as systemd does for these keys).
fn service_keys(text: &str) -> BTreeMap<String, String> {
    let mut section = String::new();
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (k, v) = line.split_once('=').expect("KEY=VALUE");
        if section == "Service" {
            out.insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
    out
}

/// The unit with the installed paths replaced by this build's binary and a harmless command.
fn localised(text: &str, dir: &Path) -> String {
    text.replace("/usr/local/bin/tenure", bin())
        .replace("/usr/local/bin/myapp --serve", "/bin/sleep 1000")
        .replace("/var/lib/myapp", dir.to_str().unwrap())
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Runs `systemd-analyze verify` on `unit` written as `name`; returns (success, output).
fn verify(env: &Env, analyze: &Path, name: &str, unit: &str) -> (bool, String) {
    let path = env.path(name);
    std::fs::write(&path, unit).unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run systemd-analyze");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && text.trim().is_empty(), text)
}

#[test]
fn example_unit_is_valid_for_systemd() {
    let text = unit_text();
    let env = Env::new();
    match which("systemd-analyze") {
        Some(analyze) => {
            let unit = localised(&text, &env.dir);
            let (ok, out) = verify(&env, &analyze, "myapp.service", &unit);
            assert!(ok, "systemd-analyze verify complained:\n{out}\n{unit}");
            // The same check on a broken copy must complain: it can fail.
            let broken = unit.replace("KillMode=mixed", "KillMode=mixd");
            let (ok, out) = verify(&env, &analyze, "broken.service", &broken);
            assert!(!ok && out.to_lowercase().contains("kill mode"), "{out}");
        }
        None => eprintln!(
            "NOTICE: systemd-analyze is not installed; example_unit_is_valid_for_systemd checks the keys only"
        ),
    }
}

#[test]
fn example_unit_settings_fit_tenure() {
    let keys = service_keys(&unit_text());
    assert_eq!(keys["Type"], "notify");
    assert_eq!(keys["KillMode"], "mixed");
    assert_eq!(keys["KillSignal"], "SIGTERM");
    assert!(
        keys["SuccessExitStatus"]
            .split_whitespace()
            .any(|c| c == "143"),
        "tenure exits 143 after a SIGTERM stop"
    );
    assert_eq!(keys["Delegate"], "yes");
    assert_eq!(keys["StateDirectoryMode"], "0700");
    let exec: Vec<&str> = keys["ExecStart"].split_whitespace().collect();
    let secs = |flag: &str| -> f64 {
        let i = exec.iter().position(|a| *a == flag).expect(flag);
        exec[i + 1].parse().expect("seconds")
    };
    let stop: f64 = keys["TimeoutStopSec"].parse().expect("seconds");
    assert!(
        stop > secs("--grace") + secs("--kill-wait"),
        "TimeoutStopSec {stop} must exceed --grace + --kill-wait"
    );
    assert_eq!(keys["ExecReload"], "/bin/kill -HUP $MAINPID");
}

/// The `ExecStart` line is one the real `tenure` runs: its options parse and a workload that
/// sends READY=1 makes it ready (here under `systemd-notify`, the real sd_notify client).
#[test]
fn example_unit_exec_start_runs() {
    let env = Env::new();
    let exec = service_keys(&localised(&unit_text(), &env.dir))["ExecStart"].clone();
    let mut words: Vec<String> = exec.split_whitespace().map(str::to_owned).collect();
    let dashdash = words.iter().position(|w| w == "--").unwrap();
    words.truncate(dashdash + 1);
    words.extend(sh("systemd-notify --ready; read _", &[]));
    let mut c = Command::new(&words[0]);
    c.args(&words[1..])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("TENURE_FAILPOINTS");
    let r = env.start(c);
    env.wait_status("ready", |s| s["phase"] == "ready");
    r.signal(rustix::process::Signal::TERM);
    let f = r.wait();
    assert!(f.elapsed < Duration::from_secs(60));
    f.expect_code(143);
}
