//! Readiness over the sd_notify datagram protocol (card D4), in both directions: a socket the
//! child reports `READY=1`/`STOPPING=1` on (its `NOTIFY_SOCKET`), and our own report to the
//! supervisor that started us when it set `NOTIFY_SOCKET` (so a systemd `Type=notify` unit can
//! wrap `tenure run` unchanged).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;

/// What the child said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// `READY=1`.
    Ready,
    /// `STOPPING=1`.
    Stopping,
}

/// The socket the child notifies. It lives in the abstract namespace under a random 128-bit
/// name (no file to clean up, no path-length limit); only the child is told the name.
pub struct NotifySocket {
    sock: UnixDatagram,
    name: String,
}

impl NotifySocket {
    /// Binds a fresh socket.
    pub fn bind() -> io::Result<NotifySocket> {
        let mut r = [0u8; 16];
        crate::privfs::random_bytes(&mut r).map_err(io::Error::other)?;
        let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("tenure/notify/{hex}");
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let sock = UnixDatagram::bind_addr(&addr)?;
        sock.set_nonblocking(true)?;
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

    /// Reads every waiting datagram and returns the notices they carry, in order.
    pub fn take(&self) -> Vec<Notice> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = self.sock.recv(&mut buf) {
            out.extend(parse(&buf[..n]));
        }
        out
    }
}

/// The notices in one datagram: newline-separated `KEY=VALUE` assignments.
pub fn parse(datagram: &[u8]) -> Vec<Notice> {
    datagram
        .split(|b| *b == b'\n')
        .filter_map(|line| match line {
            b"READY=1" => Some(Notice::Ready),
            b"STOPPING=1" => Some(Notice::Stopping),
            _ => None,
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
        Some(Supervisor { sock, addr })
    }

    /// Sends one notification (`READY=1`, `STOPPING=1`, `STATUS=...`); errors are reported to
    /// the caller, who logs them: a missing supervisor must not stop the owner.
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
        assert_eq!(parse(b"READY=1"), vec![Notice::Ready]);
        assert_eq!(
            parse(b"STATUS=warming\nREADY=1\nMAINPID=4"),
            vec![Notice::Ready]
        );
        assert_eq!(parse(b"STOPPING=1\n"), vec![Notice::Stopping]);
        assert!(parse(b"READY=0").is_empty());
    }

    /// Card D4: a child's datagram on the bound socket is read back as a notice.
    #[test]
    fn d4_socket_round_trip() {
        let s = NotifySocket::bind().unwrap();
        let v = s.env_value();
        let name = v.to_str().unwrap().strip_prefix('@').unwrap().to_string();
        let client = UnixDatagram::unbound().unwrap();
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        // A local datagram is queued on the receiver before `send_to` returns.
        client.send_to_addr(b"READY=1", &addr).unwrap();
        assert_eq!(s.take(), vec![Notice::Ready]);
    }
}
