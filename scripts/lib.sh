# Shared helpers for Squadron's scripts. Sourced, not run.

# The one build directory, outside the clone, so CI runs and later sessions reuse the build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/squadron-target}"

# Debian packages needed to build the workspace: a C/C++ toolchain for RocksDB, libclang for
# its bindings, git for the tests' repositories.
SQUADRON_BUILD_PACKAGES=(build-essential pkg-config git libclang1-14 libclang-common-14-dev)

log() { printf '[squadron] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs the named Debian packages that are not installed yet.
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    log "cargo not found: install the Rust toolchain (rustup) first"
    exit 1
  fi
}
