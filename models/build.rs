//! Turns the `TENURE_LONG` environment variable into `cfg(tenure_long)`, so the long model
//! checks in `tests/long.rs` run when it is set and are listed as ignored otherwise (never
//! passed silently).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tenure_long)");
    println!("cargo::rerun-if-env-changed=TENURE_LONG");
    if std::env::var_os("TENURE_LONG").is_some_and(|v| !v.is_empty() && v != "0") {
        println!("cargo::rustc-cfg=tenure_long");
    }
}
