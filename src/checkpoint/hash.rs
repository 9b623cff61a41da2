//! Streaming sha256 over any [`Read`] with one fixed buffer, so verifying a checkpoint takes
//! the same memory whatever its size.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use super::format::Digest;

/// Size of the buffer every streaming read uses: large enough to keep sha2 at full speed on a
/// cached file, small enough that peak memory stays far below the 16 MiB target.
pub const BUF_LEN: usize = 1 << 20;

/// A freshly allocated streaming buffer of [`BUF_LEN`] bytes.
pub fn buffer() -> Vec<u8> {
    vec![0u8; BUF_LEN]
}

/// What streaming a reader found: how many bytes and their sha256.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Bytes read until end of file.
    pub size: u64,
    /// sha256 of those bytes.
    pub sha256: Digest,
}

/// Why streamed bytes do not match what a manifest promised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// The reader ended before `expected` bytes, or went on past them.
    Size {
        /// Bytes promised.
        expected: u64,
        /// Bytes found; for a longer file this is `expected + 1` because reading stops there.
        actual: u64,
    },
    /// The size matched but the digest did not.
    Digest {
        /// Digest promised.
        expected: Digest,
        /// Digest found.
        actual: Digest,
    },
}

/// Reads `r` to its end through `buf` and returns size and sha256.
pub fn digest_reader<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> io::Result<Summary> {
    let mut h = Sha256::new();
    let mut size = 0u64;
    loop {
        let n = match r.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok(Summary {
        size,
        sha256: Digest(h.finalize().into()),
    })
}

/// Streams `r` and checks it holds exactly `size` bytes with digest `sha256`. Reading stops one
/// byte past `size`, so a file that grew is caught without reading all of it.
pub fn verify_reader<R: Read + ?Sized>(
    r: &mut R,
    size: u64,
    sha256: &Digest,
    buf: &mut [u8],
) -> io::Result<Result<(), Mismatch>> {
    let mut limited = r.take(size.saturating_add(1));
    let got = digest_reader(&mut limited, buf)?;
    if got.size != size {
        return Ok(Err(Mismatch::Size {
            expected: size,
            actual: got.size,
        }));
    }
    if got.sha256 != *sha256 {
        return Ok(Err(Mismatch::Digest {
            expected: *sha256,
            actual: got.sha256,
        }));
    }
    Ok(Ok(()))
}

/// Below this size a stream is hashed on the calling thread: a helper thread costs more than
/// it saves.
pub const PIPELINE_MIN: u64 = 4 << 20;

/// Buffers in flight between the reading thread and the hashing thread (each [`BUF_LEN`]).
const PIPELINE_BUFS: usize = 3;

/// Why [`pipe`] stopped.
#[derive(Debug)]
pub enum PipeError<E> {
    /// Reading the source failed.
    Read(io::Error),
    /// The sink refused a chunk.
    Sink(E),
}

/// Streams `src` to its end (or to `limit` bytes), handing each chunk to `sink` on the calling
/// thread while a helper thread hashes the same chunks, so reading, writing and hashing
/// overlap on two cores. Memory stays fixed at `PIPELINE_BUFS` buffers of [`BUF_LEN`].
pub fn pipe<R, E, S>(src: &mut R, limit: Option<u64>, mut sink: S) -> Result<Summary, PipeError<E>>
where
    R: Read + ?Sized,
    E: Send,
    S: FnMut(&[u8], u64) -> Result<(), E>,
{
    use std::sync::mpsc::sync_channel;
    let (to_hasher, chunks) = sync_channel::<(Vec<u8>, usize)>(PIPELINE_BUFS);
    let (give_back, returned) = sync_channel::<Vec<u8>>(PIPELINE_BUFS);
    std::thread::scope(|scope| {
        let hasher = scope.spawn(move || {
            let mut h = Sha256::new();
            for (buf, n) in chunks {
                h.update(&buf[..n]);
                // The reader may have stopped early; then nobody wants the buffer back.
                let _ = give_back.send(buf);
            }
            Digest(h.finalize().into())
        });
        // The sender lives in this closure so every early return drops it and ends the
        // hasher's loop before the scope joins it.
        let mut run = move || -> Result<u64, PipeError<E>> {
            let mut spare: Vec<Vec<u8>> = (0..PIPELINE_BUFS).map(|_| buffer()).collect();
            let mut size = 0u64;
            loop {
                let mut buf = match spare.pop() {
                    Some(b) => b,
                    None => returned.recv().expect("the hasher returns every buffer"),
                };
                let want = match limit {
                    Some(l) => (l - size).min(buf.len() as u64) as usize,
                    None => buf.len(),
                };
                if want == 0 {
                    return Ok(size);
                }
                let n = loop {
                    match src.read(&mut buf[..want]) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(PipeError::Read(e)),
                    }
                };
                if n == 0 {
                    return Ok(size);
                }
                sink(&buf[..n], size).map_err(PipeError::Sink)?;
                size += n as u64;
                to_hasher
                    .send((buf, n))
                    .expect("the hasher runs until the sender is dropped");
            }
        };
        let res = run();
        // Dropping the closure drops the sender, which ends the hasher's loop.
        drop(run);
        let sha256 = hasher.join().expect("hashing does not panic");
        res.map(|size| Summary { size, sha256 })
    })
}

