//! A minimal etcd v3 client over either of etcd's client protocols: its gRPC API
//! (`etcd_grpc.rs`), as etcd's own clients use it, or its JSON gateway (`POST /v3/...`: keys
//! and values in base64, 64-bit integers as JSON strings). The workloads describe comparisons
//! and operations once ([`Compare`], [`Op`]); each protocol encodes them. Like
//! `squadron-client`, it tries its endpoints in order from the one that answered last, and
//! moves on only when a request was never sent (the connection was refused), so a write is
//! never sent twice.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::etcd_grpc::GrpcChannels;
use crate::options::EtcdProtocol;

/// Standard base64 with padding (RFC 4648), which etcd's JSON gateway uses for keys and values.
mod b64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;

    pub(crate) fn encode(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    pub(crate) fn decode(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
        STANDARD.decode(text)
    }
}

/// Largest answer body read (ranges here return one key).
const ANSWER_BYTES_MAX: usize = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub(crate) enum EtcdError {
    #[error("{endpoint}{path}: HTTP {status}: {message}")]
    Api {
        endpoint: String,
        path: &'static str,
        status: u16,
        message: String,
    },
    #[error("no etcd endpoint reachable: {0}")]
    Unreachable(String),
    #[error("{endpoint}{path}: {message}")]
    Transport {
        endpoint: String,
        path: &'static str,
        message: String,
    },
    #[error("{path}: unexpected answer: {message}")]
    Decode { path: &'static str, message: String },
}

/// One key as a range or a transaction returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyValue {
    pub(crate) value: Vec<u8>,
    pub(crate) mod_revision: i64,
    pub(crate) version: i64,
}

/// The answer of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnAnswer {
    pub(crate) succeeded: bool,
    /// The store revision after the transaction (the new mod revision of what it wrote).
    pub(crate) revision: i64,
    /// The first key of each range operation of the branch that ran, in order.
    pub(crate) ranges: Vec<Option<KeyValue>>,
}

/// An etcd 64-bit integer: the gateway writes them as strings, and leaves out zeros.
pub(crate) fn int(v: &Value) -> i64 {
    match v {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(s) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

/// An etcd unsigned 64-bit integer (member ids use the whole range).
pub(crate) fn uint(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().unwrap_or(0),
        Value::String(s) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

fn key_value(kv: &Value) -> Result<KeyValue, String> {
    let value = match kv["value"].as_str() {
        Some(text) => b64::decode(text).map_err(|e| format!("value: {e}"))?,
        None => Vec::new(),
    };
    Ok(KeyValue {
        value,
        mod_revision: int(&kv["mod_revision"]),
        version: int(&kv["version"]),
    })
}

/// A comparison of a transaction, as the workloads state it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Compare {
    /// The key's mod revision equals this (0 for a missing key).
    Mod(String, i64),
    /// The key's version equals this (0: the key does not exist).
    Version(String, i64),
    /// The key's create revision equals this (0: the key does not exist).
    Created(String, i64),
    /// The key's value sorts (bytewise) before this.
    ValueLess(String, String),
}

/// An operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<i64>,
    },
    Delete(String),
    Range(String),
}

pub(crate) fn compare_mod(key: &str, revision: i64) -> Compare {
    Compare::Mod(key.into(), revision)
}

pub(crate) fn compare_version(key: &str, version: i64) -> Compare {
    Compare::Version(key.into(), version)
}

pub(crate) fn compare_created(key: &str, revision: i64) -> Compare {
    Compare::Created(key.into(), revision)
}

pub(crate) fn compare_value_less(key: &str, value: &str) -> Compare {
    Compare::ValueLess(key.into(), value.into())
}

pub(crate) fn op_put(key: &str, value: &[u8], lease: Option<i64>) -> Op {
    Op::Put {
        key: key.into(),
        value: value.to_vec(),
        lease,
    }
}

pub(crate) fn op_delete(key: &str) -> Op {
    Op::Delete(key.into())
}

pub(crate) fn op_range(key: &str) -> Op {
    Op::Range(key.into())
}

