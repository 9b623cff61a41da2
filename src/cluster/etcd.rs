//! An etcd v3 client over etcd's JSON gRPC gateway (`/v3/...` on the client port, served by
//! every etcd since 3.3): the calls the cluster lease needs — lease grant, keep-alive and
//! revoke, range, transactions with compares on create revisions, and a watch — each a
//! blocking `POST` with a deadline, tried on the cluster's members in turn until one answers.
//!
//! Why the gateway and not the `etcd-client` crate (tonic): see spec/cluster.md, "The etcd
//! client". In short: the runner is a blocking event loop that needs a handful of calls, not an
//! async runtime; the gateway costs one dependency (`base64`) against ~100 crates and a `protoc`
//! build step, a call is one loopback TCP connection, and the gateway streams watches and
//! keep-alives as well.
//!
//! Keys and values travel base64-encoded and 64-bit numbers as decimal strings, as the gateway's
//! JSON mapping of the protobuf messages has it; a field at its zero value is left out of an
//! answer (`succeeded: false` is absent), so every read here defaults it.

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use super::http::{self, Response};

/// Why an etcd call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// No member answered within the deadline (all unreachable, or none had a leader).
    #[error(
        "no etcd member answered ({endpoints}): {last}; check that the cluster runs and has a quorum"
    )]
    Unavailable {
        /// The members tried.
        endpoints: String,
        /// The last failure.
        last: String,
    },
    /// A member answered with an error that another member would give too.
    #[error("etcd refused the request: {message} (code {code})")]
    Refused {
        /// The gRPC status code.
        code: i64,
        /// etcd's message.
        message: String,
    },
    /// The answer lacks a field it must have.
    #[error("etcd answered {what}; this client speaks etcd v3.3 or later")]
    Unexpected {
        /// What was wrong.
        what: String,
    },
}

/// A key-value pair as etcd keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision that created the key (its current incarnation).
    pub create_revision: i64,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// A comparison of a transaction.
#[derive(Debug, Clone)]
pub enum Compare {
    /// The key's create revision equals this (0: the key does not exist).
    CreateRevision(Vec<u8>, i64),
}

/// An operation of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    /// Put a value, attached to a lease (0: none).
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The lease.
        lease: i64,
    },
    /// Read a key.
    Get(Vec<u8>),
    /// Delete a key.
    Delete(Vec<u8>),
}

/// What a transaction did.
#[derive(Debug, Clone)]
pub struct TxnResult {
    /// Whether every compare held (the success branch ran).
    pub succeeded: bool,
    /// The store's revision after the transaction (the revision of its writes, if it wrote).
    pub revision: i64,
    /// The key-value pairs the branch's reads returned, in order.
    pub kvs: Vec<Kv>,
}

/// A watch event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was put.
    Put(Kv),
    /// The key was deleted (or its lease expired) at this revision.
    Delete {
        /// The key.
        key: Vec<u8>,
        /// The revision of the deletion.
        revision: i64,
    },
}

/// A client of one etcd cluster: its members' client endpoints (`host:port`), tried in turn
/// from the last one that answered.
#[derive(Debug, Clone)]
pub struct Etcd {
    endpoints: Vec<String>,
    /// The member that answered last, tried first.
    preferred: std::cell::Cell<usize>,
    /// The deadline of one call on one member.
    pub timeout: Duration,
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

fn num(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => 0,
    }
}

/// A `uint64` (member ids use the whole range).
fn unum(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => 0,
    }
}

fn bytes(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| B64.decode(s).ok())
        .unwrap_or_default()
}

fn kv_of(v: &Value) -> Kv {
    Kv {
        key: bytes(&v["key"]),
        value: bytes(&v["value"]),
        create_revision: num(&v["create_revision"]),
        mod_revision: num(&v["mod_revision"]),
        lease: num(&v["lease"]),
    }
}

fn revision(v: &Value) -> i64 {
    num(&v["header"]["revision"])
}

/// A gRPC code etcd gives when this member cannot serve now but another may (no leader,
/// timed out waiting for raft, unavailable, aborted by a leader change).
fn retriable(code: i64) -> bool {
    matches!(code, 4 | 10 | 14)
}

