#!/usr/bin/env bash
# Runs the BlindBox benchmark (paper Table 2 rows beside aho-corasick and Hyperscan on the same
# plaintext) and writes docs/bench/blindbox.json and docs/bench/blindbox.png.
# Installs what is missing first: Debian's libhyperscan-dev (the Hyperscan baseline) and Rust.
#
# Usage: scripts/bench-blindbox.sh [RUNS [CORPUS_MIB]]   (default: 9 runs over 2 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh libhyperscan-dev
. scripts/ensure-rust.sh
cargo run --release -p mbx-blindbox --example blindbox_bench --features bench-hyperscan -- \
    "${1:-9}" "${2:-2}"
