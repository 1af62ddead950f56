//! The domain XML and the metadata and channel parsing, without libvirt; the runtime itself
//! is tested against a real libvirt and guest in `tests/worker_tasks.rs` (`kvm/…`).

use std::path::PathBuf;

use squadron_core::manifest::NetworkMode;

use super::domain_xml::*;
use super::*;

fn spec(keep: bool) -> DomainSpec {
    DomainSpec {
        name: "squadron-task-7-a2-0badc0de".into(),
        domain_type: DomainType::Qemu,
        mark: AttemptMark {
            task: 7,
            attempt: 2,
            worker: "w<1>".into(),
            dir: "/data/tasks/7 & co".into(),
        },
        memory_mib: 512,
        cpus: 2,
        kernel: "/var/lib/squadron/vm/image/vmlinuz".into(),
        initrd: "/var/lib/squadron/vm/image/initrd.img".into(),
        console_log: "/var/lib/squadron/vm/domains/x/console.log".into(),
        virtiofsd: "/usr/libexec/virtiofsd".into(),
        virtiofsd_read_only: "/var/lib/squadron/vm/virtiofsd-readonly".into(),
        shares: vec![
            Share {
                tag: "inbox",
                host_dir: "/data/tasks/7/inbox".into(),
                guest_path: "/mnt/inbox".into(),
                read_only: false,
            },
            Share {
                tag: "run",
                host_dir: "/data/tasks/7/run".into(),
                guest_path: "/mnt/run".into(),
                read_only: true,
            },
        ],
        keep_after_exit: keep,
        break_glass_key: None,
        test_boot_delay_ms: None,
        nic: None,
        scratch: None,
    }
}

#[test]
fn the_metadata_written_is_the_metadata_read_back_escaped() {
    let xml = spec(false).to_xml().unwrap();
    assert!(
        xml.contains("w&lt;1&gt;") && xml.contains("7 &amp; co"),
        "{xml}"
    );
    assert_eq!(parse_mark(&xml), Some(spec(false).mark));
    // libvirt hands the element back on its own, with its own quoting.
    let element = r#"<squadron:attempt xmlns:squadron="https://squadron.dev/xmlns/attempt/1" task="7" attempt="2" worker="w&lt;1&gt;" dir="/data/tasks/7 &amp; co"/>"#;
    assert_eq!(parse_mark(element), Some(spec(false).mark));
    assert_eq!(parse_mark("<other task='1'/>"), None);
    assert_eq!(
        parse_mark("<squadron:attempt task='x' attempt='1' worker='w' dir='d'/>"),
        None
    );
}

#[test]
fn read_only_shares_go_through_the_read_only_daemon_and_the_cmdline_names_every_share() {
    let xml = spec(false).to_xml().unwrap();
    let run = xml.find("<target dir='run'/>").unwrap();
    let inbox = xml.find("<target dir='inbox'/>").unwrap();
    let before = |at: usize| &xml[..at];
    assert!(before(run).rfind("virtiofsd-readonly") > before(run).rfind("/usr/libexec/virtiofsd"));
    assert!(before(inbox).rfind("/usr/libexec/virtiofsd").is_some());
    assert!(!before(inbox).contains("virtiofsd-readonly"));
    let cmdline = spec(false).cmdline().unwrap();
    assert!(
        cmdline.contains("squadron.mounts=inbox:/mnt/inbox:rw,run:/mnt/run:ro"),
        "{cmdline}"
    );
    assert!(!cmdline.contains("squadron.preserve"));
    assert!(spec(true).cmdline().unwrap().contains("squadron.preserve"));
    assert!(xml.contains("<memoryBacking><source type='memfd'/><access mode='shared'/>"));
    assert!(xml.contains("<domain type='qemu'>") && xml.contains("<vcpu>2</vcpu>"));
    // Emulation offers every CPU feature it has (the CLIs need AVX); KVM passes the host's.
    // A KVM guest may not run a hypervisor of its own on the host kernel.
    let no_nesting =
        "<feature policy='disable' name='vmx'/><feature policy='disable' name='svm'/></cpu>";
    assert!(xml.contains("<cpu mode='maximum'/>"), "{xml}");
    let mut kvm = spec(false);
    kvm.domain_type = DomainType::Kvm;
    let kvm = kvm.to_xml().unwrap();
    assert!(
        kvm.contains(&format!("<cpu mode='host-passthrough'>{no_nesting}")),
        "{kvm}"
    );
}

