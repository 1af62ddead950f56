//! `squadron vm-ssh-proxy SOCKET`: the `ProxyCommand` of a kept KVM guest's break-glass SSH
//! line. It connects to the guest's break-glass port through its host socket (root's and
//! QEMU's), does the port's handshake (`squadron_api::agent_channel::BREAK_GLASS_HELLO`), drops
//! whatever the port held from an earlier session, then passes bytes both ways until either
//! end closes. Needs no cluster credentials: it talks to nothing but the socket.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use squadron_api::agent_channel::{BREAK_GLASS_HELLO, BREAK_GLASS_READY};

/// How long the guest has to answer: a guest just resumed may still be starting its server.
const ANSWER_WAIT_MS_MAX: u64 = 60_000;
/// The first resend of the hello; each later one waits twice as long, so a slow guest gets
/// a handful of hellos at most (its SSH server skips up to nine lines before a client's
/// version, and a hello it reads after answering is such a line).
const HELLO_RESEND_MS_FIRST: u64 = 2_000;
/// The most bytes of an earlier session kept while looking for the answer.
const PREAMBLE_BYTES_MAX: usize = 64 * 1024;
const COPY_BUFFER_BYTES: usize = 32 * 1024;

#[derive(Debug, Args)]
pub struct VmSshProxyArgs {
    /// The host socket of the guest's break-glass port (the SSH line names it).
    pub socket: PathBuf,
}

pub fn run(args: VmSshProxyArgs) -> anyhow::Result<()> {
    let mut port = UnixStream::connect(&args.socket)
        .with_context(|| format!("connect to the guest's port at {}", args.socket.display()))?;
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let rest = handshake(&mut port, &nonce)?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&rest)?;
    stdout.flush()?;
    let mut to_guest = port.try_clone()?;
    std::thread::spawn(move || {
        // SSH's end closed its output: the guest's server sees the end of its input.
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to_guest);
        let _ = to_guest.shutdown(std::net::Shutdown::Write);
    });
    let mut buf = vec![0u8; COPY_BUFFER_BYTES];
    loop {
        let n = match port.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("read from the guest's port"),
        };
        // Stdout is line-buffered; SSH's packets are not lines.
        stdout.write_all(&buf[..n])?;
        stdout.flush()?;
    }
}

/// Says hello until the guest answers with this nonce; what followed the answer.
fn handshake(port: &mut UnixStream, nonce: &str) -> anyhow::Result<Vec<u8>> {
    let hello = format!("{BREAK_GLASS_HELLO} {nonce}\n");
    let answer = format!("{BREAK_GLASS_READY} {nonce}\n");
    let started = Instant::now();
    let deadline = started + Duration::from_millis(ANSWER_WAIT_MS_MAX);
    let mut resend = Duration::from_millis(HELLO_RESEND_MS_FIRST);
    let mut next_hello = started;
    let mut seen: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "the guest did not answer on its break-glass port within {} s (is it kept and \
                 running, or does another session hold the port? `virsh console` reaches it too)",
                ANSWER_WAIT_MS_MAX / 1000
            );
        }
        if now >= next_hello {
            port.write_all(hello.as_bytes())
                .context("write to the guest's port")?;
            next_hello = now + resend;
            resend *= 2;
        }
        // Until the next hello, and never past the deadline.
        let wait = next_hello.min(deadline).saturating_duration_since(now);
        port.set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
        match port.read(&mut buf) {
            Ok(0) => bail!("the guest's break-glass port closed before the guest answered"),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(e).context("read from the guest's port"),
        }
        if let Some(at) = memchr::memmem::find(&seen, answer.as_bytes()) {
            port.set_read_timeout(None)?;
            return Ok(seen.split_off(at + answer.len()));
        }
        if seen.len() > PREAMBLE_BYTES_MAX {
            // Keep only what could be the start of the answer.
            seen.drain(..seen.len() - answer.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake guest on the other end of a socket pair: it sends the tail of an earlier
    /// session and a stale answer, skips the first hello, answers the second.
    #[test]
    fn the_handshake_drops_an_earlier_session_and_waits_for_its_own_answer() {
        let (mut host, mut guest) = UnixStream::pair().unwrap();
        let fake = std::thread::spawn(move || {
            guest
                .write_all(b"SSH-2.0-dropbear stale\r\n\x00\x01squadron-break-glass-ready old\n")
                .unwrap();
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            let mut hellos = 0;
            while hellos < 2 {
                guest.read_exact(&mut byte).unwrap();
                if byte[0] == b'\n' {
                    hellos += 1;
                    if hellos == 2 {
                        let text = String::from_utf8(line.clone()).unwrap();
                        let nonce = text.rsplit(' ').next().unwrap().to_string();
                        guest
                            .write_all(
                                format!("squadron-break-glass-ready {nonce}\nSSH-2.0-fresh\r\n")
                                    .as_bytes(),
                            )
                            .unwrap();
                    }
                    line.clear();
                } else {
                    line.push(byte[0]);
                }
            }
        });
        let started = Instant::now();
        let rest = handshake(&mut host, "abc123").unwrap();
        fake.join().unwrap();
        // The answer may arrive with the fresh greeting or before it.
        let mut rest = rest;
        while !rest.ends_with(b"\r\n") {
            let mut buf = [0u8; 64];
            let n = host.read(&mut buf).unwrap();
            rest.extend_from_slice(&buf[..n]);
        }
        assert_eq!(rest, b"SSH-2.0-fresh\r\n");
        assert!(started.elapsed() >= Duration::from_millis(HELLO_RESEND_MS_FIRST));
    }

    #[test]
    fn a_port_that_closes_before_answering_is_an_error() {
        let (mut host, guest) = UnixStream::pair().unwrap();
        drop(guest);
        let e = handshake(&mut host, "abc").unwrap_err().to_string();
        assert!(e.contains("closed") || e.contains("write"), "{e}");
    }
}
