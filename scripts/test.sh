#!/usr/bin/env bash
# Quick start 2/2: install what is missing, then run the whole test suite:
# formatting, lints (warnings are errors) and every test of every crate, real peers and the demo included.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
. scripts/ensure-rust.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# One full build of every target: incremental artefacts would only double the disk it needs.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
step() { printf '\n==> %s\n' "$*"; }

# A clean build of every target takes about 3 GB under target/; say so before the linker fails on a full disk.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "${free_kib:-0}" -lt $((4 * 1024 * 1024)) ] && [ ! -d target/debug/deps ]; then
    echo "warning: only $((free_kib / 1024)) MiB free here; a clean build needs about 3 GB" >&2
fi

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --quiet -- -D warnings
step "cargo test (all crates)"
cargo test --workspace --no-fail-fast