#[test]
fn an_outbound_guest_gets_the_worker_s_tap_and_its_address_on_the_cmdline() {
    assert!(!spec(false).to_xml().unwrap().contains("<interface"));
    assert!(!spec(false).cmdline().unwrap().contains("squadron.net"));
    let mut s = spec(false);
    s.nic = Some(GuestNic {
        tap: "sqh0a0b".into(),
        address: "100.64.40.46".parse().unwrap(),
        gateway: "100.64.40.45".parse().unwrap(),
        dns: vec!["198.51.100.53".parse().unwrap()],
        proxy: None,
    });
    let xml = s.to_xml().unwrap();
    assert!(
        xml.contains("<interface type='ethernet'><target dev='sqh0a0b' managed='no'/><model type='virtio'/></interface>"),
        "{xml}"
    );
    let cmdline = s.cmdline().unwrap();
    assert!(
        cmdline.contains(" squadron.net=100.64.40.46/30,100.64.40.45 squadron.dns=198.51.100.53"),
        "{cmdline}"
    );
    s.nic.as_mut().unwrap().tap = "sqh x'/>".into();
    assert!(s.to_xml().unwrap_err().to_string().contains("kvm.nic"));
}

#[test]
fn a_scratch_disk_is_a_raw_virtio_disk_named_on_the_cmdline() {
    assert!(!spec(false).to_xml().unwrap().contains("<disk"));
    assert!(!spec(false).cmdline().unwrap().contains(SCRATCH_FLAG));
    let mut s = spec(false);
    s.scratch = Some("/var/lib/squadron/vm/domains/x/scratch.img".into());
    let xml = s.to_xml().unwrap();
    assert!(
        xml.contains("<disk type='file' device='disk'><driver name='qemu' type='raw' error_policy='report'/><source file='/var/lib/squadron/vm/domains/x/scratch.img'/><target dev='vda' bus='virtio'/></disk>"),
        "{xml}"
    );
    assert!(s.cmdline().unwrap().contains(" squadron.scratch"));
}

#[test]
fn a_share_path_with_a_space_or_a_long_tag_is_refused_naming_the_field() {
    let mut s = spec(false);
    s.shares[0].guest_path = "/mnt/in box".into();
    let err = s.cmdline().unwrap_err().to_string();
    assert!(err.contains("kvm.cmdline"), "{err}");
    let mut s = spec(false);
    s.shares[0].tag = "a-tag-far-longer-than-thirty-six-bytes-allowed";
    assert!(s.to_xml().unwrap_err().to_string().contains("kvm.share"));
}

#[test]
fn the_channel_sockets_are_read_from_the_live_xml() {
    let live = "<domain><devices>\
        <channel type='unix'><source mode='bind' path='/var/lib/libvirt/qemu/channel/target/domain-3-x/org.squadron.agent'/>\
        <target type='virtio' name='org.squadron.agent' state='connected'/><alias name='channel0'/></channel>\
        <channel type='unix'><source mode='bind' path='/run/c/org.squadron.control'/>\
        <target type='virtio' name='org.squadron.control'/></channel></devices></domain>";
    assert_eq!(
        channel_socket(live, "org.squadron.agent"),
        Some(PathBuf::from(
            "/var/lib/libvirt/qemu/channel/target/domain-3-x/org.squadron.agent"
        ))
    );
    assert_eq!(
        channel_socket(live, "org.squadron.control"),
        Some(PathBuf::from("/run/c/org.squadron.control"))
    );
    assert_eq!(channel_socket(live, "org.other"), None);
    // An inactive domain's XML has no path yet.
    assert_eq!(channel_socket("<channel type='unix'><source mode='bind'/><target type='virtio' name='org.squadron.agent'/></channel>", "org.squadron.agent"), None);
}

