#!/usr/bin/env bash
# Quick start 1/2: install what is missing, build, and run the demo on loopback.
# Extra arguments go to `mbx demo` (see `mbx demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
. scripts/ensure-rust.sh
cargo build --quiet -p mbx-cli --bin mbx
exec target/debug/mbx demo "$@"