impl Etcd {
    /// A client of the members at `endpoints` (`host:port` each).
    pub fn new(endpoints: Vec<String>, timeout: Duration) -> Etcd {
        Etcd {
            endpoints,
            preferred: std::cell::Cell::new(0),
            timeout,
        }
    }

    /// The members' endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The members in the order they are tried.
    fn order(&self) -> impl Iterator<Item = (usize, &String)> {
        let n = self.endpoints.len();
        let first = self.preferred.get() % n.max(1);
        (0..n).map(move |i| {
            let j = (first + i) % n;
            (j, &self.endpoints[j])
        })
    }

    fn unavailable(&self, last: String) -> EtcdError {
        EtcdError::Unavailable {
            endpoints: self.endpoints.join(","),
            last,
        }
    }

    /// One unary call: the first member that answers decides; a member that cannot be reached
    /// or cannot serve now hands the call to the next. Every member is tried at most once, each
    /// for at most [`Etcd::timeout`].
    pub fn call(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        self.call_by(path, body, None)
    }

    /// [`Etcd::call`], ending by `overall` at the latest however many members are left to try
    /// (the keep-alive must know by its lease's end whether the renewal came through).
    pub fn call_by(
        &self,
        path: &str,
        body: &Value,
        overall: Option<Instant>,
    ) -> Result<Value, EtcdError> {
        let body = serde_json::to_vec(body).expect("JSON values serialise");
        let mut last = String::from("no member configured");
        let n = self.endpoints.len();
        for (tried, (i, ep)) in self.order().enumerate() {
            let mut deadline = Instant::now() + self.timeout;
            if let Some(o) = overall {
                let now = Instant::now();
                if now >= o {
                    last = format!("{last}; the call's deadline passed");
                    break;
                }
                // Every member left gets its share of what is left before the overall
                // deadline: a renewal must not spend the whole lease on members that accept a
                // connection but do not answer (two just restarted, still catching up) and
                // never reach the one that would answer (seen in CI: the lease lost with a
                // healthy member untried).
                let share = (o - now) / u32::try_from(n - tried).unwrap_or(u32::MAX).max(1);
                deadline = deadline.min(now + share);
            }
            let answer = http::post(ep, path, &body, deadline).and_then(|r| {
                let status = r.status;
                r.body(deadline).map(|b| (status, b))
            });
            let (status, bytes) = match answer {
                Ok(x) => x,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let v: Value = match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                Err(e) => {
                    last = format!("{ep} answered HTTP {status} that is not JSON: {e}");
                    continue;
                }
            };
            if let Some(message) = v.get("error").or_else(|| v.get("message")) {
                let code = num(&v["code"]);
                let message = message.as_str().unwrap_or_default().to_string();
                if retriable(code) {
                    last = format!("{ep}: {message}");
                    continue;
                }
                return Err(EtcdError::Refused { code, message });
            }
            if status != 200 {
                last = format!("{ep} answered HTTP {status}");
                continue;
            }
            self.preferred.set(i);
            return Ok(v);
        }
        Err(self.unavailable(last))
    }

    /// Grants a lease of `ttl` seconds: its id and the TTL granted.
    pub fn grant(&self, ttl: u64) -> Result<(i64, i64), EtcdError> {
        let v = self.call("/v3/lease/grant", &json!({ "TTL": ttl.to_string() }))?;
        let id = num(&v["ID"]);
        if id == 0 {
            return Err(EtcdError::Unexpected {
                what: format!("a lease grant without an id: {v}"),
            });
        }
        Ok((id, num(&v["TTL"])))
    }

    /// Renews the lease once: `Some(ttl)` while it lives (the TTL it was renewed to), `None`
    /// once it expired or was revoked.
    pub fn keep_alive(&self, id: i64) -> Result<Option<i64>, EtcdError> {
        self.keep_alive_by(id, None)
    }