impl Compare {
    /// The gateway's JSON of the comparison.
    fn to_json(&self) -> Value {
        let key = |k: &str| b64::encode(k.as_bytes());
        match self {
            Compare::Mod(k, r) => json!({"key": key(k), "target": "MOD", "result": "EQUAL",
                                         "mod_revision": r.to_string()}),
            Compare::Version(k, v) => json!({"key": key(k), "target": "VERSION",
                                             "result": "EQUAL", "version": v.to_string()}),
            Compare::Created(k, r) => json!({"key": key(k), "target": "CREATE",
                                             "result": "EQUAL", "create_revision": r.to_string()}),
            Compare::ValueLess(k, v) => json!({"key": key(k), "target": "VALUE", "result": "LESS",
                                               "value": b64::encode(v.as_bytes())}),
        }
    }
}

impl Op {
    /// The gateway's JSON of the operation.
    fn to_json(&self) -> Value {
        match self {
            Op::Put { key, value, lease } => {
                let mut put =
                    json!({"key": b64::encode(key.as_bytes()), "value": b64::encode(value)});
                if let Some(l) = lease {
                    put["lease"] = Value::String(l.to_string());
                }
                json!({ "request_put": put })
            }
            Op::Delete(key) => {
                json!({"request_delete_range": {"key": b64::encode(key.as_bytes())}})
            }
            Op::Range(key) => json!({"request_range": {"key": b64::encode(key.as_bytes())}}),
        }
    }
}

/// What one try at one endpoint came to: refused before anything was sent (the next
/// endpoint may be tried), or an answer or failure that ends the call.
pub(crate) enum Attempt<T> {
    Done(Result<T, EtcdError>),
    Refused(String),
}

/// How the client reaches the cluster.
#[derive(Debug)]
enum Transport {
    Gateway(reqwest::Client),
    Grpc(GrpcChannels),
}

/// A client of one etcd cluster (its own connections).
#[derive(Debug)]
pub(crate) struct EtcdClient {
    transport: Transport,
    endpoints: Arc<Vec<String>>,
    preferred: AtomicUsize,
}

impl EtcdClient {
    pub(crate) fn new(
        protocol: EtcdProtocol,
        endpoints: Vec<String>,
        request: Duration,
        connect: Duration,
    ) -> Self {
        let transport = match protocol {
            EtcdProtocol::Gateway => Transport::Gateway(
                reqwest::Client::builder()
                    .timeout(request)
                    .connect_timeout(connect)
                    .tcp_nodelay(true)
                    .build()
                    .unwrap_or_else(|_| reqwest::Client::new()),
            ),
            EtcdProtocol::Grpc => Transport::Grpc(GrpcChannels::new(&endpoints, request, connect)),
        };
        Self {
            transport,
            endpoints: Arc::new(endpoints),
            preferred: AtomicUsize::new(0),
        }
    }

    /// Tries `call` on each endpoint from the preferred one until one was not refused.
    pub(crate) async fn each_endpoint<T, F, Fut>(&self, call: F) -> Result<T, EtcdError>
    where
        F: Fn(usize, String) -> Fut,
        Fut: std::future::Future<Output = Attempt<T>>,
    {
        let n = self.endpoints.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut refused = Vec::new();
        for k in 0..n {
            let idx = (start + k) % n;
            let Some(base) = self.endpoints.get(idx) else {
                continue;
            };
            match call(idx, base.clone()).await {
                Attempt::Refused(e) => refused.push(format!("{base}: {e}")),
                Attempt::Done(answer) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    return answer;
                }
            }
        }
        Err(EtcdError::Unreachable(refused.join("; ")))
    }

    /// POSTs a JSON body to a gateway path; the answer's JSON.
    async fn call(
        &self,
        http: &reqwest::Client,
        path: &'static str,
        body: &Value,
    ) -> Result<Value, EtcdError> {
        self.each_endpoint(|_, base| gateway_post(http, base, path, body))
            .await
    }
}

