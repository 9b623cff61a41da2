//! A minimal cache daemon on the typed lifecycle (`Tenure<Cold> → Tenure<Recovering> →
//! Tenure<Ready> → Tenure<Draining> → Released`), with plain threads: it owns a state dir,
//! recovers its entries from the last checkpoint (one file per key), serves them over TCP, and
//! exits by itself once it has been idle for a while — or drains on SIGTERM/SIGINT — publishing
//! its entries as the next checkpoint before it lets go of the dir.
//!
//! ```text
//! cargo run --example cache_daemon -- /tmp/cache-state 5
//! # prints `listening on 127.0.0.1:PORT`; one request per line:
//! #   SET key value  ->  OK
//! #   GET key        ->  VALUE value | MISS
//! # exits 0 after 5 s without a request (an ephemeral owner, card H3), or 143 on SIGTERM
//! ```
//!
//! Each request holds an active residency, so the idle exit never cuts one short, and the drain
//! waits for the requests in flight before the entries are snapshotted. A second daemon started
//! on the same dir while the first runs waits up to 10 s for it, then gives up (`busy`, card
//! L2); started afterwards, it serves what the first one published.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure::machine::{OpClass, ResidencyKind, RetireMode, Signal};
use tenure::{CheckpointFile, Host, Options, Recovered, Tenure, TenureError, WaitBound};

/// Where each entry lives in the checkpoint: `entries/<key>`.
const PREFIX: &str = "entries/";

type Entries = Arc<Mutex<BTreeMap<String, Vec<u8>>>>;

fn main() -> Result<std::process::ExitCode, Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let dir = args
        .next()
        .ok_or("usage: cache_daemon STATE_DIR [IDLE_SECONDS]")?;
    let idle: f64 = match args.next() {
        Some(s) => s.to_str().ok_or("IDLE_SECONDS must be a number")?.parse()?,
        None => 30.0,
    };
    let options = Options {
        retire: RetireMode::Ephemeral,
        idle_grace: Duration::from_secs_f64(idle),
        ..Options::default()
    };
    let cold = Tenure::open(&dir, options)?;
    let host = cold.host();

    // Stop signals go to the host, which begins the drain exactly once.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    {
        let host = host.clone();
        std::thread::spawn(move || {
            for s in signals.forever() {
                host.stop(if s == signal_hook::consts::SIGINT {
                    Signal::Int
                } else {
                    Signal::Term
                });
            }
        });
    }

    let recovering = cold.acquire(WaitBound::For(Duration::from_secs(10)))?;
    let mut recovered = BTreeMap::new();
    let names: Vec<String> = recovering
        .checkpoint()
        .map(|c| c.entries.iter().map(|e| e.name.clone()).collect())
        .unwrap_or_default();
    for name in names {
        if let (Some(key), Some(bytes)) = (name.strip_prefix(PREFIX), recovering.read(&name)?) {
            recovered.insert(key.to_owned(), bytes);
        }
    }
    eprintln!(
        "epoch {}: recovered {} entries",
        recovering.epoch(),
        recovered.len()
    );
    let entries: Entries = Arc::new(Mutex::new(recovered));
    let draining = match recovering.recovered()? {
        Recovered::Draining(d) => d,
        Recovered::Ready(ready) => {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let addr = listener.local_addr()?;
            println!("listening on {addr}");
            let stopping = Arc::new(AtomicBool::new(false));
            let acceptor = {
                let (host, entries, stopping) = (host.clone(), entries.clone(), stopping.clone());
                std::thread::spawn(move || {
                    for conn in listener.incoming() {
                        if stopping.load(Ordering::SeqCst) {
                            break;
                        }
                        if let Ok(stream) = conn {
                            let (host, entries) = (host.clone(), entries.clone());
                            std::thread::spawn(move || serve(stream, &host, &entries));
                        }
                    }
                })
            };
            // Until a stop signal, or until idle for the grace with no request in flight.
            let draining = ready.wait_for_drain()?;
            stopping.store(true, Ordering::SeqCst);
            // Wake the acceptor so that it sees the flag.
            let _ = TcpStream::connect(addr);
            let _ = acceptor.join();
            draining
        }
    };

    // Close: wait for the requests in flight, then publish every entry and release.
    let grace = Options::default().grace;
    let mut draining = draining;
    let released = loop {
        host.wait_settled(Some(Instant::now() + grace));
        let files: Vec<CheckpointFile> = entries
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| CheckpointFile::new(format!("{PREFIX}{k}"), v.clone()))
            .collect();
        match draining.close(files) {
            Err(TenureError::Unsettled(u)) => {
                eprintln!("{u}; waiting more");
                draining = u.tenure;
            }
            // The publish failed (a full disk, say): the entries come back with the error and
            // are kept beside the state dir instead, so that none is lost (card P1).
            Err(TenureError::Publish(p)) => {
                eprintln!("{p}");
                let mut aside = dir.clone();
                aside.push(".unpublished");
                let aside = std::path::PathBuf::from(aside);
                for f in p.into_files() {
                    let path = aside.join(&f.name);
                    std::fs::create_dir_all(path.parent().unwrap_or(&aside))?;
                    std::fs::write(&path, &f.bytes)?;
                }
                eprintln!("the entries were kept in {}", aside.display());
                return Ok(std::process::ExitCode::from(74));
            }
            other => break other?,
        }
    };
    eprintln!(
        "released epoch {} ({}); checkpoint {}",
        released.epoch,
        released.outcome.summary(),
        released
            .published
            .map_or_else(|| "unchanged".to_owned(), |c| c.get().to_string())
    );
    Ok(released.outcome.code().into())
}

/// A key that is also a valid checkpoint entry name.
fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 128
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// One connection: a request per line, each inside an active residency.
fn serve(stream: TcpStream, host: &Host, entries: &Entries) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let reply = match host.enter(OpClass::Serve, ResidencyKind::Active) {
            Err(refused) => format!("ERR {refused}"),
            Ok(_residency) => {
                let mut words = line.splitn(3, ' ');
                match (words.next(), words.next(), words.next()) {
                    (Some("SET"), Some(k), Some(v)) if valid_key(k) => {
                        entries
                            .lock()
                            .unwrap()
                            .insert(k.to_owned(), v.as_bytes().to_vec());
                        "OK".to_owned()
                    }
                    (Some("GET"), Some(k), None) => match entries.lock().unwrap().get(k) {
                        Some(v) => format!("VALUE {}", String::from_utf8_lossy(v)),
                        None => "MISS".to_owned(),
                    },
                    _ => "ERR expected SET key value (key: letters, digits, - and _) or GET key"
                        .to_owned(),
                }
            }
        };
        if out.write_all(format!("{reply}\n").as_bytes()).is_err() {
            return;
        }
    }
}
