//! The sd_notify datagram protocol (cards D4, T5), in both directions: a socket the workload
//! reports on (its `NOTIFY_SOCKET`), and our own reports to the supervisor that started us when
//! it set `NOTIFY_SOCKET` (so a systemd `Type=notify` unit can wrap `tenure run` unchanged).
//!
//! **Only the workload speaks.** The workload's socket has `SO_PASSCRED`: the kernel attaches
//! the sender's pid to every datagram, and the driver accepts a datagram only from a process of
//! the workload (see [`NotifySocket::take`]); anyone else's is dropped with one warning line per
//! sender. A sender must still exist when its datagram is read (`systemd-notify` waits for that:
//! it sends `BARRIER=1` and waits until the descriptor it passes is closed, which the driver
//! does once it checked the senders of the datagrams it read, [`NotifySocket::take_holding`]).
//!
//! **The supervisor never stalls us.** Every send to the parent's socket is non-blocking: a full
//! queue or a missing socket is an error the caller reports as a warning, never a wait.

use std::ffi::OsString;
use std::io::{self, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;
use std::time::Duration;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

/// What the workload said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// `READY=1`.
    Ready,
    /// `STOPPING=1`.
    Stopping,
    /// `WATCHDOG=1`.
    Watchdog,
    /// `STATUS=...`: free text for the supervisor.
    Status(String),
    /// `EXTEND_TIMEOUT_USEC=N`.
    ExtendTimeout(Duration),
}

impl Notice {
    /// The assignment as the supervisor should see it (every notice is relayed upward except
    /// `READY=1` and `STOPPING=1`, which the owner sends on its own terms).
    pub fn relayed(&self) -> Option<String> {
        match self {
            Notice::Ready | Notice::Stopping => None,
            Notice::Watchdog => Some("WATCHDOG=1".into()),
            Notice::Status(s) => Some(format!("STATUS={s}")),
            Notice::ExtendTimeout(d) => Some(format!("EXTEND_TIMEOUT_USEC={}", d.as_micros())),
        }
    }
}

/// A datagram's notices and who sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// The sender's pid as the kernel reported it (`None` if no credentials came with it).
    pub sender: Option<u32>,
    /// The notices it carries.
    pub notices: Vec<Notice>,
}

/// The socket the workload notifies. It lives in the abstract namespace under a random 128-bit
/// name (no file to clean up, no path-length limit); only the workload is told the name, but the
/// name can be found (`/proc/net/unix`), so senders are checked too.
pub struct NotifySocket {
    sock: UnixDatagram,
    name: String,
}

impl NotifySocket {
    /// Binds a fresh socket with `SO_PASSCRED`.
    pub fn bind() -> io::Result<NotifySocket> {
        let mut r = [0u8; 16];
        crate::privfs::random_bytes(&mut r).map_err(io::Error::other)?;
        let name = format!("tenure/notify/{}", crate::hex::encode(&r));
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let sock = UnixDatagram::bind_addr(&addr)?;
        sock.set_nonblocking(true)?;
        rustix::net::sockopt::set_socket_passcred(&sock, true)?;
        Ok(NotifySocket { sock, name })
    }

    /// The value for the child's `NOTIFY_SOCKET` (`@` marks the abstract namespace).
    pub fn env_value(&self) -> OsString {
        format!("@{}", self.name).into()
    }

    /// Readable when a datagram is waiting.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Reads every waiting datagram, in order, with its sender. Descriptors passed along (the
    /// `BARRIER=1` protocol) are closed as soon as the datagram is read.
    pub fn take(&self) -> Vec<Datagram> {
        self.take_holding().0
    }

    /// Reads every waiting datagram, in order, with its sender, and the descriptors passed
    /// along (the `BARRIER=1` protocol), still open. A sender that waits for its descriptor to
    /// be closed (`systemd-notify`) exists until the caller drops them: the caller checks the
    /// senders first (card T5), since a sender that already exited can no longer be told from
    /// a stranger.
    pub fn take_holding(&self) -> (Vec<Datagram>, Vec<OwnedFd>) {
        let mut out = Vec::new();
        let mut held = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            let mut space =
                [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8), ScmCredentials(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(&mut buf)];
            let n = match rustix::net::recvmsg(
                &self.sock,
                &mut iov,
                &mut control,
                RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(r) => r.bytes,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            };
            let mut sender = None;
            for msg in control.drain() {
                match msg {
                    RecvAncillaryMessage::ScmCredentials(c) => {
                        sender = Some(c.pid.as_raw_nonzero().get() as u32);
                    }
                    // Closed by the caller: the sender of `BARRIER=1` waits for exactly that.
                    RecvAncillaryMessage::ScmRights(fds) => held.extend(fds),
                    _ => {}
                }
            }
            let n = n.min(buf.len());
            out.push(Datagram {
                sender,
                notices: parse(&buf[..n]),
            });
        }
        (out, held)
    }
}

