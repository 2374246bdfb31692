#!/usr/bin/env bash
# Quick start 2/2: install what is missing, then run the whole test suite:
# formatting, lints (warnings are errors) and every test of every crate, real peers and the demo included.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
. scripts/ensure-rust.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --quiet -- -D warnings
step "cargo test (all crates)"
cargo test --workspace --no-fail-fast
