#!/usr/bin/env bash
# Installs the Debian packages the mbx test suite and benchmarks need.
#
# Idempotent: only missing packages are installed, and `apt-get update` runs only if something is
# missing. Non-interactive (safe in CI with no stdin). Uses sudo when not root.
#
# Usage: scripts/install-deps.sh [extra-package ...]
#   MBX_EXTRA_PACKAGES="softhsm2 tshark" scripts/install-deps.sh   # also accepted
set -euo pipefail

# Packages needed by the test suite. Later issues append here (e.g. softhsm2, libhyperscan-dev,
# tshark, wrk).
PACKAGES=(
    nginx            # real TLS server peer (crates/testbed peers::Nginx)
    openssl          # s_server / s_client / verify
    curl             # real TLS client peer
    gnutls-bin       # gnutls-serv / gnutls-cli: legacy peers on a TLS stack other than OpenSSL
    iproute2         # `ip netns`, veth pairs (crates/testbed netns)
    nftables         # `nft`: the redirect in front of the transparent mbTLS middlebox (netns test)
    iputils-ping     # ping across namespaces
    pkg-config       # openssl-sys finds libssl through pkg-config
    libssl-dev       # OpenSSL 3 headers and libraries for the openssl crate
    build-essential  # C compiler and make for crates with C parts
    ca-certificates  # cargo/rustup over HTTPS
    softhsm2         # PKCS#11 token for the keyless key server's HSM tests
)

# Extra packages from arguments or the environment.
if [[ $# -gt 0 ]]; then
    PACKAGES+=("$@")
fi
if [[ -n "${MBX_EXTRA_PACKAGES:-}" ]]; then
    # shellcheck disable=SC2206  # word splitting intended
    PACKAGES+=(${MBX_EXTRA_PACKAGES})
fi

export DEBIAN_FRONTEND=noninteractive

log() { printf 'install-deps: %s\n' "$*" >&2; }

if ! command -v dpkg >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    log "this script supports Debian/Ubuntu (dpkg and apt-get) only."
    log "install these packages with your system's package manager: ${PACKAGES[*]}"
    exit 1
fi

installed() {
    # `dpkg -s` succeeds for removed-but-configured packages too; require "install ok installed".
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

MISSING=()
for pkg in "${PACKAGES[@]}"; do
    if installed "$pkg"; then
        :
    else
        MISSING+=("$pkg")
    fi
done

if [[ ${#MISSING[@]} -eq 0 ]]; then
    log "all ${#PACKAGES[@]} packages already installed."
else
    SUDO=()
    if [[ "$(id -u)" -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            # -n: never prompt (no stdin in CI); fails clearly if a password would be needed.
            SUDO=(sudo -n)
        else
            log "missing: ${MISSING[*]}"
            log "not root and sudo is not installed; run this script as root."
            exit 1
        fi
    fi
    log "installing: ${MISSING[*]}"
    APT_OPTS=(-q -o DPkg::Lock::Timeout=600)
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" update </dev/null
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" install -y \
        --no-install-recommends "${MISSING[@]}" </dev/null
    for pkg in "${MISSING[@]}"; do
        if ! installed "$pkg"; then
            log "package $pkg is still not installed after apt-get install."
            exit 1
        fi
    done
    log "installed ${#MISSING[@]} package(s)."
fi

# The Rust toolchain is handled by scripts/ensure-rust.sh (sourced by demo.sh and test.sh), because
# it must change the caller's PATH.
