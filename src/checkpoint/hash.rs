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
