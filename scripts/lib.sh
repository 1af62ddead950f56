# Shared helpers for Squadron's scripts. Sourced, not run.

# The one build directory, outside the clone, so CI runs and later sessions reuse the build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/squadron-target}"

# The features of the test build. Every cargo command on the shared build directory uses the
# same selection (`--workspace`) and these features, so the cache stays warm. The deliberate
# fault is off unless a node's environment switches it on (jepsen/README.md); release builds
# (scripts/dev) never carry it.
SQUADRON_TEST_FEATURES="squadron/jepsen-faults squadron/libvirt"

# Debian packages needed to build the workspace: a C/C++ toolchain for RocksDB, libclang for
# its bindings, git for the tests' repositories.
SQUADRON_BUILD_PACKAGES=(build-essential pkg-config git libclang1-14 libclang-common-14-dev)

# Each line says how long the script has run ($SECONDS), so long steps show their time.
log() { printf '[squadron %4ss] %s\n' "$SECONDS" "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs the named Debian packages that are not installed yet; `--no-recommends` first
# leaves their recommendations out.
ensure_packages() {
  local missing=() options=() p
  if [ "${1:-}" = "--no-recommends" ]; then
    options=(--no-install-recommends)
    shift
  fi
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${options[@]}" \
      "${missing[@]}" >/dev/null
  fi
}

# What the local worker's process runtime needs at run time: bubblewrap for the boundary,
# util-linux's setpriv to empty the capability bounding set (and nsenter), procps for kill,
# iproute2 and nftables for `outbound` sandboxes' own networks and their egress filter,
# e2fsprogs for the task directories' disk quotas (mkfs.ext4; util-linux's mount loop-mounts).
SQUADRON_RUN_PACKAGES=(bubblewrap util-linux procps git iproute2 nftables e2fsprogs)

# Debian packages the tests need beyond the build and run set: the Docker engine and busybox
# (the agent image) for the Docker runtime; iproute2, iptables, curl and libfaketime for the
# chaos suite (network namespaces, partitions, its reachability probe, clock faults); etcd for
# the comparison benchmark; python3 for the Unix-socket and network probes inside sandboxes;
# chromium, chromium-driver and libnss3-tools (certutil) for the dashboard's test in a real
# browser (tests/dashboard_browser.rs: WebDriver, the test CA in the browser's NSS database);
# systemd for `systemd-analyze verify` of deploy/systemd (tests/deploy_files.rs), and
# docker-compose for deploy/compose (tests/deploy_compose.rs).
SQUADRON_TEST_PACKAGES=("${SQUADRON_RUN_PACKAGES[@]}" python3 docker.io busybox-static iproute2 iptables curl libfaketime etcd-server chromium chromium-driver libnss3-tools systemd docker-compose debootstrap)

# What the KVM runtime, its image and their tests need (scripts/build-vm-image,
# tests/vm_image.rs, the kvm scenarios): QEMU to boot the guest under software emulation,
# cpio to pack its initramfs, libvirt's daemon and its C library (the `libvirt` feature
# builds against libvirt-dev), and what the Rust virtiofsd builds against (libseccomp,
# libcap-ng; QEMU 7's own C daemon cannot serve read-only shares). Installed with
# --no-recommends: QEMU's would bring a desktop's worth of packages. openssh-client is the
# operator's side of a kept guest's break-glass SSH line, which the kvm scenarios run.
SQUADRON_VM_PACKAGES=(qemu-system-x86 cpio busybox-static libvirt-daemon-system libvirt-clients libvirt-dev libseccomp-dev libcap-ng-dev openssh-client)
# The virtiofs daemon the KVM runtime uses, built from crates.io once per machine.
SQUADRON_VIRTIOFSD_VERSION=1.14.0
SQUADRON_TOOLS_DIR="${HOME}/.cache/squadron-tools"

# Installs the pinned provider CLIs (providers/versions.env) with npm where the installed
# ones differ: Claude Code as `claude`, Codex as `codex`, on the PATH the process runtime's
# sandboxes see (npm's global prefix under /usr). Both packages ship native binaries.
ensure_provider_clis() {
  local here
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  # shellcheck source=../providers/versions.env
  source "$here/providers/versions.env"
  ensure_npm
  local cli package version
  for cli in claude codex; do
    case "$cli" in
      claude) package="$CLAUDE_CODE_PACKAGE" version="$CLAUDE_CODE_VERSION" ;;
      codex) package="$CODEX_PACKAGE" version="$CODEX_VERSION" ;;
    esac
    if "$cli" --version 2>/dev/null | grep -qF "$version"; then continue; fi
    log "installing $package@$version from npm"
    as_root npm install --global --no-fund --no-audit --loglevel=error "$package@$version" >/dev/null
    "$cli" --version 2>/dev/null | grep -qF "$version" || {
      log "$cli --version does not report $version after the install"
      return 1
    }
  done
}

