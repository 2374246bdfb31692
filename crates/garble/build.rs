//! Enables the VAES path (`src/vaes.rs`) on compilers that have its intrinsics (Rust 1.89, which
//! stabilized the `vaes` target feature). Older compilers within the workspace MSRV (1.80) build
//! the portable path only: same output, slower garbling.

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(mbx_garble_vaes)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=RUSTC");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            // "rustc 1.95.0 (59807616e 2026-04-14)"
            let version = v.split_whitespace().nth(1)?.to_owned();
            let mut parts = version.split('.');
            let major: u32 = parts.next()?.parse().ok()?;
            let minor: u32 = parts.next()?.parse().ok()?;
            (major == 1).then_some(minor)
        });
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo::rustc-cfg=mbx_garble_vaes");
    }
}
