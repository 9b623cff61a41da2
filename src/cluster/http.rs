//! A small blocking HTTP/1.1 client for etcd's JSON gateway: one `POST` of a JSON body per
//! connection (`Connection: close`), a whole response (`Content-Length` or chunked) or a
//! stream of JSON messages (the gateway's server streams: watch, keep-alive) read as they come.
//!
//! It speaks plain HTTP only (no TLS): the cluster's client port on a trusted network or
//! loopback, as the issue asks; a deadline bounds every call, so a member that stopped answering
//! (killed, partitioned, without quorum) costs at most the call's timeout.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The largest response or message accepted (etcd answers in a few hundred bytes).
const MAX_BODY: usize = 4 << 20;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// No connection could be made, or it broke, or the deadline passed: try another member.
    #[error("cannot reach {endpoint}: {source}")]
    Unreachable {
        /// `host:port`.
        endpoint: String,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The answer is not HTTP as the gateway speaks it.
    #[error("{endpoint} answered something that is not etcd's JSON gateway: {what}")]
    Protocol {
        /// `host:port`.
        endpoint: String,
        /// What was wrong.
        what: String,
    },
}

impl HttpError {
    fn protocol(endpoint: &str, what: impl Into<String>) -> HttpError {
        HttpError::Protocol {
            endpoint: endpoint.to_string(),
            what: what.into(),
        }
    }
}

/// Resolves `host:port` (the first address) within `deadline`: an IP address at once; a host
/// name on a helper thread, since the system's resolver has no deadline of its own (a thread
/// left waiting on a dead DNS server ends when the resolver gives up).
fn resolve(endpoint: &str, deadline: Instant) -> io::Result<SocketAddr> {
    if let Ok(addr) = endpoint.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = endpoint.to_string();
    std::thread::Builder::new()
        .name("tenure-resolve".into())
        .spawn(move || {
            let _ = tx.send(name.to_socket_addrs().map(|mut a| a.next()));
        })?;
    let t = left(deadline)?;
    match rx.recv_timeout(t) {
        Ok(Ok(Some(addr))) => Ok(addr),
        Ok(Ok(None)) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{endpoint} resolves to no address"),
        )),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the name did not resolve within {} ms", t.as_millis()),
        )),
    }
}

/// What remains of `deadline`, at least a millisecond (a zero timeout means "none" to std).
fn left(deadline: Instant) -> io::Result<Duration> {
    let now = Instant::now();
    if now >= deadline {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
    }
    Ok((deadline - now).max(Duration::from_millis(1)))
}

/// A read or write timeout reads as `EAGAIN` ("Resource temporarily unavailable") on Linux,
/// which says nothing to an operator: it is a member that did not answer within `waited`
/// (busy, without a leader, or paused), told as such.
fn quiet(e: io::Error, waited: Duration) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {} ms", waited.as_millis()),
        ),
        _ => e,
    }
}

/// An open response: the status, and the body being read.
pub struct Response {
    endpoint: String,
    stream: TcpStream,
    /// Bytes read past what was consumed.
    buf: Vec<u8>,
    /// The body's framing.
    framing: Framing,
    /// Decoded body bytes not yet handed out as a message.
    body: Vec<u8>,
    /// The HTTP status.
    pub status: u16,
}

enum Framing {
    Length(usize),
    Chunked { done: bool },
    Close { done: bool },
}

