//! The libvirt calls of the KVM runtime (`virt`), blocking: the runtime runs each on tokio's
//! blocking pool. Every call opens its own connection, so a libvirtd restart costs one failed
//! call and no reconnect logic.

use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::ErrorNumber;
use virt::sys;

use super::domain_xml::{parse_mark, AttemptMark, METADATA_URI};
use crate::error::WorkerError;

const RUNTIME_NAME: &str = "kvm";

/// Where a domain is in its life, as this runtime reads libvirt's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// Defined and never started (shut off for an unknown reason).
    NeverStarted,
    Running,
    /// Shut off after it ran: the guest powered off, was destroyed, or crashed.
    Stopped,
}

/// What one lookup found.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    pub(crate) lifecycle: Lifecycle,
    /// The live XML (with the channel sockets libvirt placed).
    pub(crate) xml: String,
    pub(crate) mark: Option<AttemptMark>,
}

/// One libvirt connection, closed when dropped (`virt::Connect` does not close itself).
struct Session(Connect);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.0.close();
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Hypervisor {
    uri: String,
}

impl Hypervisor {
    pub(crate) fn new(uri: &str) -> Self {
        // libvirt's default handler prints every error (a lookup of a domain that is not
        // there included) to the worker's output; each call's error is returned instead.
        virt::error::clear_error_callback();
        Self {
            uri: uri.to_string(),
        }
    }

    pub(crate) fn uri(&self) -> &str {
        &self.uri
    }

    fn open(&self) -> Result<Session, WorkerError> {
        Connect::open(Some(&self.uri)).map(Session).map_err(|e| {
            WorkerError::runtime(
                RUNTIME_NAME,
                format!(
                    "cannot connect to libvirt at {}: {e} (is libvirtd running? start it \
                     with `libvirtd -d`)",
                    self.uri
                ),
            )
        })
    }

    /// The hypervisor's domain types (`kvm`, `qemu`) for x86_64, from its capabilities.
    pub(crate) fn capabilities(&self) -> Result<String, WorkerError> {
        let session = self.open()?;
        session
            .0
            .get_capabilities()
            .map_err(|e| failed("read the capabilities", e))
    }

    pub(crate) fn define(&self, xml: &str) -> Result<(), WorkerError> {
        let session = self.open()?;
        Domain::define_xml(&session.0, xml)
            .map(|_| ())
            .map_err(|e| failed("define the domain", e))
    }

    pub(crate) fn lookup(&self, name: &str) -> Result<Option<Found>, WorkerError> {
        let session = self.open()?;
        let domain = match Domain::lookup_by_name(&session.0, name) {
            Ok(d) => d,
            Err(e) if e.code() == ErrorNumber::NoDomain => return Ok(None),
            Err(e) => return Err(failed(&format!("look up domain {name}"), e)),
        };
        let (state, reason) = domain
            .get_state()
            .map_err(|e| failed(&format!("read the state of {name}"), e))?;
        let lifecycle = match state {
            sys::VIR_DOMAIN_SHUTOFF if reason == sys::VIR_DOMAIN_SHUTOFF_UNKNOWN as i32 => {
                Lifecycle::NeverStarted
            }
            sys::VIR_DOMAIN_SHUTOFF | sys::VIR_DOMAIN_CRASHED => Lifecycle::Stopped,
            _ => Lifecycle::Running,
        };
        let xml = domain
            .get_xml_desc(0)
            .map_err(|e| failed(&format!("read the XML of {name}"), e))?;
        let mark = match domain.get_metadata(
            sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(METADATA_URI),
            0,
        ) {
            Ok(element) => parse_mark(&element),
            Err(e) if e.code() == ErrorNumber::NoDomainMetadata => None,
            Err(e) => return Err(failed(&format!("read the metadata of {name}"), e)),
        };
        Ok(Some(Found {
            lifecycle,
            xml,
            mark,
        }))
    }

    pub(crate) fn start(&self, name: &str) -> Result<(), WorkerError> {
        let session = self.open()?;
        let domain = Domain::lookup_by_name(&session.0, name)
            .map_err(|e| failed(&format!("look up domain {name}"), e))?;
        domain
            .create()
            .map(|_| ())
            .map_err(|e| failed(&format!("start domain {name}"), e))
    }

    /// Powers the domain off at once (SIGKILL to QEMU); a domain not running is left as is.
    pub(crate) fn power_off(&self, name: &str) -> Result<(), WorkerError> {
        let session = self.open()?;
        let domain = match Domain::lookup_by_name(&session.0, name) {
            Ok(d) => d,
            Err(e) if e.code() == ErrorNumber::NoDomain => return Ok(()),
            Err(e) => return Err(failed(&format!("look up domain {name}"), e)),
        };
        if !domain.is_active().unwrap_or(true) {
            return Ok(());
        }
        match domain.destroy() {
            Ok(()) => Ok(()),
            Err(e) if e.code() == ErrorNumber::OperationInvalid => Ok(()),
            Err(e) => Err(failed(&format!("power off domain {name}"), e)),
        }
    }

    /// Pauses a running domain (its vCPUs stop; nothing in it runs until resumed); a domain
    /// already paused, or not running, is left as is.
    pub(crate) fn suspend(&self, name: &str) -> Result<(), WorkerError> {
        self.when_in(name, sys::VIR_DOMAIN_RUNNING, "pause", Domain::suspend)
    }

    /// Resumes a paused domain; any other is left as is.
    pub(crate) fn resume(&self, name: &str) -> Result<(), WorkerError> {
        self.when_in(name, sys::VIR_DOMAIN_PAUSED, "resume", Domain::resume)
    }

    /// `act` on the domain if it is in `state`; otherwise nothing.
    fn when_in<T>(
        &self,
        name: &str,
        state: sys::virDomainState,
        what: &str,
        act: impl FnOnce(&Domain) -> Result<T, virt::error::Error>,
    ) -> Result<(), WorkerError> {
        let session = self.open()?;
        let domain = Domain::lookup_by_name(&session.0, name)
            .map_err(|e| failed(&format!("look up domain {name}"), e))?;
        match domain.get_state() {
            Ok((now, _)) if now == state => act(&domain)
                .map(|_| ())
                .map_err(|e| failed(&format!("{what} domain {name}"), e)),
            _ => Ok(()),
        }
    }

    /// Powers the domain off and removes its definition.
    pub(crate) fn remove(&self, name: &str) -> Result<(), WorkerError> {
        self.power_off(name)?;
        self.undefine(name)
    }

    /// Removes the definition with its NVRAM, managed save and snapshot metadata (virsh's
    /// `undefine --nvram --managed-save --snapshots-metadata`; the runtime removes the files
    /// it made itself).
    pub(crate) fn undefine(&self, name: &str) -> Result<(), WorkerError> {
        let session = self.open()?;
        let domain = match Domain::lookup_by_name(&session.0, name) {
            Ok(d) => d,
            Err(e) if e.code() == ErrorNumber::NoDomain => return Ok(()),
            Err(e) => return Err(failed(&format!("look up domain {name}"), e)),
        };
        let flags = sys::VIR_DOMAIN_UNDEFINE_NVRAM
            | sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
            | sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA;
        match domain.undefine_flags(flags) {
            Ok(()) => Ok(()),
            Err(e) if e.code() == ErrorNumber::NoDomain => Ok(()),
            Err(e) => Err(failed(&format!("undefine domain {name}"), e)),
        }
    }
}

fn failed(what: &str, e: virt::error::Error) -> WorkerError {
    WorkerError::runtime(RUNTIME_NAME, format!("{what}: {e}"))
}
