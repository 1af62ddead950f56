//! The libvirt domain of one attempt, as XML: direct kernel boot of the base image, memory
//! shared with the virtiofs daemons (memfd), one virtiofs share per task directory, the agent's
//! channel and the control port as virtio-serial ports whose host sockets libvirt places
//! itself, the console logged to a file, and the attempt's identity in the metadata, by which
//! a restarted worker finds the domain again.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use quick_xml::escape::escape;
use quick_xml::events::Event;
use quick_xml::Reader;
use squadron_api::agent_channel::{BREAK_GLASS_PORT_NAME, CONTROL_PORT_NAME, PORT_NAME};

use crate::error::WorkerError;

/// The metadata element's namespace.
pub(crate) const METADATA_URI: &str = "https://squadron.dev/xmlns/attempt/1";
const METADATA_PREFIX: &str = "squadron";
/// The longest virtiofs tag (the virtio-fs device's tag field).
const TAG_BYTES_MAX: usize = 36;
/// The longest kernel command line of x86_64.
const CMDLINE_BYTES_MAX: usize = 2048;

/// Software emulation or hardware virtualisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DomainType {
    Kvm,
    Qemu,
}

impl DomainType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DomainType::Kvm => "kvm",
            DomainType::Qemu => "qemu",
        }
    }

    /// The guest's CPU: the host's own under hardware virtualisation, and under emulation
    /// every feature QEMU emulates (`-cpu max`, libvirt 7.1 or later) — its default `qemu64`
    /// lacks the AVX the provider CLIs' runtimes are built for (Claude Code died with SIGILL
    /// on it). Under `kvm` without the virtualisation extensions: untrusted code must not run
    /// a hypervisor of its own on the host kernel's nested virtualisation. Under emulation the
    /// extensions QEMU offers are emulated in its own unprivileged process and reach no host
    /// kernel code (and `max` without `svm` crashed the guest's init under QEMU 7.2's TCG).
    fn cpu_xml(self) -> &'static str {
        match self {
            DomainType::Kvm => {
                "<cpu mode='host-passthrough'><feature policy='disable' name='vmx'/>\
                 <feature policy='disable' name='svm'/></cpu>"
            }
            DomainType::Qemu => "<cpu mode='maximum'/>",
        }
    }
}

/// One virtiofs share: a host directory the guest mounts by `tag` at `guest_path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Share {
    pub(crate) tag: &'static str,
    pub(crate) host_dir: PathBuf,
    pub(crate) guest_path: String,
    pub(crate) read_only: bool,
}

/// Who the domain belongs to; written into and read back from its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptMark {
    pub(crate) task: u64,
    pub(crate) attempt: u32,
    pub(crate) worker: String,
    /// The host path of the task directory.
    pub(crate) dir: String,
}

/// The guest's one NIC in `outbound` mode: a virtio NIC on the worker's tap (made, addressed
/// and filtered by the worker, `squadron_isolation::SandboxNetwork::create_tap`), which
/// libvirt only opens (`managed='no'`); `vm-init` addresses the guest's end from the kernel
/// command line (`squadron.net=ADDRESS/30,GATEWAY`, `squadron.dns=A,B`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GuestNic {
    pub(crate) tap: String,
    pub(crate) address: Ipv4Addr,
    pub(crate) gateway: Ipv4Addr,
    /// Name servers the guest may use (the host's, where the filter lets them be reached).
    pub(crate) dns: Vec<Ipv4Addr>,
    /// `gateway`: the worker's proxy on the tap's host address, the guest's only way out.
    pub(crate) proxy: Option<std::net::SocketAddrV4>,
}

/// The kernel argument that keeps a guest up after its agent exits (`vm-init` reads it).
pub(crate) const PRESERVE_FLAG: &str = "squadron.preserve";
/// The kernel argument carrying the break-glass key: an ed25519 public key's base64.
const SSH_KEY_ARG: &str = "squadron.ssh_key";