/// Sends `POST path` with a JSON `body` to `endpoint` and reads the response headers, within
/// `deadline`.
pub fn post(
    endpoint: &str,
    path: &str,
    body: &[u8],
    deadline: Instant,
) -> Result<Response, HttpError> {
    let unreachable = |source| HttpError::Unreachable {
        endpoint: endpoint.to_string(),
        source,
    };
    let addr = resolve(endpoint, deadline).map_err(unreachable)?;
    let t = left(deadline).map_err(unreachable)?;
    let stream = TcpStream::connect_timeout(&addr, t).map_err(|e| unreachable(quiet(e, t)))?;
    let _ = stream.set_nodelay(true);
    let mut r = Response {
        endpoint: endpoint.to_string(),
        stream,
        buf: Vec::new(),
        framing: Framing::Close { done: false },
        body: Vec::new(),
        status: 0,
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut req = head.into_bytes();
    req.extend_from_slice(body);
    let t = left(deadline).map_err(unreachable)?;
    r.stream.set_write_timeout(Some(t)).map_err(unreachable)?;
    r.stream
        .write_all(&req)
        .map_err(|e| unreachable(quiet(e, t)))?;
    r.read_head(deadline)?;
    Ok(r)
}

impl Response {
    fn unreachable(&self, source: io::Error) -> HttpError {
        HttpError::Unreachable {
            endpoint: self.endpoint.clone(),
            source,
        }
    }

    /// Reads more bytes into `buf`; `false` at the end of the stream.
    fn fill(&mut self, deadline: Instant) -> Result<bool, HttpError> {
        let t = left(deadline).map_err(|e| self.unreachable(e))?;
        self.stream
            .set_read_timeout(Some(t))
            .map_err(|e| self.unreachable(e))?;
        let mut chunk = [0u8; 8192];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if self.buf.len() > MAX_BODY {
                        return Err(HttpError::protocol(&self.endpoint, "response too large"));
                    }
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.unreachable(quiet(e, t))),
            }
        }
    }

    fn read_head(&mut self, deadline: Instant) -> Result<(), HttpError> {
        let end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if !self.fill(deadline)? {
                return Err(self.unreachable(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed before the response headers",
                )));
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        self.status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                HttpError::protocol(&self.endpoint, format!("status line {status_line:?}"))
            })?;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                let n = value.parse().map_err(|_| {
                    HttpError::protocol(&self.endpoint, format!("content-length {value:?}"))
                })?;
                self.framing = Framing::Length(n);
            } else if name.eq_ignore_ascii_case("transfer-encoding")
                && value.eq_ignore_ascii_case("chunked")
            {
                self.framing = Framing::Chunked { done: false };
            }
        }
        Ok(())
    }

    /// Decodes what `buf` holds into `body`; `false` when the body is complete.
    fn decode(&mut self) -> Result<bool, HttpError> {
        match &mut self.framing {
            Framing::Length(n) => {
                let take = (*n).min(self.buf.len());
                self.body.extend(self.buf.drain(..take));
                *n -= take;
                Ok(*n > 0)
            }
            Framing::Close { done } => {
                self.body.append(&mut self.buf);
                Ok(!*done)
            }
            Framing::Chunked { done } => {
                while !*done {
                    let Some(eol) = find(&self.buf, b"\r\n") else {
                        break;
                    };
                    let size_text = String::from_utf8_lossy(&self.buf[..eol]).into_owned();
                    let size_text = size_text.split(';').next().unwrap_or_default().trim();
                    let size = usize::from_str_radix(size_text, 16).map_err(|_| {
                        HttpError::protocol(&self.endpoint, format!("chunk size {size_text:?}"))
                    })?;
                    if self.buf.len() < eol + 2 + size + 2 {
                        break;
                    }
                    if size == 0 {
                        *done = true;
                        self.buf.clear();
                        break;
                    }
                    self.body
                        .extend_from_slice(&self.buf[eol + 2..eol + 2 + size]);
                    self.buf.drain(..eol + 2 + size + 2);
                }
                Ok(!*done)
            }
        }
    }

    /// Reads the whole body.
    pub fn body(mut self, deadline: Instant) -> Result<Vec<u8>, HttpError> {
        while self.decode()? {
            if !self.fill(deadline)? {
                match self.framing {
                    Framing::Close { ref mut done } => *done = true,
                    Framing::Length(_) | Framing::Chunked { .. } => {
                        return Err(self.unreachable(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the connection closed in the middle of the response",
                        )));
                    }
                }
            }
        }
        Ok(self.body)
    }

    /// The next JSON message of a streamed body, waiting until `deadline`: `Ok(None)` when the
    /// stream ended; an error of kind `TimedOut` (as [`HttpError::Unreachable`], see
    /// [`timed_out`]) when nothing came in time — the stream stays usable then.
    pub fn next_message(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<serde_json::Value>, HttpError> {
        loop {
            let more = self.decode()?;
            let mut values =
                serde_json::Deserializer::from_slice(&self.body).into_iter::<serde_json::Value>();
            match values.next() {
                Some(Ok(v)) => {
                    let used = values.byte_offset();
                    self.body.drain(..used);
                    return Ok(Some(v));
                }
                Some(Err(e)) if !e.is_eof() => {
                    return Err(HttpError::protocol(
                        &self.endpoint,
                        format!("a streamed message is not JSON: {e}"),
                    ));
                }
                Some(Err(_)) | None => {}
            }
            if !more {
                return Ok(None);
            }
            if !self.fill(deadline)? {
                return Ok(None);
            }
        }
    }
}

/// Whether a call failed only because nothing came before its deadline.
pub fn timed_out(e: &HttpError) -> bool {
    matches!(e, HttpError::Unreachable { source, .. }
        if matches!(source.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Serves one canned response to one request, on a loopback port.
    fn serve(response: &'static [u8]) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = [0u8; 4096];
            let _ = s.read(&mut req);
            // Dribble the response in small pieces: the reader must reassemble them.
            for piece in response.chunks(7) {
                s.write_all(piece).unwrap();
                s.flush().unwrap();
            }
        });
        addr
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn reads_a_content_length_body() {
        let ep = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{\"a\":\"1\"}\n");
        let r = post(&ep, "/v3/kv/range", b"{}", deadline()).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body(deadline()).unwrap(), b"{\"a\":\"1\"}\n");
    }

    #[test]
    fn reads_a_chunked_stream_message_by_message() {
        let ep = serve(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n7\r\n1}\n{\"b\"\r\n4\r\n:2}\n\r\n0\r\n\r\n",
        );
        let mut r = post(&ep, "/v3/watch", b"{}", deadline()).unwrap();
        assert_eq!(r.next_message(deadline()).unwrap().unwrap()["a"], 1);
        assert_eq!(r.next_message(deadline()).unwrap().unwrap()["b"], 2);
        assert!(r.next_message(deadline()).unwrap().is_none());
    }

    #[test]
    fn a_closed_port_is_unreachable_and_a_silent_server_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ep = l.local_addr().unwrap().to_string();
        drop(l);
        assert!(matches!(
            post(&ep, "/", b"{}", deadline()),
            Err(HttpError::Unreachable { .. })
        ));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ep = l.local_addr().unwrap().to_string();
        let e = post(&ep, "/", b"{}", Instant::now() + Duration::from_millis(200))
            .err()
            .unwrap();
        assert!(timed_out(&e), "{e}");
        // Not the OS's "Resource temporarily unavailable" of an expired socket timeout.
        assert!(e.to_string().contains("no answer within"), "{e}");
        drop(l);
    }
}
