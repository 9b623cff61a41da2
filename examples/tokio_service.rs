//! Embedding tenure in a tokio service: a small key-value server over TCP that owns a state
//! dir, recovers its table from the last checkpoint, serves each request inside a residency,
//! and on SIGTERM or SIGINT drains, publishes the table as the next checkpoint and releases.
//!
//! ```text
//! cargo run --example tokio_service -- /tmp/kv-state
//! # prints `listening on 127.0.0.1:PORT`; one request per line:
//! #   PUT key value  ->  OK
//! #   GET key        ->  VALUE value | NONE
//! #   COUNT          ->  N
//! kill -TERM <pid>   # drains, publishes, exits 143
//! ```
//!
//! What a tokio host must do itself, and how this example does it:
//! - Taking the lease may wait (another owner holds it), so `acquire` runs on the blocking
//!   pool (`spawn_blocking`), cancellable through an eventfd that the signal task writes to:
//!   a SIGTERM while waiting ends the wait at once, with nothing changed (card G1).
//! - The `Host` handle is wired to the signals: `host.stop(SIGTERM)` begins the drain exactly
//!   once, from any task (card H2).
//! - Every request holds an active residency (`host.enter`): once the drain has begun, new
//!   requests are refused with `draining` (card H1), and the close waits for the requests in
//!   flight before it takes the table's snapshot (card H3).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tenure::machine::{OpClass, ResidencyKind, Signal};
use tenure::{CheckpointFile, Host, Options, Recovered, Tenure, TenureError, WaitBound};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};

/// The table, shared by the request tasks.
type Table = Arc<Mutex<BTreeMap<String, String>>>;

/// The checkpoint file that holds the table.
const TABLE_FILE: &str = "table.json";

#[tokio::main]
async fn main() -> Result<std::process::ExitCode, Box<dyn std::error::Error + Send + Sync>> {
    let dir = std::env::args_os()
        .nth(1)
        .ok_or("usage: tokio_service STATE_DIR")?;
    let cold = Tenure::open(&dir, Options::default())?;
    let host = cold.host();

    // SIGTERM and SIGINT: cancel a lease wait (the eventfd) and begin the drain (the host).
    let cancel: Arc<OwnedFd> = Arc::new(rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC,
    )?);
    {
        let (host, cancel) = (host.clone(), cancel.clone());
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::spawn(async move {
            loop {
                let sig = tokio::select! {
                    _ = term.recv() => Signal::Term,
                    _ = int.recv() => Signal::Int,
                };
                let _ = rustix::io::write(&*cancel, &1u64.to_ne_bytes());
                host.stop(sig);
            }
        });
    }

    // Taking the lease may block: on the blocking pool, cancellable.
    let recovering = tokio::task::spawn_blocking(move || {
        cold.acquire_cancellable(WaitBound::Forever, Some(cancel.as_fd()))
    })
    .await??;
    let table: Table = Arc::new(Mutex::new(match recovering.read(TABLE_FILE)? {
        Some(bytes) => serde_json::from_slice(&bytes)?,
        None => BTreeMap::new(),
    }));
    let ready = match recovering.recovered()? {
        Recovered::Ready(r) => r,
        // A stop arrived while recovering: close at once, publishing nothing new.
        Recovered::Draining(d) => {
            let released = tokio::task::spawn_blocking(move || d.close(Vec::new())).await??;
            return Ok(released.outcome.code().into());
        }
    };
    let epoch = ready.epoch();

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on {} (epoch {epoch})", listener.local_addr()?);

    // Serve until the drain begins: the blocking wait for it runs beside the accept loop.
    let mut drain = tokio::task::spawn_blocking(move || ready.wait_for_drain());
    let draining = loop {
        tokio::select! {
            d = &mut drain => break d??,
            conn = listener.accept() => {
                let (stream, _) = conn?;
                tokio::spawn(serve(stream, host.clone(), table.clone()));
            }
        }
    };
    drop(listener);

    // Close: wait for the requests in flight, snapshot the table, publish, release.
    let grace = Options::default().grace;
    let released = tokio::task::spawn_blocking(move || {
        let mut draining = draining;
        loop {
            host.wait_settled(Some(Instant::now() + grace));
            let snapshot = serde_json::to_vec(&*table.lock().unwrap()).expect("a map serialises");
            match draining.close([CheckpointFile::new(TABLE_FILE, snapshot)]) {
                Err(TenureError::Unsettled(u)) => {
                    eprintln!("{u}; waiting more");
                    draining = u.tenure;
                }
                other => break other,
            }
        }
    })
    .await??;
    println!(
        "released epoch {} ({}); checkpoint {}",
        released.epoch,
        released.outcome.summary(),
        released
            .published
            .map_or_else(|| "unchanged".to_owned(), |c| c.get().to_string())
    );
    Ok(released.outcome.code().into())
}

/// One connection: a request per line, each inside an active residency.
async fn serve(stream: TcpStream, host: Host, table: Table) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = match host.enter(OpClass::Serve, ResidencyKind::Active) {
            Err(refused) => format!("ERR {refused}"),
            // The residency ends with this arm, before the reply is written: a slow client
            // never holds up the drain.
            Ok(_residency) => {
                let mut words = line.splitn(3, ' ');
                let mut t = table.lock().unwrap();
                match (words.next(), words.next(), words.next()) {
                    (Some("PUT"), Some(k), Some(v)) => {
                        t.insert(k.to_owned(), v.to_owned());
                        "OK".to_owned()
                    }
                    (Some("GET"), Some(k), None) => match t.get(k) {
                        Some(v) => format!("VALUE {v}"),
                        None => "NONE".to_owned(),
                    },
                    (Some("COUNT"), None, None) => t.len().to_string(),
                    _ => "ERR expected PUT key value, GET key or COUNT".to_owned(),
                }
            }
        };
        if write
            .write_all(format!("{reply}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}
