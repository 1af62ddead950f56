//! The KVM runtime: one libvirt domain per task attempt, the seed's primary boundary ("KVM
//! hardware virtualization protects the host"). Built with the `libvirt` feature.
//!
//! # The guest
//!
//! The base image (`scripts/build-vm-image`: a Debian cloud kernel and a busybox initramfs
//! carrying this host's C runtime) boots directly; its one disk is the attempt's scratch disk
//! (`scratch.img`, a sparse file of the sandbox's `disk`, its `/tmp`). `vm-init`, its PID 1,
//! mounts the task's directories as virtiofs shares, runs the agent's start script as the
//! sandbox user (uid 65534), writes its kernel's out-of-memory kills to `agent/memory` and the
//! agent's exit code to `agent/exit-code` and powers the
//! guest off, or keeps it up when the manifest preserves failures: a console shell, and SSH
//! for the guest's own break-glass key (`break_glass`).
//!
//! | host                              | guest                 | mode |
//! |-----------------------------------|-----------------------|------|
//! | `inbox/`                          | `/mnt/inbox`          | rw   |
//! | `outbox/`                         | `/mnt/outbox`         | rw   |
//! | `run/`                            | `/mnt/run`            | ro   |
//! | global dir                        | `/mnt/global`         | ro   |
//! | `agent/`                          | `/run/squadron/agent` | rw   |
//! | the worker's `squadron` binary    | `/usr/local/bin`      | ro   |
//! | the image's provider CLIs         | `/usr/bin`            | ro   |
//! | the credential session            | its sandbox path      | ro   |
//!
//! A read-only share is served by a virtiofs daemon started with `--readonly`, so no guest,
//! root in it included, writes there. The guest's memory is a memfd shared with the daemons;
//! its size and CPUs come from the manifest's limits.
//!
//! # The agent's channel
//!
//! The guest has no route to the worker or the control plane: `isolated` has no NIC at all,
//! and `outbound`'s one NIC is filtered on the worker's tap as a process sandbox's network is
//! (`guest_network`: the host's own addresses and every control-plane and worker port
//! dropped). The agent reaches its relay over a virtio-serial port whose
//! host end is a Unix socket libvirt places under its own channel directory; the port carries
//! yamux streams (`task::agent_relay`, `squadron-agent`'s `channel_bridge`). A second port,
//! the control port, carries the worker's `stop` for a graceful cancel; a third, only in a
//! guest kept on failure, carries break-glass SSH sessions.
//!
//! # Files of this runtime
//!
//! QEMU runs as libvirt's unprivileged user, which cannot reach the worker's data directory:
//! the kernel, the initramfs, the read-only daemon's wrapper and each domain's console log
//! live under `state_dir` (every ancestor of it must be searchable by others), per worker
//! data directory. Destroying a domain undefines it with its NVRAM, managed save and
//! snapshot metadata and removes its files.

mod break_glass;
mod domain_xml;
mod guest_network;
mod hypervisor;

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use squadron_api::agent_channel::{BREAK_GLASS_PORT_NAME, CONTROL_PORT_NAME, PORT_NAME, STOP_LINE};
use squadron_core::ids::{TaskId, WorkerId};
use squadron_core::manifest::RuntimeKind;
use tokio::io::AsyncWriteExt;

use self::break_glass::BreakGlassKey;
use self::domain_xml::{
    channel_socket, memory_mib, path_text, AttemptMark, DomainSpec, DomainType, GuestNic, Share,
    PRESERVE_FLAG,
};
use self::guest_network::{GuestNetworks, NETWORK_RECORD_NAME};
use self::hypervisor::{Found, Hypervisor, Lifecycle};
use crate::error::WorkerError;
use crate::runtime::agent_libraries::{self, AGENT_LIBRARY_DIR};
use crate::runtime::gateway;
use crate::runtime::sandbox_user::SandboxUser;
use crate::runtime::{sandbox_name, LaunchSpec, ReapReport, RunStatus, Runtime, SandboxHandle};
use crate::support::now_ms;
use crate::task::sandbox_agent::{self, AGENT_DIR_MOUNT};
use crate::task::task_dir::{TaskDir, GLOBAL_MOUNT, INBOX_MOUNT, OUTBOX_MOUNT, RUN_MOUNT};
use squadron_isolation::beneath::Beneath;

const RUNTIME_NAME: &str = "kvm";
/// The guest's memory when the manifest sets none, and the least a guest is given.
const MEMORY_MIB_DEFAULT: u64 = 1024;
const MEMORY_MIB_MIN: u64 = 256;
const MEMORY_MIB_MAX: u64 = 256 * 1024;
const CPUS_MAX: u32 = 64;
/// The file `vm-init` writes the agent's exit code to, in the agent's directory.
pub(crate) const EXIT_CODE_NAME: &str = "exit-code";
/// The guest kernel's out-of-memory kills, written by `vm-init` beside the exit code
/// (`oom_kill N`): a guest's memory is no cgroup of the host's, so only the guest can tell.
const MEMORY_REPORT_NAME: &str = "memory";
/// The guest's console, in its domain's directory and kept in the task directory.
const CONSOLE_LOG_NAME: &str = "vm-console.log";
/// The guest's scratch disk, in its domain's directory (removed with it).
const SCRATCH_NAME: &str = "scratch.img";
/// The scratch disk's size bounds: the sandbox's `disk`, within these.
const SCRATCH_BYTES_MIN: u64 = 64 << 20;
const SCRATCH_BYTES_MAX: u64 = 1 << 40;

