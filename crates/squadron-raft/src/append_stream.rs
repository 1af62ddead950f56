//! One long-lived `AppendEntriesStream` call to a peer: each request goes out on its request
//! side and is answered by the next message back (the peer answers in order). A unary call
//! costs an HTTP/2 stream's set-up, headers and trailers on both nodes, and openraft sends two
//! per committed entry (the entry, then its commit index).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use squadron_proto::v1::raft_service_client::RaftServiceClient;
use squadron_proto::v1::RaftPayload;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use crate::wire;

/// Requests waiting on a stream's request side, at most: one is ever outstanding.
const APPEND_STREAM_QUEUE_MAX: usize = 1;
/// How long a peer that had no append stream (a node of an earlier version) gets unary calls
/// before a stream is tried again (it may have been upgraded meanwhile).
const UNSUPPORTED_RETRY_MS: u64 = 60_000;

/// How a node's appends to its peers went (`/metrics`).
#[derive(Debug, Default)]
pub struct AppendStats {
    /// Append streams opened (one per peer while its connection lasts).
    pub streams_opened: AtomicU64,
    /// Appends answered on a stream.
    pub streamed: AtomicU64,
    /// Appends sent as unary calls: the peer's stream busy with another client (a leadership
    /// confirmation beside replication), or a peer without streams.
    pub unary: AtomicU64,
}

/// Why a stream gave no answer. The stream is dropped either way.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    #[error("append stream refused: {}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    #[error("append stream ended")]
    Ended,
}

impl StreamError {
    /// The peer has no such call (a node of an earlier version): use unary calls with it.
    pub(crate) fn unsupported(&self) -> bool {
        matches!(self, StreamError::Status(s) if s.code() == tonic::Code::Unimplemented)
    }

    /// The peer cannot be reached (as opposed to a call it answered with an error).
    pub(crate) fn unreachable(&self) -> bool {
        match self {
            StreamError::Status(s) => s.code() == tonic::Code::Unavailable,
            StreamError::Ended => true,
        }
    }
}

pub(crate) struct AppendStream {
    requests: mpsc::Sender<RaftPayload>,
    answers: Streaming<RaftPayload>,
}

impl AppendStream {
    /// Opens a stream whose first request is `first`; answers the stream and that request's
    /// reply.
    pub(crate) async fn open(
        channel: Channel,
        first: Vec<u8>,
    ) -> Result<(Self, RaftPayload), StreamError> {
        let (requests, queued) = mpsc::channel(APPEND_STREAM_QUEUE_MAX);
        requests
            .send(RaftPayload { data: first })
            .await
            .map_err(|_| StreamError::Ended)?;
        let mut client = RaftServiceClient::new(channel)
            .max_decoding_message_size(wire::RAFT_PAYLOAD_BYTES_MAX)
            .max_encoding_message_size(wire::RAFT_PAYLOAD_BYTES_MAX);
        let answers = client
            .append_entries_stream(ReceiverStream::new(queued))
            .await?
            .into_inner();
        let mut stream = AppendStream { requests, answers };
        let reply = stream.answer().await?;
        Ok((stream, reply))
    }

    pub(crate) async fn exchange(&mut self, data: Vec<u8>) -> Result<RaftPayload, StreamError> {
        self.requests
            .send(RaftPayload { data })
            .await
            .map_err(|_| StreamError::Ended)?;
        self.answer().await
    }

    async fn answer(&mut self) -> Result<RaftPayload, StreamError> {
        self.answers.message().await?.ok_or(StreamError::Ended)
    }
}

/// A peer's append stream, shared by every client of the peer (openraft makes one for each
/// replication session and one for every leadership confirmation); one client uses it at a
/// time, the others make unary calls meanwhile.
#[derive(Default)]
pub(crate) struct AppendSlot {
    stream: Option<AppendStream>,
    /// When the peer answered `Unimplemented`: unary calls only, for a while.
    unsupported_at: Option<Instant>,
}

impl AppendSlot {
    /// `data` on the open stream, or on a new one if there is none or the open one failed
    /// (its connection lost, the peer restarted): an append sent twice is harmless in Raft.
    ///
    /// The stream is out of the slot while a request is outstanding and goes back only with
    /// its answer read, so a caller that gives up — openraft drops the call at its deadline —
    /// drops the stream with it: an answer left unread would otherwise be taken as the next
    /// request's, and an old `Success` would count entries the follower never stored.
    pub(crate) async fn exchange(
        &mut self,
        channel: Channel,
        data: Vec<u8>,
        stats: &AppendStats,
    ) -> Result<RaftPayload, StreamError> {
        if let Some(mut stream) = self.stream.take() {
            if let Ok(reply) = stream.exchange(data.clone()).await {
                self.stream = Some(stream);
                return Ok(reply);
            }
        }
        let (stream, reply) = AppendStream::open(channel, data).await?;
        stats.streams_opened.fetch_add(1, Ordering::Relaxed);
        self.stream = Some(stream);
        Ok(reply)
    }