/// Like [`digest_reader`], hashing on a helper thread when `size_hint` is large enough to gain.
pub fn digest_fast<R: Read + ?Sized>(
    r: &mut R,
    size_hint: u64,
    buf: &mut [u8],
) -> io::Result<Summary> {
    if size_hint < PIPELINE_MIN {
        return digest_reader(r, buf);
    }
    match pipe::<_, std::convert::Infallible, _>(r, None, |_, _| Ok(())) {
        Ok(s) => Ok(s),
        Err(PipeError::Read(e)) => Err(e),
        Err(PipeError::Sink(never)) => match never {},
    }
}

/// The single-threaded form of [`pipe`] for small streams, through the caller's buffer.
pub fn copy_small<R, E, S>(
    src: &mut R,
    limit: u64,
    buf: &mut [u8],
    mut sink: S,
) -> Result<Summary, PipeError<E>>
where
    R: Read + ?Sized,
    S: FnMut(&[u8], u64) -> Result<(), E>,
{
    let mut h = Sha256::new();
    let mut size = 0u64;
    loop {
        let want = (limit - size).min(buf.len() as u64) as usize;
        if want == 0 {
            break;
        }
        let n = match src.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(PipeError::Read(e)),
        };
        sink(&buf[..n], size).map_err(PipeError::Sink)?;
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok(Summary {
        size,
        sha256: Digest(h.finalize().into()),
    })
}

/// Like [`verify_reader`], hashing on a helper thread when `size` is large enough to gain.
pub fn verify_reader_fast<R: Read + ?Sized>(
    r: &mut R,
    size: u64,
    sha256: &Digest,
    buf: &mut [u8],
) -> io::Result<Result<(), Mismatch>> {
    if size < PIPELINE_MIN {
        return verify_reader(r, size, sha256, buf);
    }
    let got = match pipe::<_, std::convert::Infallible, _>(
        r,
        Some(size.saturating_add(1)),
        |_, _| Ok(()),
    ) {
        Ok(s) => s,
        Err(PipeError::Read(e)) => return Err(e),
        Err(PipeError::Sink(never)) => match never {},
    };
    if got.size != size {
        return Ok(Err(Mismatch::Size {
            expected: size,
            actual: got.size,
        }));
    }
    if got.sha256 != *sha256 {
        return Ok(Err(Mismatch::Digest {
            expected: *sha256,
            actual: got.sha256,
        }));
    }
    Ok(Ok(()))
}

/// sha256 of a byte slice.
pub fn digest_bytes(bytes: &[u8]) -> Digest {
    Digest(Sha256::digest(bytes).into())
}

/// A reader that hashes what passes through it and, at end of file, fails with
/// [`io::ErrorKind::InvalidData`] unless exactly the promised bytes went by. A consumer that
/// reads to the end therefore never accepts a corrupt file as good.
pub struct VerifyingReader<R> {
    inner: R,
    hasher: Sha256,
    seen: u64,
    size: u64,
    sha256: Digest,
    what: String,
    done: bool,
}

impl<R: Read> VerifyingReader<R> {
    /// Wraps `inner`, which must yield `size` bytes with digest `sha256`; `what` names the file
    /// in the error.
    pub fn new(inner: R, size: u64, sha256: Digest, what: String) -> Self {
        VerifyingReader {
            inner,
            hasher: Sha256::new(),
            seen: 0,
            size,
            sha256,
            what,
            done: false,
        }
    }

    fn fail(&self, msg: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, format!("{}: {msg}", self.what))
    }
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        self.seen += n as u64;
        if self.seen > self.size {
            return Err(self.fail(format!(
                "blob size mismatch: more than the {} bytes the manifest lists",
                self.size
            )));
        }
        self.hasher.update(&buf[..n]);
        if n == 0 {
            self.done = true;
            if self.seen != self.size {
                return Err(self.fail(format!(
                    "blob size mismatch: {} bytes, the manifest lists {}",
                    self.seen, self.size
                )));
            }
            let got = Digest(std::mem::take(&mut self.hasher).finalize().into());
            if got != self.sha256 {
                return Err(self.fail(format!(
                    "blob digest mismatch: sha256 {got}, the manifest lists {}",
                    self.sha256
                )));
            }
        }
        Ok(n)
    }
}