# Starts dockerd in the background unless an engine already answers; waits until it does.
ensure_dockerd() {
  if docker info >/dev/null 2>&1; then return 0; fi
  log "starting dockerd (log: /tmp/squadron-dockerd.log)"
  as_root sh -c 'nohup dockerd >/tmp/squadron-dockerd.log 2>&1 &'
  local i
  for i in $(seq 1 120); do
    if docker info >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  log "dockerd did not answer within 60 s; its log:"
  tail -n 40 /tmp/squadron-dockerd.log >&2 || true
  return 1
}

# Builds the Rust virtiofsd into $SQUADRON_TOOLS_DIR unless it is there (the KVM runtime finds
# it at ~/.cache/squadron-tools/bin/virtiofsd). Its own build directory, removed after.
ensure_virtiofsd() {
  local bin="$SQUADRON_TOOLS_DIR/bin/virtiofsd"
  if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$SQUADRON_VIRTIOFSD_VERSION"; then
    return 0
  fi
  log "building virtiofsd $SQUADRON_VIRTIOFSD_VERSION from crates.io (a few minutes, once)"
  local build
  build="$(mktemp -d /tmp/squadron-virtiofsd.XXXXXX)"
  CARGO_TARGET_DIR="$build" cargo install --quiet --locked virtiofsd \
    --version "$SQUADRON_VIRTIOFSD_VERSION" --root "$SQUADRON_TOOLS_DIR"
  rm -rf "$build"
}

# Starts libvirt's daemons in the background unless libvirt answers; waits until it does.
ensure_libvirtd() {
  if virsh -c qemu:///system uri >/dev/null 2>&1; then return 0; fi
  log "starting virtlogd and libvirtd (log: /var/log/libvirt/libvirtd.log)"
  as_root mkdir -p /var/log/libvirt /var/lib/libvirt/qemu /var/cache/libvirt
  pgrep -x virtlogd >/dev/null || as_root virtlogd -d
  pgrep -x libvirtd >/dev/null || as_root libvirtd -d
  local i
  for i in $(seq 1 60); do
    if virsh -c qemu:///system uri >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  log "libvirtd did not answer within 30 s; its log:"
  tail -n 40 /var/log/libvirt/libvirtd.log >&2 || true
  return 1
}

# npm: the build installs the dashboard's front-end packages with it (crates/squadron-server/
# build.rs, `npm ci` of the pinned lock file), and the provider CLIs come from it. Debian's,
# unless an npm is on PATH already.
ensure_npm() {
  command -v npm >/dev/null 2>&1 || ensure_packages npm
}

ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    log "cargo not found: install the Rust toolchain (rustup) first"
    exit 1
  fi
}

# kubernetes-validate (PyPI; it carries the Kubernetes JSON schemas, so it validates offline)
# for tests/deploy_files.rs, in a venv of its own under the tools directory, once per machine.
SQUADRON_KUBERNETES_VALIDATE_VERSION=1.37.0
ensure_kubernetes_validate() {
  local venv="$SQUADRON_TOOLS_DIR/k8s-venv"
  if "$venv/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$SQUADRON_KUBERNETES_VALIDATE_VERSION"; then
    return
  fi
  log "installing kubernetes-validate $SQUADRON_KUBERNETES_VALIDATE_VERSION into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "kubernetes-validate==$SQUADRON_KUBERNETES_VALIDATE_VERSION"
}

