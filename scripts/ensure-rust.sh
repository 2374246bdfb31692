# Sourced by demo.sh and test.sh: makes sure `cargo` (Rust >= 1.89) is on PATH, installing it with rustup
# when it is missing. Debian 12's own cargo is too old for our dependencies, so rustup is used: Debian's
# `rustup` package where the release has one, else the official rustup installer.
mbx_rust_ok() {
    command -v cargo >/dev/null 2>&1 || return 1
    local minor
    minor=$(rustc --version 2>/dev/null | sed -n 's/^rustc 1\.\([0-9]*\).*/\1/p')
    [[ -n "$minor" && "$minor" -ge 89 ]]
}

if ! mbx_rust_ok && [[ -f "$HOME/.cargo/env" ]]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if ! mbx_rust_ok; then
    echo "ensure-rust: no Rust >= 1.89 found; installing the stable toolchain with rustup" >&2
    if ! command -v rustup >/dev/null 2>&1; then
        if apt-cache policy rustup 2>/dev/null | grep -q 'Candidate: [0-9]'; then
            scripts/install-deps.sh rustup
        else
            scripts/install-deps.sh curl
            curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
            # shellcheck disable=SC1091
            . "$HOME/.cargo/env"
        fi
    fi
    rustup toolchain install stable --profile minimal --component rustfmt,clippy
    rustup default stable
    export PATH="$HOME/.cargo/bin:$PATH"
    mbx_rust_ok || { echo "ensure-rust: could not install Rust; install it from https://rustup.rs" >&2; exit 1; }
fi