/// Where the guest finds the worker's binary (the share of `bin/`).
const GUEST_BIN_DIR: &str = "/usr/local/bin";
/// The image's pinned provider CLIs (`providers/` beside the kernel, from
/// `scripts/build-vm-image`), and where the guest finds them: on the sandbox's fixed `PATH`.
const PROVIDERS_DIR_NAME: &str = "providers";
const GUEST_PROVIDERS_DIR: &str = "/usr/bin";
/// How long the worker waits for the control port to take its `stop`.
const CONTROL_WRITE_MS_MAX: u64 = 2_000;
const POLL_MS: u64 = 100;
/// How long `destroy` waits for libvirt to forget the domain.
const REAP_WAIT_MS_MAX: u64 = 30_000;
/// How long `destroy` lets a guest whose agent exited power itself off, so that its
/// console holds the init's last lines (the exit code file is written before them).
const GUEST_POWEROFF_WAIT_MS_MAX: u64 = 5_000;
/// How long the probe's boot of the image may take under hardware virtualisation (a guest
/// that boots at all says it is ready within a few seconds).
const KVM_PROBE_BOOT_MS_MAX: u64 = 15_000;
/// The file naming the data directory a worker's runtime files belong to.
const OWNER_NAME: &str = "data-dir";
/// The most sibling directories one start looks at for a gone data directory.
const WORKER_DIRS_SWEPT_MAX: usize = 10_000;
/// The longest data directory path read back.
const DATA_DIR_BYTES_MAX: u64 = 4096;
/// The most domain directories `connect` checks for networks whose domain is gone.
const DOMAIN_DIRS_CHECKED_MAX: usize = 10_000;
/// The probe's answer, kept in `state_dir` for the image it was made with.
const PROBE_CACHE_NAME: &str = "kvm-probe";

/// Which domain type to use: `auto` boots the image once under `kvm` and falls back to
/// `qemu` (software emulation) when that does not work here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DomainTypeChoice {
    #[default]
    Auto,
    Kvm,
    Qemu,
}

impl std::str::FromStr for DomainTypeChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "kvm" => Ok(Self::Kvm),
            "qemu" => Ok(Self::Qemu),
            other => Err(format!("{other:?} is not auto, kvm or qemu")),
        }
    }
}

/// How the worker reaches libvirt and what it boots.
#[derive(Debug, Clone)]
pub(crate) struct KvmConfig {
    pub(crate) uri: String,
    /// Where `scripts/build-vm-image` put `vmlinuz`, `initrd.img` and `image.recipe`.
    pub(crate) image_dir: PathBuf,
    pub(crate) state_dir: PathBuf,
    /// The virtiofs daemon; unset, it is looked for (`find_virtiofsd`).
    pub(crate) virtiofsd: Option<PathBuf>,
    pub(crate) worker: WorkerId,
    /// The worker's data directory: the runtime's files are kept apart per data directory.
    pub(crate) data_dir: PathBuf,
    /// The `squadron` binary the guest runs `squadron agent` from (required).
    pub(crate) agent_binary: Option<PathBuf>,
    pub(crate) global_dir: Option<PathBuf>,
    pub(crate) sandbox_user: SandboxUser,
    pub(crate) domain_type: DomainTypeChoice,
    /// Test hook: the guest waits this long before the agent starts.
    pub(crate) test_boot_delay_ms: Option<u64>,
    /// The `outbound` guests' tap networks (`guest_network`): the worker's egress policy,
    /// under a tag of this runtime's own.
    pub(crate) network: squadron_isolation::NetworkConfig,
    /// What `gateway` guests may reach through the worker's proxy (`--gateway-allow`).
    pub(crate) gateway: Option<std::sync::Arc<crate::runtime::gateway::Destinations>>,
}

/// The files of this worker's runtime under `state_dir`.
#[derive(Debug, Clone)]
struct RuntimeFiles {
    root: PathBuf,
}

impl RuntimeFiles {
    fn kernel(&self) -> PathBuf {
        self.root.join("image/vmlinuz")
    }
    fn initrd(&self) -> PathBuf {
        self.root.join("image/initrd.img")
    }
    /// The link to the worker's own binary: the guest's agent, the break-glass line's proxy.
    fn squadron_binary(&self) -> PathBuf {
        self.bin_dir().join("squadron")
    }