async fn gateway_post(
    http: &reqwest::Client,
    base: String,
    path: &'static str,
    body: &Value,
) -> Attempt<Value> {
    let resp = match http.post(format!("{base}{path}")).json(body).send().await {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Attempt::Refused(e.to_string()),
        Err(e) => {
            return Attempt::Done(Err(EtcdError::Transport {
                endpoint: base,
                path,
                message: e.to_string(),
            }))
        }
    };
    Attempt::Done(gateway_answer(&base, path, resp).await)
}

async fn gateway_answer(
    base: &str,
    path: &'static str,
    resp: reqwest::Response,
) -> Result<Value, EtcdError> {
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.map_err(|e| EtcdError::Transport {
        endpoint: base.to_string(),
        path,
        message: format!("status {status}, then reading the answer: {e}"),
    })?;
    if bytes.len() > ANSWER_BYTES_MAX {
        return Err(EtcdError::Decode {
            path,
            message: format!(
                "answer of {} bytes, more than {ANSWER_BYTES_MAX}",
                bytes.len()
            ),
        });
    }
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| EtcdError::Decode {
        path,
        message: format!("{e}: {}", String::from_utf8_lossy(&bytes)),
    })?;
    if !(200..300).contains(&status) {
        let message = value["message"]
            .as_str()
            .or(value["error"].as_str())
            .unwrap_or("no message")
            .to_string();
        return Err(EtcdError::Api {
            endpoint: base.to_string(),
            path,
            status,
            message,
        });
    }
    Ok(value)
}

/// The first key of a gateway range answer.
fn first_kv(path: &'static str, range: &Value) -> Result<Option<KeyValue>, EtcdError> {
    match range["kvs"].get(0) {
        Some(kv) => key_value(kv)
            .map(Some)
            .map_err(|message| EtcdError::Decode { path, message }),
        None => Ok(None),
    }
}