    /// [`Etcd::keep_alive`], given up by `overall` at the latest.
    pub fn keep_alive_by(
        &self,
        id: i64,
        overall: Option<Instant>,
    ) -> Result<Option<i64>, EtcdError> {
        let v = self.call_by(
            "/v3/lease/keepalive",
            &json!({ "ID": id.to_string() }),
            overall,
        )?;
        let ttl = num(&v["result"]["TTL"]);
        Ok((ttl > 0).then_some(ttl))
    }

    /// Revokes the lease (deleting every key attached to it): `false` if it was already gone.
    pub fn revoke(&self, id: i64) -> Result<bool, EtcdError> {
        match self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() })) {
            Ok(_) => Ok(true),
            Err(e) if lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The seconds a lease has left (`None`: it is gone).
    pub fn time_to_live(&self, id: i64) -> Result<Option<i64>, EtcdError> {
        let v = self.call("/v3/lease/timetolive", &json!({ "ID": id.to_string() }))?;
        let ttl = num(&v["TTL"]);
        Ok((ttl > 0).then_some(ttl))
    }

    /// Reads one key (linearizable): the pair if it exists, and the store's revision.
    pub fn get(&self, key: &[u8]) -> Result<(Option<Kv>, i64), EtcdError> {
        let v = self.call("/v3/kv/range", &json!({ "key": b64(key) }))?;
        let kv = v["kvs"].as_array().and_then(|a| a.first()).map(kv_of);
        Ok((kv, revision(&v)))
    }

    /// Reads every key under `prefix` (linearizable), sorted by key.
    pub fn get_prefix(&self, prefix: &[u8]) -> Result<Vec<Kv>, EtcdError> {
        let v = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) }),
        )?;
        Ok(v["kvs"]
            .as_array()
            .map(|a| a.iter().map(kv_of).collect())
            .unwrap_or_default())
    }

    /// Puts a value (attached to `lease`, 0: none) without any condition.
    pub fn put(&self, key: &[u8], value: &[u8], lease: i64) -> Result<i64, EtcdError> {
        let v = self.call(
            "/v3/kv/put",
            &json!({ "key": b64(key), "value": b64(value), "lease": lease.to_string() }),
        )?;
        Ok(revision(&v))
    }

    /// Runs a transaction: if every compare holds, `success`, otherwise `failure`.
    pub fn txn(
        &self,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> Result<TxnResult, EtcdError> {
        let cmp: Vec<Value> = compare
            .iter()
            .map(|c| match c {
                Compare::CreateRevision(k, r) => json!({
                    "target": "CREATE", "result": "EQUAL", "key": b64(k),
                    "create_revision": r.to_string()
                }),
            })
            .collect();
        let ops = |ops: &[Op]| -> Vec<Value> {
            ops.iter()
                .map(|o| match o {
                    Op::Put { key, value, lease } => json!({ "request_put": {
                        "key": b64(key), "value": b64(value), "lease": lease.to_string()
                    }}),
                    Op::Get(k) => json!({ "request_range": { "key": b64(k) } }),
                    Op::Delete(k) => json!({ "request_delete_range": { "key": b64(k) } }),
                })
                .collect()
        };
        let v = self.call(
            "/v3/kv/txn",
            &json!({ "compare": cmp, "success": ops(success), "failure": ops(failure) }),
        )?;
        let kvs = v["responses"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .filter_map(|r| r["response_range"]["kvs"].as_array())
                    .flat_map(|a| a.iter().map(kv_of))
                    .collect()
            })
            .unwrap_or_default();
        Ok(TxnResult {
            succeeded: v["succeeded"].as_bool().unwrap_or(false),
            revision: revision(&v),
            kvs,
        })
    }

    /// Starts watching `key` from revision `from` on the first member that accepts the watch.
    pub fn watch(&self, key: &[u8], from: i64) -> Result<Watch, EtcdError> {
        let body = serde_json::to_vec(&json!({ "create_request": {
            "key": b64(key), "start_revision": from.to_string()
        }}))
        .expect("JSON values serialise");
        let mut last = String::from("no member configured");
        for (i, ep) in self.order() {
            let deadline = Instant::now() + self.timeout;
            let mut r = match http::post(ep, "/v3/watch", &body, deadline) {
                Ok(r) if r.status == 200 => r,
                Ok(r) => {
                    last = format!("{ep} answered HTTP {}", r.status);
                    continue;
                }
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            // The first message confirms the watch.
            match r.next_message(deadline) {
                Ok(Some(v)) if v["result"]["created"].as_bool() == Some(true) => {
                    self.preferred.set(i);
                    return Ok(Watch {
                        response: r,
                        endpoint: ep.clone(),
                    });
                }
                Ok(Some(v)) => last = format!("{ep} did not create the watch: {v}"),
                Ok(None) => last = format!("{ep} closed the watch"),
                Err(e) => last = e.to_string(),
            }
        }
        Err(self.unavailable(last))
    }

    /// The member id of the leader, as `endpoint` sees it (0: none).
    pub fn leader_seen_by(&self, endpoint: &str) -> Result<u64, EtcdError> {
        let one = Etcd::new(vec![endpoint.to_string()], self.timeout);
        let v = one.call("/v3/maintenance/status", &json!({}))?;
        Ok(unum(&v["leader"]))
    }

    /// This member's own id.
    pub fn member_id(&self, endpoint: &str) -> Result<u64, EtcdError> {
        let one = Etcd::new(vec![endpoint.to_string()], self.timeout);
        let v = one.call("/v3/maintenance/status", &json!({}))?;
        Ok(unum(&v["header"]["member_id"]))
    }
}