    fn bin_dir(&self) -> PathBuf {
        self.root.join("bin")
    }
    fn lib_dir(&self) -> PathBuf {
        self.root.join("lib")
    }
    fn virtiofsd_read_only(&self) -> PathBuf {
        self.root.join("virtiofsd-readonly")
    }
    fn domain_dir(&self, name: &str) -> PathBuf {
        self.root.join("domains").join(name)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct KvmRuntime {
    config: KvmConfig,
    hypervisor: Hypervisor,
    files: RuntimeFiles,
    virtiofsd: PathBuf,
    domain_type: DomainType,
    networks: GuestNetworks,
    /// The image's provider CLIs as resolved at start, beside the kernel and initramfs copied
    /// then: a rebuild of the image links a new directory in, which a restart takes up.
    providers: Option<PathBuf>,
}

impl KvmRuntime {
    /// Checks everything a task will need (libvirt, the image, virtiofsd, the agent binary,
    /// a state directory QEMU can reach), lays out the runtime's files and picks the domain
    /// type, so a worker that cannot run VMs says why at start and not per task.
    pub(crate) async fn connect(mut config: KvmConfig) -> Result<Self, WorkerError> {
        // Recorded as the owner of the runtime's files, which another worker's sweep reads.
        config.data_dir = std::path::absolute(&config.data_dir)
            .map_err(|e| WorkerError::io("make absolute", &config.data_dir, e))?;
        let binary = config.agent_binary.clone().ok_or_else(|| {
            WorkerError::runtime(
                RUNTIME_NAME,
                "the guest runs `squadron agent` from the worker's binary, and none is configured",
            )
        })?;
        let virtiofsd = match &config.virtiofsd {
            Some(p) if serves_read_only(p) => p.clone(),
            Some(p) => {
                return Err(invalid(
                    "virtiofsd",
                    format!(
                        "{} does not take --readonly (QEMU's old C daemon?); read-only shares \
                         need the Rust virtiofsd (cargo install virtiofsd)",
                        p.display()
                    ),
                ))
            }
            None => find_virtiofsd().ok_or_else(|| {
                WorkerError::runtime(
                    RUNTIME_NAME,
                    "no virtiofsd that serves read-only shares found (in \
                     ~/.cache/squadron-tools/bin, /usr/libexec or on PATH): install the Rust \
                     virtiofsd (cargo install virtiofsd; scripts/test does)",
                )
            })?,
        };
        let hypervisor = Hypervisor::new(&config.uri);
        let h = hypervisor.clone();
        let capabilities = blocking(move || h.capabilities()).await?;
        let files = RuntimeFiles {
            root: config.state_dir.join("workers").join(format!(
                "{:016x}",
                crate::runtime::fnv1a(config.data_dir.as_os_str().as_encoded_bytes())
            )),
        };
        let (c, f, v) = (config.clone(), files.clone(), virtiofsd.clone());
        blocking(move || lay_out(&c, &f, &binary, &v)).await?;
        let (network, gateway) = (config.network.clone(), config.gateway.clone());
        let domains = files.root.join("domains");
        let networks = blocking(move || Ok(GuestNetworks::new(network, gateway, &domains))).await?;
        let providers = std::fs::canonicalize(config.image_dir.join(PROVIDERS_DIR_NAME))
            .ok()
            .filter(|p| p.is_dir());
        if providers.is_none() {
            tracing::warn!(image_dir = %config.image_dir.display(), "the VM image has no provider CLIs: Claude Code and Codex tasks fail in guests until scripts/build-vm-image rebuilds it");
        }
        let mut runtime = KvmRuntime {
            config,
            hypervisor,
            files,
            virtiofsd,
            domain_type: DomainType::Qemu,
            networks,
            providers,
        };
        runtime.domain_type = runtime.choose_domain_type(&capabilities).await;
        runtime.remove_orphan_domain_files().await;
        tracing::info!(uri = %runtime.config.uri, domain_type = runtime.domain_type.as_str(), "connected to libvirt");
        Ok(runtime)
    }

    /// Removes the files of domains libvirt no longer knows — the network first, then the
    /// directory with its scratch disk (a kill between undefine and removal, or between the
    /// network and the definition; an operator's `virsh undefine` of a preserved guest).
    async fn remove_orphan_domain_files(&self) {
        let Ok(entries) = std::fs::read_dir(self.files.root.join("domains")) else {
            return;
        };
        for entry in entries.flatten().take(DOMAIN_DIRS_CHECKED_MAX) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !matches!(self.lookup(&name).await, Ok(None)) {
                continue;
            }
            let removed = self
                .networks
                .tear_down(&entry.path().join(NETWORK_RECORD_NAME))
                .and_then(|()| {
                    std::fs::remove_dir_all(entry.path())
                        .map_err(|e| WorkerError::io("remove", entry.path(), e))
                });
            match removed {
                Ok(()) => {
                    tracing::info!(domain = %name, "removed the files of a domain that is gone")
                }
                Err(e) => {
                    tracing::warn!(domain = %name, error = %e, "cannot remove the files of a domain that is gone")
                }
            }
        }
    }

    pub(crate) fn domain_type(&self) -> DomainType {
        self.domain_type
    }

    /// `kvm` when asked for, or under `auto` when `/dev/kvm` opens, libvirt offers it and
    /// the image boots with it; else `qemu`.
    async fn choose_domain_type(&self, capabilities: &str) -> DomainType {
        let offered = capabilities.contains("<domain type='kvm'");
        match self.config.domain_type {
            DomainTypeChoice::Qemu => DomainType::Qemu,
            DomainTypeChoice::Kvm => DomainType::Kvm,
            DomainTypeChoice::Auto => {
                let opens = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/kvm")
                    .is_ok();
                if !opens || !offered {
                    return DomainType::Qemu;
                }
                let cache = self.config.state_dir.join(PROBE_CACHE_NAME);
                let key = image_key(&self.files.kernel(), &self.files.initrd());
                if let Some(known) = read_probe(&cache, &key) {
                    return known;
                }
                let chosen = match self.boots_under_kvm().await {
                    Ok(true) => DomainType::Kvm,
                    Ok(false) => {
                        tracing::info!("/dev/kvm does not boot the image here; using software emulation (qemu)");
                        DomainType::Qemu
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the KVM boot probe failed; using software emulation (qemu)");
                        return DomainType::Qemu;
                    }
                };
                let _ = crate::support::write_atomic(
                    &cache,
                    format!("{key} {}\n", chosen.as_str()).as_bytes(),
                );
                chosen
            }
        }
    }

    /// Boots the image once under `kvm` with `squadron.selftest` and looks for its ready line
    /// on the console.
    async fn boots_under_kvm(&self) -> Result<bool, WorkerError> {
        let name = format!("squadron-probe-{:08x}", std::process::id());
        let dir = self.files.domain_dir(&name);
        create_dir(&dir, 0o755)?;
        let log = dir.join(CONSOLE_LOG_NAME);
        let xml = format!(
            "<domain type='kvm'><name>{name}</name><memory unit='MiB'>256</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64' machine='pc'>hvm</type><kernel>{k}</kernel><initrd>{i}</initrd>\
             <cmdline>console=ttyS0 squadron.selftest</cmdline></os><features><acpi/></features>\
             <on_poweroff>destroy</on_poweroff><devices><serial type='pty'><log file='{l}' append='off'/>\
             <target port='0'/></serial><memballoon model='none'/></devices></domain>",
            k = path_text(&self.files.kernel(), "kvm.kernel")?,
            i = path_text(&self.files.initrd(), "kvm.initrd")?,
            l = path_text(&log, "kvm.console_log")?,
        );
        self.on_domain(&name, move |h, n| {
            h.define(&xml)?;
            h.start(n)
        })
        .await?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(KVM_PROBE_BOOT_MS_MAX);
        let mut booted = false;
        while tokio::time::Instant::now() < deadline {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("squadron-vm: ready") {
                booted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.on_domain(&name, Hypervisor::remove).await?;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(booted)
    }

    /// `call` on the blocking pool with this runtime's hypervisor and domain `name`.
    async fn on_domain<T: Send + 'static>(
        &self,
        name: &str,
        call: impl FnOnce(&Hypervisor, &str) -> Result<T, WorkerError> + Send + 'static,
    ) -> Result<T, WorkerError> {
        let (h, n) = (self.hypervisor.clone(), name.to_string());
        blocking(move || call(&h, &n)).await
    }

    async fn lookup(&self, name: &str) -> Result<Option<Found>, WorkerError> {
        self.on_domain(name, Hypervisor::lookup).await
    }

    /// The shares of one attempt (see the module docs).
    fn shares(&self, spec: &LaunchSpec) -> Vec<Share> {
        let share = |tag, host_dir: PathBuf, guest: &str, read_only| Share {
            tag,
            host_dir,
            guest_path: guest.to_string(),
            read_only,
        };
        let mut shares = vec![
            share("inbox", spec.dir.inbox(), INBOX_MOUNT, false),
            share("outbox", spec.dir.outbox(), OUTBOX_MOUNT, false),
            share("run", spec.dir.run(), RUN_MOUNT, true),
            share("agent", spec.dir.agent(), AGENT_DIR_MOUNT, false),
            share("bin", self.files.bin_dir(), GUEST_BIN_DIR, true),
            share("lib", self.files.lib_dir(), AGENT_LIBRARY_DIR, true),
        ];
        if let Some(providers) = &self.providers {
            shares.push(share(
                "providers",
                providers.clone(),
                GUEST_PROVIDERS_DIR,
                true,
            ));
        }
        if let Some(global) = spec.global_dir.as_ref().or(self.config.global_dir.as_ref()) {
            shares.push(share("global", global.clone(), GLOBAL_MOUNT, true));
        }
        if let Some(session) = &spec.credentials {
            shares.push(share(
                "credentials",
                session.host_dir().to_path_buf(),
                session.sandbox_dir(),
                true,
            ));
        }
        shares
    }

    fn domain_spec(
        &self,
        spec: &LaunchSpec,
        name: &str,
        nic: Option<GuestNic>,
        break_glass_key: Option<String>,
    ) -> Result<DomainSpec, WorkerError> {
        let memory_mib = spec
            .limits
            .memory_bytes
            .map(|b| b.div_ceil(1024 * 1024))
            .unwrap_or(MEMORY_MIB_DEFAULT)
            .clamp(MEMORY_MIB_MIN, MEMORY_MIB_MAX);
        let cpus = spec.limits.cpus.unwrap_or(1).clamp(1, CPUS_MAX);
        Ok(DomainSpec {
            name: name.to_string(),
            domain_type: self.domain_type,
            mark: mark_of(&self.config.worker, &spec.dir, spec.attempt),
            memory_mib,
            cpus,
            kernel: self.files.kernel(),
            initrd: self.files.initrd(),
            console_log: self.files.domain_dir(name).join(CONSOLE_LOG_NAME),
            virtiofsd: self.virtiofsd.clone(),
            virtiofsd_read_only: self.files.virtiofsd_read_only(),
            shares: self.shares(spec),
            keep_after_exit: spec.keep_after_exit,
            break_glass_key,
            test_boot_delay_ms: self.config.test_boot_delay_ms,
            nic,
            scratch: spec
                .limits
                .disk_bytes
                .map(|_| self.files.domain_dir(name).join(SCRATCH_NAME)),
        })
    }

    /// Writes the agent's start script (with the proxy variables of a `gateway` guest, whose
    /// proxy is served from now on), makes the break-glass key of a guest kept on failure,
    /// and defines the domain.
    async fn define(
        &self,
        spec: &LaunchSpec,
        name: &str,
        agent_dir: &Path,
        nic: Option<GuestNic>,
    ) -> Result<(), WorkerError> {
        let mut launch = spec.clone();
        if let Some((proxy, guest)) = nic.as_ref().and_then(|n| Some((n.proxy?, n.address))) {
            gateway::proxy_env(proxy, &mut launch.env);
            self.networks
                .serve_gateway(name, proxy, guest, &spec.dir)
                .await?;
        }
        sandbox_agent::write_start_script(agent_dir, &launch, self.sandbox_owner(spec)?)?;
        let break_glass_key = if spec.keep_after_exit {
            Some(BreakGlassKey::of_domain(&self.files.domain_dir(name)).create()?)
        } else {
            None
        };
        let domain = self.domain_spec(spec, name, nic, break_glass_key)?;
        if let (Some(path), Some(bytes)) = (&domain.scratch, spec.limits.disk_bytes) {
            make_scratch(path, bytes.clamp(SCRATCH_BYTES_MIN, SCRATCH_BYTES_MAX))?;
        }
        let xml = domain.to_xml()?;
        self.on_domain(name, move |h, _| h.define(&xml)).await
    }

    /// The outbox and run directory become the sandbox user's, the inbox is shared with it,
    /// as for a hardened container of a root worker: the guest writes as uid 65534 through
    /// virtiofs, which keeps guest ids.
    fn hand_over(&self, spec: &LaunchSpec) -> Result<(), WorkerError> {
        let user = self.config.sandbox_user;
        user.hand_over(&spec.dir.outbox())?;
        user.hand_over(&spec.dir.run())?;
        user.share_work_tree(&spec.dir.inbox())
    }

    /// The attempt's exit code, once `vm-init` wrote it. The agent directory is a share the
    /// sandbox user writes, so the guest's code may put anything there first: a link to a
    /// host file (read through it, the file would land in the task's error), a FIFO (an open
    /// that never returns), garbage. None of that is an exit code: it is logged and read as
    /// "not yet", so the guest's own `mv` of the real code, its hang timeout or its
    /// destruction ends it, and a forged file never stops the domain from being destroyed.
    fn exit_code(dir: &Path) -> Result<Option<i32>, WorkerError> {
        let path = dir.join(EXIT_CODE_NAME);
        let text = match read_guest_small(dir, EXIT_CODE_NAME) {
            Ok(Some(t)) => t,
            Ok(None) => return Ok(None),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "not an exit code the guest's init wrote; ignored");
                return Ok(None);
            }
        };
        match text.trim().parse::<i32>() {
            Ok(code) => Ok(Some(code)),
            Err(_) => {
                tracing::warn!(path = %path.display(), "holds no exit code; ignored");
                Ok(None)
            }
        }
    }