impl EtcdClient {
    /// A linearizable range of one key.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let http = match &self.transport {
            Transport::Grpc(g) => return g.get(self, key).await,
            Transport::Gateway(http) => http,
        };
        let path = "/v3/kv/range";
        let answer = self
            .call(http, path, &json!({"key": b64::encode(key.as_bytes())}))
            .await?;
        first_kv(path, &answer)
    }

    /// Puts a key; the new revision.
    pub(crate) async fn put(&self, key: &str, value: &[u8]) -> Result<i64, EtcdError> {
        let http = match &self.transport {
            Transport::Grpc(g) => return g.put(self, key, value).await,
            Transport::Gateway(http) => http,
        };
        let put = op_put(key, value, None).to_json();
        let answer = self.call(http, "/v3/kv/put", &put["request_put"]).await?;
        Ok(int(&answer["header"]["revision"]))
    }

    /// Runs a transaction: if every comparison holds, `success`, else `failure`.
    pub(crate) async fn txn(
        &self,
        compare: Vec<Compare>,
        success: Vec<Op>,
        failure: Vec<Op>,
    ) -> Result<TxnAnswer, EtcdError> {
        let http = match &self.transport {
            Transport::Grpc(g) => return g.txn(self, &compare, &success, &failure).await,
            Transport::Gateway(http) => http,
        };
        let path = "/v3/kv/txn";
        let body = json!({
            "compare": compare.iter().map(Compare::to_json).collect::<Vec<_>>(),
            "success": success.iter().map(Op::to_json).collect::<Vec<_>>(),
            "failure": failure.iter().map(Op::to_json).collect::<Vec<_>>(),
        });
        let answer = self.call(http, path, &body).await?;
        let mut ranges = Vec::new();
        for r in answer["responses"].as_array().into_iter().flatten() {
            if let Some(range) = r.get("response_range") {
                ranges.push(first_kv(path, range)?);
            }
        }
        Ok(TxnAnswer {
            succeeded: answer["succeeded"].as_bool().unwrap_or(false),
            revision: int(&answer["header"]["revision"]),
            ranges,
        })
    }

    /// Grants a lease of `ttl_s` seconds; its id.
    pub(crate) async fn lease_grant(&self, ttl_s: i64) -> Result<i64, EtcdError> {
        let http = match &self.transport {
            Transport::Grpc(g) => return g.lease_grant(self, ttl_s).await,
            Transport::Gateway(http) => http,
        };
        let path = "/v3/lease/grant";
        let answer = self
            .call(http, path, &json!({"TTL": ttl_s.to_string(), "ID": "0"}))
            .await?;
        match int(&answer["ID"]) {
            0 => Err(EtcdError::Decode {
                path,
                message: format!("no lease id in {answer}"),
            }),
            id => Ok(id),
        }
    }

    /// One keep-alive of a lease (the gateway maps the stream to one request, one answer;
    /// over gRPC a stream carries one of each, as etcd's `KeepAliveOnce`); the TTL it was
    /// renewed to.
    pub(crate) async fn lease_keepalive(&self, id: i64) -> Result<i64, EtcdError> {
        let http = match &self.transport {
            Transport::Grpc(g) => return g.lease_keepalive(self, id).await,
            Transport::Gateway(http) => http,
        };
        let path = "/v3/lease/keepalive";
        let answer = self
            .call(http, path, &json!({"ID": id.to_string()}))
            .await?;
        match int(&answer["result"]["TTL"]) {
            ttl if ttl > 0 => Ok(ttl),
            _ => Err(EtcdError::Decode {
                path,
                message: format!("lease {id} not renewed: {answer}"),
            }),
        }
    }

    /// `(member id, leader id)` as the first reachable endpoint sees them.
    pub(crate) async fn status(&self) -> Result<(u64, u64), EtcdError> {
        let http = match &self.transport {
            Transport::Grpc(g) => return g.status(self).await,
            Transport::Gateway(http) => http,
        };
        let answer = self
            .call(http, "/v3/maintenance/status", &json!({}))
            .await?;
        Ok((
            uint(&answer["header"]["member_id"]),
            uint(&answer["leader"]),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_come_as_strings_numbers_or_not_at_all() {
        assert_eq!(
            int(&json!("7587848964733389066")),
            7_587_848_964_733_389_066
        );
        assert_eq!(int(&json!(12)), 12);
        assert_eq!(int(&Value::Null), 0);
        // Member ids use all 64 bits.
        assert_eq!(
            uint(&json!("17585366470574510568")),
            17_585_366_470_574_510_568
        );
    }

    #[test]
    fn operations_encode_keys_and_values_in_base64() {
        let put = op_put("bench/a", b"v", Some(42)).to_json();
        assert_eq!(
            put,
            json!({"request_put": {"key": "YmVuY2gvYQ==", "value": "dg==", "lease": "42"}})
        );
        assert_eq!(
            compare_mod("bench/a", 0).to_json()["mod_revision"],
            json!("0"),
            "a missing key compares with mod revision 0"
        );
        let kv = key_value(
            &json!({"key": "YmVuY2gvYQ==", "value": "MQ==", "mod_revision": "9",
                                    "version": "2"}),
        )
        .unwrap();
        assert_eq!(
            kv,
            KeyValue {
                value: b"1".to_vec(),
                mod_revision: 9,
                version: 2
            }
        );
    }

    #[test]
    fn rfc_4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(b64::encode(plain.as_bytes()), encoded);
            assert_eq!(b64::decode(encoded).unwrap(), plain.as_bytes());
        }
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255u8).collect();
        for len in 0..all.len() {
            let text = b64::encode(&all[..len]);
            assert_eq!(b64::decode(&text).unwrap(), &all[..len], "length {len}");
        }
        assert_eq!(b64::encode(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn bad_text_is_refused_with_its_position() {
        use base64::DecodeError;
        for (text, want) in [
            ("abc", DecodeError::InvalidPadding),
            ("ab!d", DecodeError::InvalidByte(2, b'!')),
            ("a==d", DecodeError::InvalidByte(1, b'=')),
            ("ab=d", DecodeError::InvalidByte(2, b'=')),
            ("Zg==Zm9v", DecodeError::InvalidByte(2, b'=')),
        ] {
            assert_eq!(b64::decode(text), Err(want), "{text}");
        }
    }
}