#[derive(Debug, Clone)]
pub(crate) struct DomainSpec {
    pub(crate) name: String,
    pub(crate) domain_type: DomainType,
    pub(crate) mark: AttemptMark,
    pub(crate) memory_mib: u64,
    pub(crate) cpus: u32,
    pub(crate) kernel: PathBuf,
    pub(crate) initrd: PathBuf,
    pub(crate) console_log: PathBuf,
    /// The virtiofs daemon for read-write shares, and the one that serves read-only.
    pub(crate) virtiofsd: PathBuf,
    pub(crate) virtiofsd_read_only: PathBuf,
    pub(crate) shares: Vec<Share>,
    /// Keep the guest up after the agent exits (a preserved failure).
    pub(crate) keep_after_exit: bool,
    /// The base64 of the ed25519 public key a kept guest lets in over SSH, on the
    /// break-glass port (`break_glass`); only with `keep_after_exit`.
    pub(crate) break_glass_key: Option<String>,
    /// Test hook: `vm-init` sleeps this long before it starts the agent.
    pub(crate) test_boot_delay_ms: Option<u64>,
    /// No NIC at all (`isolated`) or the `outbound` one.
    pub(crate) nic: Option<GuestNic>,
    /// The guest's scratch disk (a sparse raw file), which `vm-init` formats and mounts at
    /// `/tmp` (`squadron.scratch`).
    pub(crate) scratch: Option<PathBuf>,
}

/// The kernel argument that gives the guest's `/tmp` the scratch disk.
pub(crate) const SCRATCH_FLAG: &str = "squadron.scratch";

impl DomainSpec {
    /// The kernel command line: the console, and what `vm-init` reads.
    pub(crate) fn cmdline(&self) -> Result<String, WorkerError> {
        let mounts: Vec<String> = self
            .shares
            .iter()
            .map(|s| {
                let mode = if s.read_only { "ro" } else { "rw" };
                format!("{}:{}:{mode}", s.tag, s.guest_path)
            })
            .collect();
        let mut line = format!(
            "console=ttyS0 quiet panic=-1 squadron.mounts={}",
            mounts.join(",")
        );
        if self.keep_after_exit {
            line.push(' ');
            line.push_str(PRESERVE_FLAG);
            if let Some(key) = &self.break_glass_key {
                let base64 = |b: u8| b.is_ascii_alphanumeric() || b"+/=".contains(&b);
                if key.is_empty() || !key.bytes().all(base64) {
                    return Err(invalid("kvm.break_glass_key", "not base64".into()));
                }
                line.push_str(&format!(" {SSH_KEY_ARG}={key}"));
            }
        }
        if let Some(ms) = self.test_boot_delay_ms {
            line.push_str(&format!(" squadron.test_boot_delay={}", ms.div_ceil(1000)));
        }
        if self.scratch.is_some() {
            line.push(' ');
            line.push_str(SCRATCH_FLAG);
        }
        if let Some(nic) = &self.nic {
            line.push_str(&format!(" squadron.net={}/30,{}", nic.address, nic.gateway));
            if !nic.dns.is_empty() {
                let dns: Vec<String> = nic.dns.iter().map(Ipv4Addr::to_string).collect();
                line.push_str(&format!(" squadron.dns={}", dns.join(",")));
            }
        }
        if line.len() > CMDLINE_BYTES_MAX || mounts.iter().any(|m| m.contains(char::is_whitespace))
        {
            return Err(invalid(
                "kvm.cmdline",
                format!(
                    "the kernel command line would be {} bytes or hold a space",
                    line.len()
                ),
            ));
        }
        Ok(line)
    }

