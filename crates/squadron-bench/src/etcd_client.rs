//! A minimal client of etcd's v3 JSON gateway (`POST /v3/...`): keys and values in base64,
//! 64-bit integers as JSON strings. Like `squadron-client`, it tries its endpoints in order
//! from the one that answered last, and moves on only when a request was never sent (the
//! connection was refused), so a write is never sent twice.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

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

/// Comparison of a key's mod revision (0 for a missing key).
pub(crate) fn compare_mod(key: &str, revision: i64) -> Value {
    json!({"key": b64::encode(key.as_bytes()), "target": "MOD", "result": "EQUAL",
           "mod_revision": revision.to_string()})
}

/// Comparison of a key's version (0: the key does not exist).
pub(crate) fn compare_version(key: &str, version: i64) -> Value {
    json!({"key": b64::encode(key.as_bytes()), "target": "VERSION", "result": "EQUAL",
           "version": version.to_string()})
}

/// Comparison of a key's create revision (0: the key does not exist).
pub(crate) fn compare_created(key: &str, revision: i64) -> Value {
    json!({"key": b64::encode(key.as_bytes()), "target": "CREATE", "result": "EQUAL",
           "create_revision": revision.to_string()})
}

/// The key's value sorts (bytewise) before `value`.
pub(crate) fn compare_value_less(key: &str, value: &str) -> Value {
    json!({"key": b64::encode(key.as_bytes()), "target": "VALUE", "result": "LESS",
           "value": b64::encode(value.as_bytes())})
}

pub(crate) fn op_put(key: &str, value: &[u8], lease: Option<i64>) -> Value {
    let mut put = json!({"key": b64::encode(key.as_bytes()), "value": b64::encode(value)});
    if let Some(l) = lease {
        put["lease"] = Value::String(l.to_string());
    }
    json!({ "request_put": put })
}

pub(crate) fn op_delete(key: &str) -> Value {
    json!({"request_delete_range": {"key": b64::encode(key.as_bytes())}})
}

pub(crate) fn op_range(key: &str) -> Value {
    json!({"request_range": {"key": b64::encode(key.as_bytes())}})
}

/// A client of one etcd cluster (its own connection pool).
#[derive(Debug)]
pub(crate) struct EtcdClient {
    http: reqwest::Client,
    endpoints: Arc<Vec<String>>,
    preferred: AtomicUsize,
}

impl EtcdClient {
    pub(crate) fn new(endpoints: Vec<String>, request: Duration, connect: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(request)
            .connect_timeout(connect)
            .tcp_nodelay(true)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Self {
            http,
            endpoints: Arc::new(endpoints),
            preferred: AtomicUsize::new(0),
        }
    }

    /// POSTs a JSON body to a gateway path; the answer's JSON.
    pub(crate) async fn call(&self, path: &'static str, body: &Value) -> Result<Value, EtcdError> {
        let n = self.endpoints.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut refused = Vec::new();
        for k in 0..n {
            let idx = (start + k) % n;
            let Some(base) = self.endpoints.get(idx) else {
                continue;
            };
            let sent = self
                .http
                .post(format!("{base}{path}"))
                .json(body)
                .send()
                .await;
            let resp = match sent {
                Ok(r) => r,
                Err(e) if e.is_connect() => {
                    refused.push(format!("{base}: {e}"));
                    continue;
                }
                Err(e) => {
                    return Err(EtcdError::Transport {
                        endpoint: base.clone(),
                        path,
                        message: e.to_string(),
                    })
                }
            };
            self.preferred.store(idx, Ordering::Relaxed);
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.map_err(|e| EtcdError::Transport {
                endpoint: base.clone(),
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
                    endpoint: base.clone(),
                    path,
                    status,
                    message,
                });
            }
            return Ok(value);
        }
        Err(EtcdError::Unreachable(refused.join("; ")))
    }

    /// A linearizable range of one key.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let path = "/v3/kv/range";
        let answer = self
            .call(path, &json!({"key": b64::encode(key.as_bytes())}))
            .await?;
        match answer["kvs"].get(0) {
            Some(kv) => key_value(kv)
                .map(Some)
                .map_err(|message| EtcdError::Decode { path, message }),
            None => Ok(None),
        }
    }

    /// Puts a key; the new revision.
    pub(crate) async fn put(&self, key: &str, value: &[u8]) -> Result<i64, EtcdError> {
        let put = op_put(key, value, None);
        let answer = self.call("/v3/kv/put", &put["request_put"]).await?;
        Ok(int(&answer["header"]["revision"]))
    }

    /// Runs a transaction: if every comparison holds, `success`, else `failure`.
    pub(crate) async fn txn(
        &self,
        compare: Vec<Value>,
        success: Vec<Value>,
        failure: Vec<Value>,
    ) -> Result<TxnAnswer, EtcdError> {
        let path = "/v3/kv/txn";
        let answer = self
            .call(
                path,
                &json!({"compare": compare, "success": success, "failure": failure}),
            )
            .await?;
        let mut ranges = Vec::new();
        for r in answer["responses"].as_array().into_iter().flatten() {
            if let Some(range) = r.get("response_range") {
                let kv = match range["kvs"].get(0) {
                    Some(kv) => {
                        Some(key_value(kv).map_err(|message| EtcdError::Decode { path, message })?)
                    }
                    None => None,
                };
                ranges.push(kv);
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
        let path = "/v3/lease/grant";
        let answer = self
            .call(path, &json!({"TTL": ttl_s.to_string(), "ID": "0"}))
            .await?;
        match int(&answer["ID"]) {
            0 => Err(EtcdError::Decode {
                path,
                message: format!("no lease id in {answer}"),
            }),
            id => Ok(id),
        }
    }

    /// One keep-alive of a lease (the gateway maps the stream to one request, one answer);
    /// the TTL it was renewed to.
    pub(crate) async fn lease_keepalive(&self, id: i64) -> Result<i64, EtcdError> {
        let path = "/v3/lease/keepalive";
        let answer = self.call(path, &json!({"ID": id.to_string()})).await?;
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
        let answer = self.call("/v3/maintenance/status", &json!({})).await?;
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
        let put = op_put("bench/a", b"v", Some(42));
        assert_eq!(
            put,
            json!({"request_put": {"key": "YmVuY2gvYQ==", "value": "dg==", "lease": "42"}})
        );
        assert_eq!(
            compare_mod("bench/a", 0)["mod_revision"],
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