    /// The peer had no stream recently: use a unary call.
    pub(crate) fn unsupported(&self) -> bool {
        self.unsupported_at
            .is_some_and(|at| at.elapsed() < Duration::from_millis(UNSUPPORTED_RETRY_MS))
    }

    pub(crate) fn mark_unsupported(&mut self) {
        self.unsupported_at = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use squadron_proto::v1::raft_service_server::{RaftService, RaftServiceServer};
    use std::pin::Pin;
    use tokio_stream::wrappers::TcpListenerStream;
    use tonic::{Request, Response, Status};

    /// Answers each message of a stream with its own bytes, after a pause when they are
    /// `b"slow"`: a follower whose fsync outlasts the caller's deadline. `old`: a node of an
    /// earlier version, which has no append stream.
    struct Echo {
        old: bool,
    }

    type Answers = Pin<Box<dyn futures_util::Stream<Item = Result<RaftPayload, Status>> + Send>>;

    #[tonic::async_trait]
    impl RaftService for Echo {
        async fn append_entries(
            &self,
            r: Request<RaftPayload>,
        ) -> Result<Response<RaftPayload>, Status> {
            Ok(Response::new(r.into_inner()))
        }
        type AppendEntriesStreamStream = Answers;
        async fn append_entries_stream(
            &self,
            r: Request<Streaming<RaftPayload>>,
        ) -> Result<Response<Answers>, Status> {
            if self.old {
                return Err(Status::unimplemented("no such method"));
            }
            let answers = futures_util::stream::unfold(r.into_inner(), |mut rx| async move {
                let p = rx.message().await.ok()??;
                if p.data == b"slow" {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Some((Ok(p), rx))
            });
            Ok(Response::new(Box::pin(answers)))
        }
        async fn vote(&self, r: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
            Ok(Response::new(r.into_inner()))
        }
        async fn install_snapshot(
            &self,
            r: Request<RaftPayload>,
        ) -> Result<Response<RaftPayload>, Status> {
            Ok(Response::new(r.into_inner()))
        }
    }

    async fn echo_channel(old: bool) -> Channel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftServiceServer::new(Echo { old }))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy()
    }

    /// A caller that gives up on an answer (openraft drops the call at its deadline) must not
    /// leave that answer to be read as the next request's: the next exchange gets its own.
    #[tokio::test]
    async fn an_abandoned_exchange_never_hands_its_answer_to_the_next_request() {
        let channel = echo_channel(false).await;
        let stats = AppendStats::default();
        let mut slot = AppendSlot::default();
        let first = slot.exchange(channel.clone(), b"one".to_vec(), &stats);
        assert_eq!(first.await.unwrap().data, b"one");
        let abandoned = tokio::time::timeout(
            Duration::from_millis(50),
            slot.exchange(channel.clone(), b"slow".to_vec(), &stats),
        )
        .await;
        assert!(abandoned.is_err(), "the slow answer came too soon");
        let next = slot.exchange(channel.clone(), b"two".to_vec(), &stats);
        assert_eq!(next.await.unwrap().data, b"two");
        let last = slot.exchange(channel, b"three".to_vec(), &stats);
        assert_eq!(last.await.unwrap().data, b"three");
        // The abandoned stream was dropped and one opened in its place, then reused.
        assert_eq!(stats.streams_opened.load(Ordering::Relaxed), 2);
    }

    /// A peer of an earlier version answers the stream `Unimplemented`: the slot says so (the
    /// caller then makes unary calls) and does so only for a while.
    #[tokio::test]
    async fn a_peer_without_append_streams_is_marked_for_unary_calls() {
        let stats = AppendStats::default();
        let mut slot = AppendSlot::default();
        assert!(!slot.unsupported());
        let refused = slot
            .exchange(echo_channel(true).await, b"one".to_vec(), &stats)
            .await
            .unwrap_err();
        assert!(refused.unsupported() && !refused.unreachable(), "{refused}");
        slot.mark_unsupported();
        assert!(slot.unsupported());
        slot.unsupported_at =
            Some(Instant::now() - Duration::from_millis(UNSUPPORTED_RETRY_MS + 1));
        assert!(
            !slot.unsupported(),
            "tried again after {UNSUPPORTED_RETRY_MS} ms"
        );
        assert_eq!(stats.streams_opened.load(Ordering::Relaxed), 0);
    }
}
