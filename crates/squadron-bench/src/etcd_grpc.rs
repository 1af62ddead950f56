//! etcd's own client protocol: its v3 gRPC API (the calls in `proto/etcd_v3.proto`), one
//! HTTP/2 channel per endpoint, plaintext as the benchmark's etcd listens. What
//! `etcd_client::EtcdClient` sends when asked for `--etcd-client grpc`.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::etcd_client::{Attempt, Compare, EtcdClient, EtcdError, KeyValue, Op, TxnAnswer};

/// The generated messages and clients of etcd's `etcdserverpb` package. Generated code keeps
/// etcd's names (`Request::RequestRange`, …), which are the wire's, not ours to shorten.
#[allow(clippy::all)]
pub(crate) mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;
use pb::request_op::Request;
use pb::response_op::Response;

/// One lazily connected channel per endpoint, in the client's endpoint order.
#[derive(Debug)]
pub(crate) struct GrpcChannels {
    channels: Vec<Result<Channel, String>>,
}

impl GrpcChannels {
    pub(crate) fn new(endpoints: &[String], request: Duration, connect: Duration) -> Self {
        let channels = endpoints
            .iter()
            .map(|url| {
                Endpoint::from_shared(url.clone())
                    .map(|e| {
                        e.timeout(request)
                            .connect_timeout(connect)
                            .tcp_nodelay(true)
                            .connect_lazy()
                    })
                    .map_err(|e| format!("{url}: {e}"))
            })
            .collect();
        Self { channels }
    }

    fn channel(&self, idx: usize) -> Result<Channel, String> {
        self.channels
            .get(idx)
            .cloned()
            .unwrap_or_else(|| Err(format!("no endpoint {idx}")))
    }

    /// One unary call, tried at each endpoint in turn until one was not refused; `send` makes
    /// the call on an endpoint's channel.
    async fn unary<T, F, Fut>(
        &self,
        client: &EtcdClient,
        path: &'static str,
        send: F,
    ) -> Result<T, EtcdError>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        client
            .each_endpoint(|idx, base| {
                let call = self.channel(idx).map(&send);
                async move {
                    match call {
                        Ok(call) => answer(&base, path, call.await),
                        Err(e) => Attempt::Refused(e),
                    }
                }
            })
            .await
    }

    pub(crate) async fn get(
        &self,
        client: &EtcdClient,
        key: &str,
    ) -> Result<Option<KeyValue>, EtcdError> {
        let path = "/etcdserverpb.KV/Range";
        let range = self
            .unary(client, path, |ch| {
                let request = pb::RangeRequest {
                    key: key.as_bytes().to_vec(),
                    ..Default::default()
                };
                async move { KvClient::new(ch).range(request).await }
            })
            .await?;
        Ok(range.kvs.into_iter().next().map(key_value))
    }

    pub(crate) async fn put(
        &self,
        client: &EtcdClient,
        key: &str,
        value: &[u8],
    ) -> Result<i64, EtcdError> {
        let path = "/etcdserverpb.KV/Put";
        let put = self
            .unary(client, path, |ch| {
                let request = pb::PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: value.to_vec(),
                    lease: 0,
                };
                async move { KvClient::new(ch).put(request).await }
            })
            .await?;
        Ok(put.header.map_or(0, |h| h.revision))
    }

    pub(crate) async fn txn(
        &self,
        client: &EtcdClient,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> Result<TxnAnswer, EtcdError> {
        let path = "/etcdserverpb.KV/Txn";
        let request = pb::TxnRequest {
            compare: compare.iter().map(compare_pb).collect(),
            success: success.iter().map(op_pb).collect(),
            failure: failure.iter().map(op_pb).collect(),
        };
        let txn = self
            .unary(client, path, |ch| {
                let request = request.clone();
                async move { KvClient::new(ch).txn(request).await }
            })
            .await?;
        let ranges = txn
            .responses
            .into_iter()
            .filter_map(|r| match r.response {
                Some(Response::ResponseRange(range)) => {
                    Some(range.kvs.into_iter().next().map(key_value))
                }
                _ => None,
            })
            .collect();
        Ok(TxnAnswer {
            succeeded: txn.succeeded,
            revision: txn.header.map_or(0, |h| h.revision),
            ranges,
        })
    }

    pub(crate) async fn lease_grant(
        &self,
        client: &EtcdClient,
        ttl_s: i64,
    ) -> Result<i64, EtcdError> {
        let path = "/etcdserverpb.Lease/LeaseGrant";
        let granted = self
            .unary(client, path, |ch| async move {
                let request = pb::LeaseGrantRequest { ttl: ttl_s, id: 0 };
                LeaseClient::new(ch).lease_grant(request).await
            })
            .await?;
        match granted.id {
            0 => Err(EtcdError::Decode {
                path,
                message: format!("no lease id: {}", granted.error),
            }),
            id => Ok(id),
        }
    }

    /// A keep-alive stream that carries one request and reads one answer (etcd's own
    /// `KeepAliveOnce`).
    pub(crate) async fn lease_keepalive(
        &self,
        client: &EtcdClient,
        id: i64,
    ) -> Result<i64, EtcdError> {
        let path = "/etcdserverpb.Lease/LeaseKeepAlive";
        let renewed = client
            .each_endpoint(|idx, base| async move {
                let ch = match self.channel(idx) {
                    Ok(ch) => ch,
                    Err(e) => return Attempt::Refused(e),
                };
                let once = tokio_stream::iter([pb::LeaseKeepAliveRequest { id }]);
                let mut stream = match answer(
                    &base,
                    path,
                    LeaseClient::new(ch).lease_keep_alive(once).await,
                ) {
                    Attempt::Done(Ok(stream)) => stream,
                    Attempt::Done(Err(e)) => return Attempt::Done(Err(e)),
                    Attempt::Refused(e) => return Attempt::Refused(e),
                };
                Attempt::Done(match stream.message().await {
                    Ok(Some(r)) => Ok(r),
                    Ok(None) => Err(EtcdError::Decode {
                        path,
                        message: format!("lease {id}: the stream ended without an answer"),
                    }),
                    Err(status) => Err(failure(&base, path, &status)),
                })
            })
            .await?;
        match renewed.ttl {
            ttl if ttl > 0 => Ok(ttl),
            _ => Err(EtcdError::Decode {
                path,
                message: format!("lease {id} not renewed (TTL {})", renewed.ttl),
            }),
        }
    }

    pub(crate) async fn status(&self, client: &EtcdClient) -> Result<(u64, u64), EtcdError> {
        let path = "/etcdserverpb.Maintenance/Status";
        let status = self
            .unary(client, path, |ch| async move {
                MaintenanceClient::new(ch)
                    .status(pb::StatusRequest {})
                    .await
            })
            .await?;
        Ok((status.header.map_or(0, |h| h.member_id), status.leader))
    }
}