    pub(crate) fn to_xml(&self) -> Result<String, WorkerError> {
        let cmdline = self.cmdline()?;
        let mut devices = String::new();
        for share in &self.shares {
            devices.push_str(&self.share_xml(share)?);
        }
        if let Some(nic) = &self.nic {
            devices.push_str(&nic_xml(nic)?);
        }
        if let Some(scratch) = &self.scratch {
            devices.push_str(&format!(
                // A full host disk is an I/O error in the guest, not a paused guest (QEMU's
                // default), which would look running until the task's timeout.
                "<disk type='file' device='disk'><driver name='qemu' type='raw' error_policy='report'/>\
                 <source file='{}'/><target dev='vda' bus='virtio'/></disk>",
                path_text(scratch, "kvm.scratch")?
            ));
        }
        let break_glass = self
            .break_glass_key
            .as_ref()
            .filter(|_| self.keep_after_exit)
            .map(|_| BREAK_GLASS_PORT_NAME);
        for port in [PORT_NAME, CONTROL_PORT_NAME]
            .into_iter()
            .chain(break_glass)
        {
            // No path: libvirt makes the socket under its own channel directory, which QEMU's
            // user may write, and reports it in the live XML (`channel_socket`).
            devices.push_str(&format!(
                "<channel type='unix'><source mode='bind'/><target type='virtio' name='{port}'/></channel>"
            ));
        }
        devices.push_str(&format!(
            "<serial type='pty'><log file='{}' append='off'/><target port='0'/></serial>\
             <console type='pty'><target type='serial' port='0'/></console>\
             <memballoon model='none'/>",
            path_text(&self.console_log, "kvm.console_log")?
        ));
        let m = &self.mark;
        Ok(format!(
            "<domain type='{kind}'>\
             <name>{name}</name>\
             <metadata><{METADATA_PREFIX}:attempt xmlns:{METADATA_PREFIX}='{METADATA_URI}' \
             task='{task}' attempt='{attempt}' worker='{worker}' dir='{dir}'/></metadata>\
             <memory unit='MiB'>{memory}</memory><vcpu>{cpus}</vcpu>{cpu}\
             <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>\
             <os><type arch='x86_64' machine='pc'>hvm</type>\
             <kernel>{kernel}</kernel><initrd>{initrd}</initrd><cmdline>{cmdline}</cmdline></os>\
             <features><acpi/></features>\
             <on_poweroff>destroy</on_poweroff><on_reboot>destroy</on_reboot>\
             <on_crash>destroy</on_crash>\
             <devices>{devices}</devices></domain>",
            kind = self.domain_type.as_str(),
            name = escape(&self.name),
            task = m.task,
            attempt = m.attempt,
            worker = escape(&m.worker),
            dir = escape(&m.dir),
            memory = self.memory_mib,
            cpus = self.cpus,
            cpu = self.domain_type.cpu_xml(),
            kernel = path_text(&self.kernel, "kvm.kernel")?,
            initrd = path_text(&self.initrd, "kvm.initrd")?,
            cmdline = escape(&cmdline),
        ))
    }

    fn share_xml(&self, share: &Share) -> Result<String, WorkerError> {
        if share.tag.len() > TAG_BYTES_MAX {
            return Err(invalid(
                "kvm.share",
                format!("tag {} is too long", share.tag),
            ));
        }
        // libvirt 9 has no read-only virtiofs: a share is read-only because its daemon is
        // started with --readonly (the wrapper `virtiofsd_read_only`), which the guest cannot
        // undo, unlike a read-only mount inside it.
        let daemon = if share.read_only {
            &self.virtiofsd_read_only
        } else {
            &self.virtiofsd
        };
        Ok(format!(
            "<filesystem type='mount' accessmode='passthrough'><driver type='virtiofs'/>\
             <binary path='{daemon}'/><source dir='{source}'/><target dir='{tag}'/></filesystem>",
            daemon = path_text(daemon, "kvm.virtiofsd")?,
            source = path_text(&share.host_dir, share.tag)?,
            tag = share.tag,
        ))
    }
}