#[test]
fn the_domain_type_choice_parses_and_names_a_bad_value() {
    assert_eq!(
        "auto".parse::<DomainTypeChoice>(),
        Ok(DomainTypeChoice::Auto)
    );
    assert_eq!(
        "qemu".parse::<DomainTypeChoice>(),
        Ok(DomainTypeChoice::Qemu)
    );
    assert!("xen"
        .parse::<DomainTypeChoice>()
        .unwrap_err()
        .contains("xen"));
}

#[test]
fn a_state_dir_others_cannot_search_is_refused_naming_the_field() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let err = check_reachable(&root.path().join("vm"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("kvm.state_dir") && err.contains("searchable"),
        "{err}"
    );
}

#[test]
fn full_control_is_refused_naming_the_field() {
    let _ = PathBuf::new();
    // See `check_launch`: the messages name the field the manifest must change.
    let dir = TaskDir::new(std::path::Path::new("/d"), TaskId::new(1).unwrap());
    let mut launch = LaunchSpec {
        task: TaskId::new(1).unwrap(),
        attempt: 1,
        dir,
        argv: vec!["/bin/true".into()],
        workdir: "/mnt/inbox".into(),
        env: Default::default(),
        limits: Default::default(),
        network: NetworkMode::Outbound,
        full_control: false,
        global_dir: None,
        credentials: None,
        egress: None,
        keep_after_exit: false,
    };
    check_launch(&launch).unwrap();
    launch.full_control = true;
    assert!(check_launch(&launch)
        .unwrap_err()
        .to_string()
        .contains("full_control"));
}

#[test]
fn the_files_of_gone_data_directories_are_swept_and_no_other() {
    let root = tempfile::tempdir().unwrap();
    let workers = root.path().join("workers");
    let dir = |name: &str, owner: Option<&std::path::Path>| {
        let d = workers.join(name);
        std::fs::create_dir_all(d.join("bin")).unwrap();
        if let Some(o) = owner {
            std::fs::write(d.join(OWNER_NAME), o.as_os_str().as_encoded_bytes()).unwrap();
        }
        d
    };
    let mine = dir("mine", Some(&root.path().join("nowhere")));
    let gone = dir("gone", Some(&root.path().join("deleted-data-dir")));
    let alive = dir("alive", Some(root.path()));
    let fresh = dir("fresh", None);
    sweep_gone_workers(&mine);
    assert!(!gone.exists(), "a gone data directory's files stay");
    assert!(mine.exists() && alive.exists() && fresh.exists());
}

#[test]
fn an_exit_code_is_read_only_from_a_plain_file_the_guest_could_not_aim_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("host-secret");
    std::fs::write(&secret, "7\n").unwrap();
    let agent = dir.path().join("agent");
    std::fs::create_dir(&agent).unwrap();
    let code = agent.join(EXIT_CODE_NAME);
    assert_eq!(
        KvmRuntime::exit_code(&agent).unwrap(),
        None,
        "not written yet"
    );
    // A link to a host file is not followed, even to one that holds a number.
    std::os::unix::fs::symlink(&secret, &code).unwrap();
    assert_eq!(KvmRuntime::exit_code(&agent).unwrap(), None);
    std::fs::remove_file(&code).unwrap();
    // A FIFO neither blocks the read nor passes for a code.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &code,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    assert_eq!(KvmRuntime::exit_code(&agent).unwrap(), None);
    std::fs::remove_file(&code).unwrap();
    // Garbage is ignored, not an error that would stop the domain's destruction.
    std::fs::write(&code, "root:x:0:0\n").unwrap();
    assert_eq!(KvmRuntime::exit_code(&agent).unwrap(), None);
    std::fs::write(&code, "3\n").unwrap();
    assert_eq!(KvmRuntime::exit_code(&agent).unwrap(), Some(3));
}