/// The notices in one datagram: newline-separated `KEY=VALUE` assignments. Unknown keys and
/// malformed values are ignored, as systemd does.
pub fn parse(datagram: &[u8]) -> Vec<Notice> {
    datagram
        .split(|b| *b == b'\n')
        .filter_map(|line| match line {
            b"READY=1" => Some(Notice::Ready),
            b"STOPPING=1" => Some(Notice::Stopping),
            b"WATCHDOG=1" => Some(Notice::Watchdog),
            _ => {
                if let Some(v) = line.strip_prefix(b"STATUS=") {
                    Some(Notice::Status(String::from_utf8_lossy(v).into_owned()))
                } else if let Some(v) = line.strip_prefix(b"EXTEND_TIMEOUT_USEC=") {
                    std::str::from_utf8(v)
                        .ok()?
                        .parse::<u64>()
                        .ok()
                        .map(|us| Notice::ExtendTimeout(Duration::from_micros(us)))
                } else {
                    None
                }
            }
        })
        .collect()
}

/// Our own supervisor's socket, from `NOTIFY_SOCKET` at start (removed from the environment so
/// the child does not inherit it by accident).
pub struct Supervisor {
    sock: UnixDatagram,
    addr: SocketAddr,
}

impl Supervisor {
    /// Takes `NOTIFY_SOCKET` from the environment, if set and usable.
    pub fn from_env() -> Option<Supervisor> {
        let value = std::env::var_os("NOTIFY_SOCKET")?;
        let bytes = value.as_encoded_bytes();
        let addr = if let Some(abs) = bytes.strip_prefix(b"@") {
            SocketAddr::from_abstract_name(abs).ok()?
        } else {
            SocketAddr::from_pathname(Path::new(&value)).ok()?
        };
        let sock = UnixDatagram::unbound().ok()?;
        // Card T5: a supervisor that is slow or full never stalls the owner.
        sock.set_nonblocking(true).ok()?;
        Some(Supervisor { sock, addr })
    }

    /// Sends one notification (`READY=1`, `STOPPING=1`, `STATUS=...`) without blocking; errors
    /// (`EAGAIN` for a full queue, `ENOENT`/`ECONNREFUSED` for a missing socket) are reported to
    /// the caller, who logs them: a missing or stuck supervisor must not stop the owner.
    pub fn send(&self, text: &str) -> io::Result<()> {
        self.sock
            .send_to_addr(text.as_bytes(), &self.addr)
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Card D4: the datagram parser accepts the sd_notify assignments tenure acts on.
    #[test]
    fn d4_parse_notify_datagrams() {
        assert_eq!(
            parse(b"STATUS=warming\nREADY=1\nMAINPID=4"),
            vec![Notice::Status("warming".into()), Notice::Ready]
        );
        assert_eq!(parse(b"STOPPING=1\n"), vec![Notice::Stopping]);
        assert_eq!(
            parse(b"WATCHDOG=1\nEXTEND_TIMEOUT_USEC=1500000\nEXTEND_TIMEOUT_USEC=x"),
            vec![
                Notice::Watchdog,
                Notice::ExtendTimeout(Duration::from_millis(1500))
            ]
        );
        assert!(parse(b"READY=0").is_empty());
        assert_eq!(
            Notice::ExtendTimeout(Duration::from_secs(2)).relayed(),
            Some("EXTEND_TIMEOUT_USEC=2000000".into())
        );
        assert_eq!(Notice::Ready.relayed(), None);
    }

    /// Cards D4, T5: a datagram on the bound socket is read back with its sender's pid.
    #[test]
    fn d4_socket_round_trip_names_the_sender() {
        let s = NotifySocket::bind().unwrap();
        let v = s.env_value();
        let name = v.to_str().unwrap().strip_prefix('@').unwrap().to_string();
        let client = UnixDatagram::unbound().unwrap();
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        // A local datagram is queued on the receiver before `send_to` returns.
        client.send_to_addr(b"READY=1", &addr).unwrap();
        assert_eq!(
            s.take(),
            vec![Datagram {
                sender: Some(std::process::id()),
                notices: vec![Notice::Ready]
            }]
        );
    }
}