/// The NIC element: the tap is the worker's, so libvirt neither makes nor removes it.
fn nic_xml(nic: &GuestNic) -> Result<String, WorkerError> {
    // An interface name is at most 15 bytes of no space or slash (IFNAMSIZ).
    if nic.tap.is_empty()
        || nic.tap.len() > 15
        || !nic.tap.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(invalid(
            "kvm.nic",
            format!("tap name {:?} is not an interface name", nic.tap),
        ));
    }
    Ok(format!(
        "<interface type='ethernet'><target dev='{}' managed='no'/><model type='virtio'/></interface>",
        nic.tap
    ))
}

/// The attempt a domain's metadata element names, if it is ours.
pub(crate) fn parse_mark(xml: &str) -> Option<AttemptMark> {
    let mut reader = Reader::from_str(xml);
    loop {
        match reader.read_event() {
            Ok(Event::Empty(e) | Event::Start(e)) if e.local_name().as_ref() == b"attempt" => {
                let get = |name: &[u8]| -> Option<String> {
                    let attr = e.try_get_attribute(name).ok()??;
                    attr.unescape_value().ok().map(|v| v.into_owned())
                };
                return Some(AttemptMark {
                    task: get(b"task")?.parse().ok()?,
                    attempt: get(b"attempt")?.parse().ok()?,
                    worker: get(b"worker")?,
                    dir: get(b"dir")?,
                });
            }
            Ok(Event::Eof) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// The guest's memory in MiB, from a domain's XML (libvirt's live XML says KiB; ours, MiB).
pub(crate) fn memory_mib(xml: &str) -> Option<u64> {
    let mut reader = Reader::from_str(xml);
    let mut unit: Option<String> = None;
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) if e.name().as_ref() == b"memory" => {
                unit = Some(
                    e.try_get_attribute(b"unit")
                        .ok()
                        .flatten()
                        .and_then(|a| a.unescape_value().ok().map(|v| v.into_owned()))
                        .unwrap_or_else(|| "KiB".into()),
                );
            }
            Ok(Event::Text(t)) if unit.is_some() => {
                let n: u64 = t.unescape().ok()?.trim().parse().ok()?;
                return match unit.as_deref()? {
                    "KiB" | "k" => Some(n / 1024),
                    "MiB" | "M" => Some(n),
                    "GiB" | "G" => n.checked_mul(1024),
                    _ => None,
                };
            }
            Ok(Event::Eof) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// The host socket libvirt made for the virtio-serial port `port`, from a live domain's XML.
pub(crate) fn channel_socket(xml: &str, port: &str) -> Option<PathBuf> {
    let mut reader = Reader::from_str(xml);
    let mut in_channel = false;
    let mut path: Option<String> = None;
    let mut name: Option<String> = None;
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) if e.name().as_ref() == b"channel" => {
                in_channel = true;
                path = None;
                name = None;
            }
            Ok(Event::End(e)) if e.name().as_ref() == b"channel" => {
                if in_channel && name.as_deref() == Some(port) {
                    return path.map(PathBuf::from);
                }
                in_channel = false;
            }
            Ok(Event::Empty(e) | Event::Start(e)) if in_channel => {
                let attr = |key: &[u8]| {
                    e.try_get_attribute(key)
                        .ok()
                        .flatten()
                        .and_then(|a| a.unescape_value().ok().map(|v| v.into_owned()))
                };
                match e.name().as_ref() {
                    b"source" => path = attr(b"path"),
                    b"target" => name = attr(b"name"),
                    _ => {}
                }
            }
            Ok(Event::Eof) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// A path as XML text, escaped; a path that is not UTF-8 is refused naming `field`.
pub(crate) fn path_text(path: &Path, field: &str) -> Result<String, WorkerError> {
    let text = path
        .to_str()
        .ok_or_else(|| invalid(field, format!("{} is not valid UTF-8", path.display())))?;
    Ok(escape(text).into_owned())
}

fn invalid(field: &str, message: String) -> WorkerError {
    WorkerError::Invalid {
        field: field.to_string(),
        message,
    }
}
