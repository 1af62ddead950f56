//! A virtio-serial port of the guest (`/dev/virtio-ports/<name>`) as one tokio byte stream.
//!
//! Written here (a readiness loop over `AsyncFd`) because the port is a character device that
//! may be opened only once: tokio's pipe types open a reader and a writer separately, and
//! `tokio::fs::File` serialises reads and writes through a blocking thread.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustix::fs::{Mode, OFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[derive(Debug)]
pub struct VirtioPort {
    fd: AsyncFd<OwnedFd>,
}

impl VirtioPort {
    /// Opens the port for reading and writing, non-blocking.
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )?;
        // `register`, its replacement, is `unsafe` (forbidden here) for a contract an `OwnedFd`
        // keeps by construction: it owns its descriptor and always returns the same one.
        #[allow(deprecated)]
        let fd = AsyncFd::new(fd)?;
        Ok(Self { fd })
    }
}

impl AsyncRead for VirtioPort {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| {
                rustix::io::read(fd.get_ref(), &mut *unfilled).map_err(io::Error::from)
            }) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for VirtioPort {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| rustix::io::write(fd.get_ref(), buf).map_err(io::Error::from)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