/// A call's outcome: refused when the connection could not be made (nothing was sent, so
/// another endpoint may be tried), else its answer or its failure.
fn answer<T>(
    base: &str,
    path: &'static str,
    result: Result<tonic::Response<T>, Status>,
) -> Attempt<T> {
    match result {
        Ok(r) => Attempt::Done(Ok(r.into_inner())),
        Err(s) if never_sent(&s) => Attempt::Refused(s.message().to_string()),
        Err(s) => Attempt::Done(Err(failure(base, path, &s))),
    }
}

/// tonic reports a lazy channel's failed connect as UNAVAILABLE naming the connect step; a
/// request was then never written. Any other UNAVAILABLE may have reached etcd.
fn never_sent(s: &Status) -> bool {
    s.code() == Code::Unavailable
        && (s.message().contains("error trying to connect")
            || s.message().contains("tcp connect error"))
}

fn failure(base: &str, path: &'static str, s: &Status) -> EtcdError {
    EtcdError::Transport {
        endpoint: base.to_string(),
        path,
        message: format!("{:?}: {}", s.code(), s.message()),
    }
}

fn key_value(kv: pb::KeyValue) -> KeyValue {
    KeyValue {
        value: kv.value,
        mod_revision: kv.mod_revision,
        version: kv.version,
    }
}

fn compare_pb(c: &Compare) -> pb::Compare {
    let (key, target, result, union) = match c {
        Compare::Mod(k, r) => (
            k,
            CompareTarget::Mod,
            CompareResult::Equal,
            TargetUnion::ModRevision(*r),
        ),
        Compare::Version(k, v) => (
            k,
            CompareTarget::Version,
            CompareResult::Equal,
            TargetUnion::Version(*v),
        ),
        Compare::Created(k, r) => (
            k,
            CompareTarget::Create,
            CompareResult::Equal,
            TargetUnion::CreateRevision(*r),
        ),
        Compare::ValueLess(k, v) => (
            k,
            CompareTarget::Value,
            CompareResult::Less,
            TargetUnion::Value(v.as_bytes().to_vec()),
        ),
    };
    pb::Compare {
        result: result as i32,
        target: target as i32,
        key: key.as_bytes().to_vec(),
        target_union: Some(union),
    }
}

fn op_pb(op: &Op) -> pb::RequestOp {
    let request = match op {
        Op::Put { key, value, lease } => Request::RequestPut(pb::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.clone(),
            lease: lease.unwrap_or(0),
        }),
        Op::Delete(key) => Request::RequestDeleteRange(pb::DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
        }),
        Op::Range(key) => Request::RequestRange(pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        }),
    };
    pb::RequestOp {
        request: Some(request),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd_client::{compare_mod, compare_value_less, op_put};
    use prost::Message;

    #[test]
    fn comparisons_and_operations_become_etcds_messages() {
        let c = compare_pb(&compare_mod("bench/a", 7));
        assert_eq!(c.target, CompareTarget::Mod as i32);
        assert_eq!(c.result, CompareResult::Equal as i32);
        assert_eq!(c.target_union, Some(TargetUnion::ModRevision(7)));
        let less = compare_pb(&compare_value_less("bench/slots", "4"));
        assert_eq!(less.result, CompareResult::Less as i32);
        assert_eq!(less.target_union, Some(TargetUnion::Value(b"4".to_vec())));
        let put = op_pb(&op_put("bench/a", b"held", Some(42)));
        let Some(Request::RequestPut(p)) = put.request else {
            panic!("{put:?}")
        };
        assert_eq!((p.key.as_slice(), p.lease), (&b"bench/a"[..], 42));
    }

    /// The bytes etcd's own messages have on the wire: a mod-revision compare of key "k" with
    /// revision 5 is result 0 (not written), target MOD (field 2 = 2), key (field 3), and
    /// mod_revision (field 6 = 5).
    #[test]
    fn the_wire_is_etcds_field_numbers() {
        let bytes = compare_pb(&compare_mod("k", 5)).encode_to_vec();
        assert_eq!(bytes, [0x10, 0x02, 0x1a, 0x01, b'k', 0x30, 0x05]);
        let keepalive = pb::LeaseKeepAliveRequest { id: 3 }.encode_to_vec();
        assert_eq!(keepalive, [0x08, 0x03]);
    }
}