/// The end of the key range of everything under `prefix` (the prefix with its last byte
/// incremented, carrying over 0xff).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range to the end of the key space.
    vec![0]
}

/// An open watch of one key.
pub struct Watch {
    response: Response,
    endpoint: String,
}

impl Watch {
    /// The member serving the watch.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The events that came until `deadline` (an empty list when none did); an error when the
    /// watch broke (the member went away: start another from the last revision seen).
    pub fn next(&mut self, deadline: Instant) -> Result<Vec<WatchEvent>, EtcdError> {
        let broken = |what: String| EtcdError::Unavailable {
            endpoints: self.endpoint.clone(),
            last: what,
        };
        match self.response.next_message(deadline) {
            Ok(Some(v)) => {
                if v.get("error").is_some() {
                    return Err(broken(v["error"].to_string()));
                }
                let r = &v["result"];
                if r["canceled"].as_bool() == Some(true) {
                    return Err(broken(format!("the watch was cancelled: {r}")));
                }
                Ok(r["events"]
                    .as_array()
                    .map(|evs| {
                        evs.iter()
                            .map(|e| {
                                let kv = kv_of(&e["kv"]);
                                if e["type"].as_str() == Some("DELETE") {
                                    WatchEvent::Delete {
                                        key: kv.key,
                                        revision: kv.mod_revision,
                                    }
                                } else {
                                    WatchEvent::Put(kv)
                                }
                            })
                            .collect()
                    })
                    .unwrap_or_default())
            }
            Ok(None) => Err(broken("the member closed the watch".into())),
            Err(e) if http::timed_out(&e) => Ok(Vec::new()),
            Err(e) => Err(broken(e.to_string())),
        }
    }
}

/// Whether an error of a call means that no member could answer (as opposed to an answer).
pub fn unavailable(e: &EtcdError) -> bool {
    matches!(e, EtcdError::Unavailable { .. })
}

/// Whether the cluster refused a call because the lease it names is gone (expired or revoked).
pub fn lease_not_found(e: &EtcdError) -> bool {
    matches!(e, EtcdError::Refused { message, .. } if message.contains("lease not found"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn numbers_come_as_strings_and_zero_values_are_absent() {
        let v: Value = serde_json::from_str(r#"{"a":"12","b":3}"#).unwrap();
        assert_eq!((num(&v["a"]), num(&v["b"]), num(&v["c"])), (12, 3, 0));
        let kv = kv_of(&serde_json::from_str(r#"{"key":"eA==","create_revision":"4"}"#).unwrap());
        assert_eq!(
            kv,
            Kv {
                key: b"x".to_vec(),
                value: Vec::new(),
                create_revision: 4,
                mod_revision: 0,
                lease: 0
            }
        );
    }
}