#[test]
fn a_guest_s_memory_and_its_oom_kills_are_read_from_what_libvirt_and_the_guest_report() {
    assert_eq!(
        memory_mib("<domain><memory unit='KiB'>262144</memory></domain>"),
        Some(256)
    );
    assert_eq!(
        memory_mib("<domain><memory unit='MiB'>512</memory></domain>"),
        Some(512)
    );
    assert_eq!(
        memory_mib("<domain><memory>1048576</memory></domain>"),
        Some(1024)
    );
    assert_eq!(
        memory_mib("<domain><memory unit='b'>1</memory></domain>"),
        None
    );
    assert_eq!(memory_mib("<domain/>"), None);
    // Our own XML says MiB.
    assert_eq!(
        memory_mib(&spec(false).to_xml().unwrap()),
        Some(spec(false).memory_mib)
    );
    assert_eq!(oom_kills("oom_kill 2\n"), Some(2));
    assert_eq!(oom_kills("oom_kill 0\n"), None, "no kill, nothing to name");
    assert_eq!(oom_kills("oom_kill x\n"), None);
    assert_eq!(oom_kills(""), None);
}

#[test]
fn only_a_kept_guest_gets_the_break_glass_port_and_key() {
    let key = "AAAAC3NzaC1lZDI1NTE5AAAAIB+/x=".to_string();
    let mut kept = spec(true);
    kept.break_glass_key = Some(key.clone());
    let cmdline = kept.cmdline().unwrap();
    assert!(
        cmdline.contains(&format!("squadron.preserve squadron.ssh_key={key}")),
        "{cmdline}"
    );
    let xml = kept.to_xml().unwrap();
    assert!(
        xml.contains("<target type='virtio' name='org.squadron.breakglass'/>"),
        "{xml}"
    );
    // A guest that is not kept never serves SSH, whatever the spec holds.
    let mut gone = spec(false);
    gone.break_glass_key = Some(key);
    assert!(!gone.cmdline().unwrap().contains("ssh_key"));
    assert!(!gone.to_xml().unwrap().contains("breakglass"));
    assert!(!spec(true).to_xml().unwrap().contains("breakglass"));
    // Anything but base64 would add kernel arguments of its own.
    for bad in ["AAAA squadron.selftest", ""] {
        kept.break_glass_key = Some(bad.into());
        let e = kept.cmdline().unwrap_err().to_string();
        assert!(e.contains("kvm.break_glass_key"), "{bad:?}: {e}");
    }
}

#[test]
fn a_break_glass_key_is_root_s_alone_and_the_line_names_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = break_glass::BreakGlassKey::of_domain(dir.path());
    assert!(!key.exists());
    let public = key.create().unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&key.private_key()), 0o600);
    assert_eq!(mode(key.private_key().parent().unwrap()), 0o700);
    let private = ssh_key::PrivateKey::read_openssh_file(&key.private_key()).unwrap();
    let openssh = private.public_key().to_openssh().unwrap();
    assert_eq!(openssh, format!("ssh-ed25519 {public}"));
    // A second provisioning of the attempt makes a new pair in place of the old.
    let again = key.create().unwrap();
    assert_ne!(again, public);
    let socket = std::path::Path::new("/run/c/breakglass");
    let line = key
        .ssh_command(
            "squadron-task-7-a2",
            socket,
            std::path::Path::new("/usr/bin/squadron"),
        )
        .unwrap();
    assert!(line.starts_with("ssh -F none -a -x -i "), "{line}");
    assert!(
        line.contains(&format!(" -i {} ", key.private_key().display())),
        "{line}"
    );
    assert!(line.contains("-o ClearAllForwardings=yes"), "{line}");
    assert!(
        line.ends_with(
            "-o ProxyCommand='/usr/bin/squadron vm-ssh-proxy /run/c/breakglass' agent@squadron-task-7-a2"
        ),
        "{line}"
    );
    // A path a shell or ssh would read something into is never put in the line.
    for odd in [
        "/opt/my vm/squadron",
        "/opt/it's/squadron",
        "/opt/%h/squadron",
    ] {
        assert_eq!(
            key.ssh_command("squadron-task-7-a2", socket, std::path::Path::new(odd)),
            None,
            "{odd}"
        );
    }
}