    /// The agent directory of the attempt a domain belongs to, from its metadata.
    fn agent_dir_of(found: &Found, name: &str) -> Result<PathBuf, WorkerError> {
        let mark = found.mark.as_ref().ok_or_else(|| {
            WorkerError::runtime(
                RUNTIME_NAME,
                format!("domain {name} carries no Squadron metadata"),
            )
        })?;
        let task = TaskId::new(mark.task)
            .map_err(|e| WorkerError::runtime(RUNTIME_NAME, format!("domain {name}: {e}")))?;
        let root = PathBuf::from(&mark.dir);
        let data_dir = root.parent().and_then(Path::parent).ok_or_else(|| {
            WorkerError::runtime(RUNTIME_NAME, format!("domain {name}: bad dir {}", mark.dir))
        })?;
        let dir = TaskDir::new(data_dir, task);
        if dir.root() != root {
            return Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!("domain {name}: {} is not a task directory", mark.dir),
            ));
        }
        Ok(dir.agent())
    }

    /// Waits, up to `GUEST_POWEROFF_WAIT_MS_MAX`, for a running guest whose agent exited
    /// and that is not kept for break-glass to end; true when it did.
    async fn let_guest_power_off(&self, found: &Found, name: &str) -> Result<bool, WorkerError> {
        let ending = found.lifecycle == Lifecycle::Running
            && !found.xml.contains(PRESERVE_FLAG)
            && Self::exit_code(&Self::agent_dir_of(found, name)?)?.is_some();
        if !ending {
            return Ok(false);
        }
        let wait = Duration::from_millis(GUEST_POWEROFF_WAIT_MS_MAX);
        self.wait_while_running(name, wait, || Ok(false)).await
    }

    /// Polls until the domain no longer runs or `done` says so, up to `wait`; true when
    /// either came first.
    async fn wait_while_running(
        &self,
        name: &str,
        wait: Duration,
        done: impl Fn() -> Result<bool, WorkerError>,
    ) -> Result<bool, WorkerError> {
        let deadline = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < deadline {
            if done()? {
                return Ok(true);
            }
            match self.lookup(name).await? {
                Some(f) if f.lifecycle == Lifecycle::Running => {}
                _ => return Ok(true),
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        Ok(false)
    }

    async fn ask_to_stop(&self, found: &Found, name: &str) {
        let Some(socket) = channel_socket(&found.xml, CONTROL_PORT_NAME) else {
            tracing::warn!(
                domain = name,
                "no control port in the live XML; powering off"
            );
            return;
        };
        let write = async {
            let mut stream = tokio::net::UnixStream::connect(&socket).await?;
            stream
                .write_all(format!("{STOP_LINE}\n").as_bytes())
                .await?;
            stream.flush().await
        };
        match tokio::time::timeout(Duration::from_millis(CONTROL_WRITE_MS_MAX), write).await {
            Ok(Ok(())) => tracing::info!(domain = name, "asked the guest to stop its agent"),
            Ok(Err(e)) => {
                tracing::warn!(domain = name, error = %e, "the control port refused the stop")
            }
            Err(_) => tracing::warn!(
                domain = name,
                "the control port did not take the stop in time"
            ),
        }
    }
}

#[async_trait]
impl Runtime for KvmRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Kvm
    }

    fn runs_agent(&self) -> bool {
        true
    }

    fn agent_over_channel(&self) -> bool {
        true
    }

    /// Over the agent's channel, whatever the guest's network: its agent accepts on the guest's
    /// loopback and the relay hands each connection to the proxy (`AgentRelays::serve_egress`).
    fn serves_egress(&self) -> bool {
        true
    }

    async fn agent_channel(&self, handle: &SandboxHandle) -> Result<Option<PathBuf>, WorkerError> {
        let name = kvm_name(handle)?;
        Ok(self
            .lookup(name)
            .await?
            .filter(|f| f.lifecycle == Lifecycle::Running)
            .and_then(|f| channel_socket(&f.xml, PORT_NAME)))
    }

    fn sandbox_owner(&self, _spec: &LaunchSpec) -> Result<(u32, u32), WorkerError> {
        Ok(self.config.sandbox_user.pair())
    }

    /// Defines the domain (not started); the domain an earlier life defined for this attempt
    /// is returned instead.
    async fn provision(&self, spec: &LaunchSpec) -> Result<SandboxHandle, WorkerError> {
        check_launch(spec)?;
        self.networks.check(spec.network)?;
        if let Some(existing) = self.adopt(spec.task, spec.attempt, &spec.dir).await? {
            return Ok(existing);
        }
        self.hand_over(spec)?;
        let agent_dir = spec.dir.agent();
        for stale in [EXIT_CODE_NAME, MEMORY_REPORT_NAME] {
            match std::fs::remove_file(agent_dir.join(stale)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(WorkerError::io("remove a stale exit code", &agent_dir, e)),
            }
        }
        let name = sandbox_name(&spec.dir, spec.attempt);
        let domain_dir = self.files.domain_dir(&name);
        create_dir(&domain_dir, 0o755)?;
        let record = domain_dir.join(NETWORK_RECORD_NAME);
        // A tap an earlier life made for this attempt, before its domain was defined.
        self.networks.tear_down(&record)?;
        let nic = self.networks.prepare(spec.network, &name, &record)?;
        if let Err(e) = self.define(spec, &name, &agent_dir, nic).await {
            self.networks.stop_gateway(&name).await;
            if let Err(t) = self.networks.tear_down(&record) {
                tracing::warn!(domain = %name, error = %t, "cannot remove the guest's network");
            }
            return Err(e);
        }
        tracing::info!(domain = %name, domain_type = self.domain_type.as_str(), "provisioned domain");
        Ok(SandboxHandle {
            runtime: RuntimeKind::Kvm,
            id: name,
        })
    }

    /// Starts the domain only if it never ran: a guest that ran once is never booted again.
    async fn start(&self, handle: &SandboxHandle, spec: &LaunchSpec) -> Result<(), WorkerError> {
        let name = kvm_name(handle)?;
        let found = self.lookup(name).await?.ok_or_else(|| {
            WorkerError::runtime(RUNTIME_NAME, format!("domain {name} vanished before start"))
        })?;
        if found.mark != Some(mark_of(&self.config.worker, &spec.dir, spec.attempt)) {
            return Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!(
                    "domain {name} is not marked as task {} attempt {}",
                    spec.task, spec.attempt
                ),
            ));
        }
        if found.lifecycle != Lifecycle::NeverStarted {
            tracing::info!(domain = name, lifecycle = ?found.lifecycle, "domain already started; not starting it again");
            return Ok(());
        }
        self.on_domain(name, Hypervisor::start).await
    }

    async fn status(&self, handle: &SandboxHandle) -> Result<RunStatus, WorkerError> {
        let name = kvm_name(handle)?;
        let Some(found) = self.lookup(name).await? else {
            return Ok(RunStatus::Vanished);
        };
        if let Some(code) = Self::exit_code(&Self::agent_dir_of(&found, name)?)? {
            // The exit code is the guest's to write, and what follows (collection, the
            // volume's retirement) reads its shares: nothing in the guest may run by then. Its
            // init powers it off right after writing the code (a guest that does not within
            // `GUEST_POWEROFF_WAIT_MS_MAX` — out of memory, or lying — is powered off); a guest
            // kept for break-glass is paused instead, and resumed once the worker is done with
            // it (`preserved`).
            if found.lifecycle == Lifecycle::Running {
                if found.xml.contains(PRESERVE_FLAG) {
                    self.on_domain(name, Hypervisor::suspend).await?;
                } else if !self.let_guest_power_off(&found, name).await? {
                    self.on_domain(name, Hypervisor::power_off).await?;
                }
            }
            return Ok(RunStatus::Exited { code });
        }
        Ok(match found.lifecycle {
            Lifecycle::NeverStarted => RunStatus::Created,
            Lifecycle::Running => RunStatus::Running,
            Lifecycle::Stopped => RunStatus::Vanished,
        })
    }

    /// `stop` on the control port (the guest's init sends SIGTERM to the agent, which hands
    /// it to the provider), up to `grace` for the exit, then a hard power-off.
    async fn terminate(&self, handle: &SandboxHandle, grace: Duration) -> Result<(), WorkerError> {
        let name = kvm_name(handle)?;
        let Some(found) = self.lookup(name).await? else {
            return Ok(());
        };
        if found.lifecycle != Lifecycle::Running {
            return Ok(());
        }
        let agent_dir = Self::agent_dir_of(&found, name)?;
        if Self::exit_code(&agent_dir)?.is_some() {
            // The agent ended (or the guest says so): a guest kept for break-glass is paused
            // until the worker is done with its shares, any other powered off.
            if found.xml.contains(PRESERVE_FLAG) {
                return self.on_domain(name, Hypervisor::suspend).await;
            }
            return self.on_domain(name, Hypervisor::power_off).await;
        }
        let _held = self.ask_to_stop(&found, name).await;
        let exited = || Ok(Self::exit_code(&agent_dir)?.is_some());
        if self.wait_while_running(name, grace, exited).await? {
            return Ok(());
        }
        tracing::info!(
            domain = name,
            "the guest did not stop within the grace period; powering off"
        );
        self.on_domain(name, Hypervisor::power_off).await
    }

    /// Powers the domain off, undefines it with its NVRAM and removes its files; the report
    /// is written only once libvirt no longer knows the domain.
    async fn destroy(&self, handle: &SandboxHandle) -> Result<ReapReport, WorkerError> {
        let name = kvm_name(handle)?;
        let mut steps = Vec::new();
        let dir = self.files.domain_dir(name);
        match self.lookup(name).await? {
            None => steps.push("already undefined".to_string()),
            Some(found) => {
                steps.push(format!("was {:?}", found.lifecycle).to_lowercase());
                if self.let_guest_power_off(&found, name).await? {
                    steps.push("the guest powered itself off".to_string());
                }
                // The guest's console outlives the domain in the task directory (the worker's
                // side of it, not the outbox), for whoever reads why a boot failed.
                if let Some(mark) = &found.mark {
                    let kept = Path::new(&mark.dir).join(CONSOLE_LOG_NAME);
                    if std::fs::copy(dir.join(CONSOLE_LOG_NAME), &kept).is_ok() {
                        steps.push(format!("console kept at {}", kept.display()));
                    }
                }
                self.on_domain(name, Hypervisor::remove).await?;
                steps.push("powered off; undefined with its NVRAM".to_string());
            }
        }
        self.networks.stop_gateway(name).await;
        let record = dir.join(NETWORK_RECORD_NAME);
        if record.exists() {
            self.networks.tear_down(&record)?;
            steps.push("its network removed".to_string());
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => steps.push("its files removed".to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(WorkerError::io("remove the domain's files", &dir, e)),
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(REAP_WAIT_MS_MAX);
        while self.lookup(name).await?.is_some() {
            if tokio::time::Instant::now() >= deadline {
                return Err(WorkerError::runtime(
                    RUNTIME_NAME,
                    format!("domain {name} is still defined {REAP_WAIT_MS_MAX} ms after undefine"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        steps.push("libvirt reports no such domain".to_string());
        Ok(ReapReport {
            sandbox: format!("kvm:{name}"),
            populated: false,
            observed_at_ms: now_ms(),
            detail: steps.join("; "),
        })
    }

    /// Finds the attempt's domain by its name and checks its metadata.
    async fn adopt(
        &self,
        task: TaskId,
        attempt: u32,
        dir: &TaskDir,
    ) -> Result<Option<SandboxHandle>, WorkerError> {
        let name = sandbox_name(dir, attempt);
        let Some(found) = self.lookup(&name).await? else {
            return Ok(None);
        };
        let expected = mark_of(&self.config.worker, dir, attempt);
        let ours = found.mark.as_ref().is_some_and(|m| {
            m.task == expected.task && m.attempt == attempt && m.dir == expected.dir
        });
        if !ours {
            return Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!(
                    "a domain named {name} exists but is not marked as task {task} attempt \
                     {attempt}; remove it by hand (virsh undefine {name})"
                ),
            ));
        }
        // A guest defined but not started boots later and needs its proxy then too. A proxy
        // that cannot be served again fails the guest's requests, not the adoption, so the
        // attempt can still be stopped and destroyed.
        if found.lifecycle != Lifecycle::Stopped {
            let record = self.files.domain_dir(&name).join(NETWORK_RECORD_NAME);
            if let Err(e) = self.networks.serve_adopted(&name, &record, dir).await {
                tracing::warn!(domain = %name, error = %e, "cannot serve an adopted guest's gateway proxy again");
            }
        }
        tracing::info!(domain = %name, %task, attempt, "adopted domain");
        Ok(Some(SandboxHandle {
            runtime: RuntimeKind::Kvm,
            id: name,
        }))
    }

    /// This worker's domains: each has its directory from definition to removal, and a
    /// directory libvirt no longer knows is removed only at the runtime's next start, so both
    /// count.
    async fn sandboxes(&self) -> Result<Vec<String>, WorkerError> {
        let dir = self.files.root.join("domains");
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(WorkerError::io("list domains in", dir, e)),
        };
        let mut names: Vec<String> = entries
            .flatten()
            .take(crate::runtime::SANDBOXES_LISTED_MAX)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names)
    }

    /// The guest kernel's own account, which `vm-init` leaves beside the exit code: a guest
    /// whose memory ran out killed processes itself, and the host saw only the exit code.
    async fn limits_hit(&self, handle: &SandboxHandle) -> Option<String> {
        let name = kvm_name(handle).ok()?;
        let found = self.lookup(name).await.ok()??;
        let agent_dir = Self::agent_dir_of(&found, name).ok()?;
        let kills = oom_kills(&read_guest_small(&agent_dir, MEMORY_REPORT_NAME).ok()??)?;
        let memory = memory_mib(&found.xml)
            .map(|m| format!(" of {m} MiB"))
            .unwrap_or_default();
        Some(format!(
            "the guest's memory{memory} was used up: its kernel killed {kills} process(es) out \
             of memory"
        ))
    }

    /// A guest kept for break-glass was paused while the worker read its shares: it runs
    /// again, for its console.
    async fn preserved(&self, handle: &SandboxHandle) -> Result<(), WorkerError> {
        let name = kvm_name(handle)?;
        self.on_domain(name, Hypervisor::resume).await
    }

    /// SSH with the guest's own key through its break-glass port where it has one (a guest
    /// defined before break-glass SSH existed has not), else its console.
    async fn break_glass(&self, handle: &SandboxHandle) -> String {
        let name = &handle.id;
        let uri = self.hypervisor.uri();
        let removal = format!(
            "remove it when done: virsh -c {uri} destroy {name}; virsh -c {uri} undefine \
             --nvram {name} (the worker removes the guest's key and network at its next start)"
        );
        let console = format!(
            "virsh -c {uri} console {name} (a root shell on its console; its console log is {log})",
            log = self.files.domain_dir(name).join(CONSOLE_LOG_NAME).display(),
        );
        let key = BreakGlassKey::of_domain(&self.files.domain_dir(name));
        let socket = match self.lookup(name).await {
            Ok(Some(found)) => channel_socket(&found.xml, BREAK_GLASS_PORT_NAME),
            _ => None,
        };
        let squadron = self.files.squadron_binary();
        let ssh = socket
            .filter(|_| key.exists())
            .and_then(|socket| key.ssh_command(name, &socket, &squadron));
        match ssh {
            Some(ssh) => format!(
                "Direct SSH (dev/break-glass, bypasses the gateway's audit): {ssh} — or {console}; \
                 {removal}"
            ),
            None => format!(
                "Direct access (dev/break-glass, bypasses the gateway's audit): {console}; {removal}"
            ),
        }
    }
}

/// A sparse file of `bytes`: the host's disk is used only as the guest writes, up to `bytes`.
/// libvirt hands it to QEMU's user at start.
fn make_scratch(path: &Path, bytes: u64) -> Result<(), WorkerError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| WorkerError::io("create the scratch disk", path, e))?;
    file.set_len(bytes)
        .map_err(|e| WorkerError::io("size the scratch disk", path, e))
}