/// A reader that hashes every byte it passes on: a manifest is parsed and digested in one
/// streaming pass.
pub struct HashingReader<R> {
    inner: R,
    h: Sha256,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            h: Sha256::new(),
        }
    }

    /// The digest of the bytes read so far.
    pub fn digest(&self) -> Digest {
        Digest(self.h.clone().finalize().into())
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.h.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn known_vectors() {
        let mut buf = [0u8; 2];
        let s = digest_reader(&mut &b"abc"[..], &mut buf).unwrap();
        assert_eq!((s.size, s.sha256.to_hex()), (3, ABC.to_string()));
        let s = digest_reader(&mut &b""[..], &mut buf).unwrap();
        assert_eq!(s.sha256.to_hex(), EMPTY);
        assert_eq!(digest_bytes(b"abc").to_hex(), ABC);
    }

    #[test]
    fn buffer_size_does_not_change_the_digest() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let want = digest_bytes(&data);
        for len in [1, 7, 4096, BUF_LEN] {
            let mut buf = vec![0; len];
            assert_eq!(
                digest_reader(&mut &data[..], &mut buf).unwrap().sha256,
                want
            );
        }
    }

    #[test]
    fn verify_names_size_and_digest_mismatches() {
        let mut buf = [0u8; 8];
        let abc: Digest = ABC.parse().unwrap();
        assert_eq!(
            verify_reader(&mut &b"abc"[..], 3, &abc, &mut buf).unwrap(),
            Ok(())
        );
        assert_eq!(
            verify_reader(&mut &b"ab"[..], 3, &abc, &mut buf).unwrap(),
            Err(Mismatch::Size {
                expected: 3,
                actual: 2
            })
        );
        assert_eq!(
            verify_reader(&mut &b"abcdefgh"[..], 3, &abc, &mut buf).unwrap(),
            Err(Mismatch::Size {
                expected: 3,
                actual: 4
            })
        );
        assert!(matches!(
            verify_reader(&mut &b"abd"[..], 3, &abc, &mut buf).unwrap(),
            Err(Mismatch::Digest { .. })
        ));
    }

    #[test]
    fn pipe_hashes_what_it_hands_to_the_sink() {
        let data: Vec<u8> = (0..(3 * BUF_LEN + 12345) as u32)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut seen = Vec::new();
        let s = pipe::<_, (), _>(&mut &data[..], None, |chunk, off| {
            assert_eq!(off as usize, seen.len());
            seen.extend_from_slice(chunk);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, data);
        assert_eq!((s.size, s.sha256), (data.len() as u64, digest_bytes(&data)));
        // A limit stops reading there.
        let s = pipe::<_, (), _>(&mut &data[..], Some(10), |_, _| Ok(())).unwrap();
        assert_eq!((s.size, s.sha256), (10, digest_bytes(&data[..10])));
        // A sink error stops the stream and is returned.
        let e = pipe(&mut &data[..], None, |_, off| {
            if off > 0 { Err("full") } else { Ok(()) }
        });
        assert!(matches!(e, Err(PipeError::Sink("full"))));
        // The pipelined verifier agrees with the plain one.
        let mut buf = buffer();
        let d = digest_bytes(&data);
        let n = data.len() as u64;
        assert_eq!(
            verify_reader_fast(&mut &data[..], n, &d, &mut buf).unwrap(),
            Ok(())
        );
        let big = vec![1u8; PIPELINE_MIN as usize + 5];
        let bd = digest_bytes(&big);
        assert_eq!(
            verify_reader_fast(&mut &big[..], big.len() as u64, &bd, &mut buf).unwrap(),
            Ok(())
        );
        assert!(matches!(
            verify_reader_fast(&mut &big[..], big.len() as u64 - 1, &bd, &mut buf).unwrap(),
            Err(Mismatch::Size { .. })
        ));
        let mut bad = big.clone();
        bad[PIPELINE_MIN as usize] ^= 1;
        assert!(matches!(
            verify_reader_fast(&mut &bad[..], big.len() as u64, &bd, &mut buf).unwrap(),
            Err(Mismatch::Digest { .. })
        ));
    }

    #[test]
    fn verifying_reader_fails_at_eof_on_bad_bytes() {
        let abc: Digest = ABC.parse().unwrap();
        let mut out = Vec::new();
        VerifyingReader::new(&b"abc"[..], 3, abc, "x".into())
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"abc");
        for bad in [&b"abd"[..], b"ab", b"abcd"] {
            let e = VerifyingReader::new(bad, 3, abc, "blobs/x".into())
                .read_to_end(&mut Vec::new())
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().starts_with("blobs/x: blob "), "{e}");
        }
    }
}
