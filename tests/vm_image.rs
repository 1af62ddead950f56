//! The KVM runtime's base image (`scripts/build-vm-image`, which `scripts/test` runs): it
//! boots under QEMU's software emulation — what this machine has, and what the runtime falls
//! back to where `/dev/kvm` cannot boot it — to `squadron-vm: ready` with its virtio modules
//! loaded, names its virtio-serial port, and a line written by the guest on that port reaches
//! the host's Unix socket: the channel the agent will use instead of an IP network. The boot
//! time is printed.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PORT_NAME: &str = "org.squadron.agent";
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

fn image_dir() -> PathBuf {
    std::env::var_os("SQUADRON_VM_IMAGE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/squadron-vm")
        })
}

#[test]
fn the_base_image_boots_and_speaks_on_its_virtio_serial_port() {
    let dir = image_dir();
    let (kernel, initrd) = (dir.join("vmlinuz"), dir.join("initrd.img"));
    assert!(
        kernel.exists() && initrd.exists(),
        "no VM image in {}: run scripts/build-vm-image (scripts/test does)",
        dir.display()
    );
    let scratch = tempfile::tempdir().expect("tempdir");
    let socket = scratch.path().join("agent.sock");
    let started = Instant::now();
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-machine", "q35,accel=tcg", "-m", "256", "-smp", "1"])
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet squadron.selftest"])
        .args(["-device", "virtio-serial-pci"])
        .arg("-chardev")
        .arg(format!(
            "socket,id=agent,path={},server=on,wait=off",
            socket.display()
        ))
        .args([
            "-device",
            &format!("virtserialport,chardev=agent,name={PORT_NAME}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-system-x86_64 (scripts/test installs qemu-system-x86)");

    // The host's end of the channel: QEMU listens, the test connects and reads the guest's
    // line.
    let deadline = Instant::now() + BOOT_TIMEOUT;
    let mut port = loop {
        match UnixStream::connect(&socket) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "no channel socket: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    port.set_read_timeout(Some(BOOT_TIMEOUT)).expect("timeout");
    let mut line = String::new();
    BufReader::new(&mut port)
        .read_line(&mut line)
        .expect("a line from the guest");
    let channel_at = started.elapsed();
    assert_eq!(line, format!("squadron-vm: hello on {PORT_NAME}\n"));

    let mut console = String::new();
    let mut stdout = qemu.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let _ = stdout.read_to_string(&mut console);
        console
    });
    let status = loop {
        if let Some(s) = qemu.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = qemu.kill();
            panic!("the guest did not power off within {BOOT_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let console = reader.join().expect("console");
    assert!(status.success(), "qemu: {status}\n{console}");
    let ready = console
        .lines()
        .find(|l| l.contains("squadron-vm: ready"))
        .unwrap_or_else(|| panic!("the guest never said ready:\n{console}"));
    assert!(ready.contains(&format!("ports={PORT_NAME}")), "{ready}");
    assert!(
        !console.contains("cannot load"),
        "a module failed to load:\n{console}"
    );
    eprintln!(
        "VM image: channel line after {} ms, powered off after {} ms (software emulation)",
        channel_at.as_millis(),
        started.elapsed().as_millis()
    );
}