fn mark_of(worker: &WorkerId, dir: &TaskDir, attempt: u32) -> AttemptMark {
    AttemptMark {
        task: dir.task().get(),
        attempt,
        worker: worker.as_str().to_string(),
        dir: dir.root().to_string_lossy().into_owned(),
    }
}

fn check_launch(spec: &LaunchSpec) -> Result<(), WorkerError> {
    if spec.full_control {
        return Err(invalid(
            "full_control",
            "is a Docker mode; a VM's agent runs as the sandbox user".to_string(),
        ));
    }
    if spec.task != spec.dir.task() {
        return Err(invalid(
            "launch.task",
            "does not match the task directory".to_string(),
        ));
    }
    if spec.argv.is_empty() {
        return Err(invalid("launch.argv", "must name a program".to_string()));
    }
    if !spec.workdir.starts_with('/') {
        return Err(invalid(
            "launch.workdir",
            format!(
                "must be an absolute path inside the sandbox, got {:?}",
                spec.workdir
            ),
        ));
    }
    Ok(())
}

/// The runtime's own files: the image copied where QEMU's user reads it, the worker's binary
/// linked into the directory the guest mounts, the read-only daemon's wrapper.
fn lay_out(
    config: &KvmConfig,
    files: &RuntimeFiles,
    binary: &Path,
    virtiofsd: &Path,
) -> Result<(), WorkerError> {
    check_reachable(&config.state_dir)?;
    create_dir(&files.root, 0o755)?;
    let owner = files.root.join(OWNER_NAME);
    crate::support::write_atomic(&owner, config.data_dir.as_os_str().as_encoded_bytes())?;
    sweep_gone_workers(&files.root);
    for (name, dest) in [("vmlinuz", files.kernel()), ("initrd.img", files.initrd())] {
        let source = config.image_dir.join(name);
        if !source.is_file() {
            return Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!(
                    "no VM image at {} (build it with scripts/build-vm-image)",
                    source.display()
                ),
            ));
        }
        agent_libraries::replace_with_copy(&source, &dest)?;
    }
    create_dir(&files.bin_dir(), 0o755)?;
    let linked = files.squadron_binary();
    replace_with_link(binary, &linked)?;
    agent_libraries::prepare(binary, &files.lib_dir())?;
    let wrapper = format!(
        "#!/bin/sh\n# Written by the Squadron worker: a virtiofs share the guest cannot write.\nexec {} --readonly \"$@\"\n",
        shlex::try_quote(&virtiofsd.to_string_lossy())
            .map_err(|e| invalid("kvm.virtiofsd", e.to_string()))?
    );
    crate::support::write_atomic(&files.virtiofsd_read_only(), wrapper.as_bytes())?;
    std::fs::set_permissions(
        files.virtiofsd_read_only(),
        std::fs::Permissions::from_mode(0o755),
    )
    .map_err(|e| {
        WorkerError::io(
            "make the wrapper executable",
            files.virtiofsd_read_only(),
            e,
        )
    })?;
    create_dir(&files.root.join("domains"), 0o755)
}

/// Removes the files of the runtime's other data directories that no longer exist (each
/// holds a link to a worker binary and copies of its libraries, half a gigabyte for a debug
/// build): a directory whose owner file is missing is being laid out and is left alone.
fn sweep_gone_workers(mine: &Path) {
    let Some(workers) = mine.parent() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(workers) else {
        return;
    };
    for entry in entries.flatten().take(WORKER_DIRS_SWEPT_MAX) {
        let dir = entry.path();
        if dir == mine {
            continue;
        }
        let Ok(owner) = read_small_path(&dir.join(OWNER_NAME)) else {
            continue;
        };
        if !Path::new(&owner).exists() && std::fs::remove_dir_all(&dir).is_ok() {
            tracing::info!(dir = %dir.display(), data_dir = %owner.to_string_lossy(), "removed the KVM files of a data directory that is gone");
        }
    }
}

/// `state_dir` and each of its ancestors must be searchable by QEMU's user.
fn check_reachable(state_dir: &Path) -> Result<(), WorkerError> {
    create_dir(state_dir, 0o711)?;
    for dir in state_dir.ancestors() {
        let meta = std::fs::metadata(dir).map_err(|e| WorkerError::io("inspect", dir, e))?;
        if meta.permissions().mode() & 0o001 == 0 {
            return Err(invalid(
                "kvm.state_dir",
                format!(
                    "{} is not searchable by other users, and QEMU runs as libvirt's own user; \
                     choose a state directory under a path like /var/lib",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

fn create_dir(dir: &Path, mode: u32) -> Result<(), WorkerError> {
    std::fs::create_dir_all(dir).map_err(|e| WorkerError::io("create", dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| WorkerError::io("set the mode of", dir, e))
}

/// Makes `dest` the worker's binary: a hard link (the share is read-only, so the guest cannot
/// write through it), or a copy across file systems.
fn replace_with_link(binary: &Path, dest: &Path) -> Result<(), WorkerError> {
    let staged = dest.with_extension("new");
    let _ = std::fs::remove_file(&staged);
    if std::fs::hard_link(binary, &staged).is_err() {
        std::fs::copy(binary, &staged)
            .map_err(|e| WorkerError::io("copy the agent binary to", &staged, e))?;
    }
    std::fs::rename(&staged, dest).map_err(|e| WorkerError::io("rename into", dest, e))
}

/// What identifies the image a probe booted: the kernel's and initramfs's sizes and times.
fn image_key(kernel: &Path, initrd: &Path) -> String {
    let part = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| {
                let at = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                format!("{}:{at}", m.len())
            })
            .unwrap_or_default()
    };
    format!("{}/{}", part(kernel), part(initrd))
}

/// The probe's earlier answer for the image `key` names.
fn read_probe(cache: &Path, key: &str) -> Option<DomainType> {
    let text = read_small(cache).ok()?;
    let (seen, kind) = text.trim().rsplit_once(' ')?;
    if seen != key {
        return None;
    }
    match kind {
        "kvm" => Some(DomainType::Kvm),
        "qemu" => Some(DomainType::Qemu),
        _ => None,
    }
}

/// A data directory's path, as `lay_out` wrote it.
fn read_small_path(path: &Path) -> std::io::Result<std::ffi::OsString> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(DATA_DIR_BYTES_MAX)
        .read_to_end(&mut bytes)?;
    Ok(std::os::unix::ffi::OsStringExt::from_vec(bytes))
}

/// The out-of-memory kills a guest's report names (`oom_kill N`, from its `/proc/vmstat`), if
/// any.
fn oom_kills(report: &str) -> Option<u64> {
    report
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .filter(|n| *n > 0)
}

/// A small file a guest may have written in `dir` (a share the sandbox user writes), through
/// the worker's one guard for such reads (`Beneath`: no link followed, no FIFO waited on,
/// plain files of one link only); at most 256 bytes. `None` when it is not there.
fn read_guest_small(dir: &Path, name: &str) -> Result<Option<String>, String> {
    use std::io::Read;
    let file = match Beneath::open(dir).and_then(|d| d.read(Path::new(name))) {
        Ok(file) => file,
        Err(e) if e.is_missing() => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut text = String::new();
    file.take(256)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", dir.join(name).display()))?;
    Ok(Some(text))
}

/// A small file of the worker's own (the probe's answer): at most 256 bytes are read.
fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(256)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// A virtiofs daemon that can serve read-only shares, where the usual installs put it: the
/// one `scripts/test` builds, the distribution's, then PATH. QEMU 7's own C daemon
/// (`/usr/lib/qemu/virtiofsd`) has no `--readonly` and is passed over.
fn find_virtiofsd() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(Path::new(&home).join(".cache/squadron-tools/bin/virtiofsd"));
    }
    candidates.push("/usr/libexec/virtiofsd".into());
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("virtiofsd")));
    }
    candidates
        .into_iter()
        .find(|p| p.is_file() && serves_read_only(p))
}

/// Whether the daemon knows `--readonly` (its `--help` says so).
fn serves_read_only(virtiofsd: &Path) -> bool {
    std::process::Command::new(virtiofsd)
        .arg("--help")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("--readonly"))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WorkerError> + Send + 'static,
) -> Result<T, WorkerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| WorkerError::runtime(RUNTIME_NAME, format!("a libvirt call panicked: {e}")))?
}

fn kvm_name(handle: &SandboxHandle) -> Result<&str, WorkerError> {
    handle.id_for(RuntimeKind::Kvm)
}

fn invalid(field: &str, message: String) -> WorkerError {
    WorkerError::Invalid {
        field: field.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests;
