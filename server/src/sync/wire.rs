//! The server's side of the sync stream on the wire: a snapshot is encoded once and the
//! same bytes are written to every stream it goes to, with only that stream's nonce added.
//!
//! The service generated from the protocol encodes every message it sends on its own,
//! so a flip to 10,000 streams encoded the same snapshot 10,000 times. Here
//! [`SyncServer`] is that service written out (one method, `Sync`), with [`SyncCodec`]:
//! its encoder takes a [`Frame`], either a snapshot already encoded
//! ([`EncodedSnapshots`]) or any other message, encoded as prost would.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use levee_agent::policy::SCHEMA_VERSION;
use levee_agent::policy::defaults::MAX_MESSAGE_BYTES;
use levee_agent::proto::{AgentMessage, ServerMessage, Snapshot};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{Body, BoxFuture, Context, Poll, Service, StdError, http};
use tonic::{Request, Response, Status, Streaming};

use crate::db::SnapshotRow;

use super::{SyncService, SyncStream};

/// `ServerMessage.snapshot`'s field number (`sync.proto`).
const SERVER_MESSAGE_SNAPSHOT: u32 = 1;
/// `Snapshot.nonce`'s field number (`sync.proto`).
const SNAPSHOT_NONCE: u32 = 5;
/// The gRPC path of the one method.
const SYNC_PATH: &str = "/levee.sync.v1.LeveeSync/Sync";
/// The first size of a stream's encode and of its decode buffer. A stream keeps both as
/// long as it is open: at tonic's default of 8 KiB each, 10,000 idle streams held 160 MB
/// for messages mostly far smaller (a heartbeat is tens of bytes, a status report hundreds);
/// a larger message grows its buffer.
const STREAM_BUFFER: usize = 1024;
/// Encoded bytes gathered before they are handed to HTTP/2 (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// One message a session sends, as its stream's encoder takes it.
#[derive(Debug)]
pub(super) enum Frame {
    /// A snapshot: its fields but the nonce, encoded once for every stream, and this
    /// stream's nonce.
    Snapshot { encoded: Bytes, nonce: u64 },
    /// Any other message (heartbeat, go-away), encoded for this stream. Boxed: the
    /// session's queue holds a slot of the largest kind for every stream.
    Message(Box<ServerMessage>),
}

impl Frame {
    /// The `ServerMessage` carrying `encoded` (a [`Snapshot`] without its nonce) with `nonce`:
    /// its length on the wire, as [`SyncCodec`] writes it.
    pub(super) fn snapshot_len(encoded: &Bytes, nonce: u64) -> usize {
        let inner = snapshot_inner_len(encoded, nonce);
        1 + encoded_len_varint(inner as u64) + inner
    }

    fn encode(self, buf: &mut impl BufMut) {
        match self {
            Frame::Message(m) => {
                m.encode(buf).expect("the encode buffer grows as needed");
            }
            Frame::Snapshot { encoded, nonce } => {
                // The shared fields, then this stream's nonce: a protobuf decoder reads a
                // message's fields in any order, and a field absent is its default (0).
                encode_key(SERVER_MESSAGE_SNAPSHOT, WireType::LengthDelimited, buf);
                encode_varint(snapshot_inner_len(&encoded, nonce) as u64, buf);
                buf.put_slice(&encoded);
                if nonce != 0 {
                    prost::encoding::uint64::encode(SNAPSHOT_NONCE, &nonce, buf);
                }
            }
        }
    }
}

fn snapshot_inner_len(encoded: &Bytes, nonce: u64) -> usize {
    let nonce_len = if nonce == 0 { 0 } else { prost::encoding::uint64::encoded_len(SNAPSHOT_NONCE, &nonce) };
    encoded.len() + nonce_len
}

/// The snapshot message of `snap` for every stream, without a nonce.
fn encode_snapshot(snap: &SnapshotRow) -> Bytes {
    let msg = Snapshot {
        service: snap.service.clone(),
        revision: snap.revision,
        hash: snap.hash.clone(),
        body: Bytes::copy_from_slice(snap.body.as_bytes()),
        nonce: 0,
        schema_version: SCHEMA_VERSION,
        environment: snap.environment.clone(),
        created_at_ms: snap.created_at,
    };
    let mut buf = BytesMut::with_capacity(msg.encoded_len());
    msg.encode(&mut buf).expect("the buffer has the message's length");
    buf.freeze()
}

/// The encoded snapshots the streams share: each snapshot the hub holds is encoded by the
/// first stream it is offered to, and kept while anyone else holds the snapshot.
#[derive(Debug, Default)]
pub(super) struct EncodedSnapshots {
    // Keyed by the snapshot's address, which cannot be reused while the entry holds it. A
    // short, non-async critical section (one encoding, a memory copy, at most); never held
    // across an await.
    #[allow(clippy::disallowed_types)]
    map: std::sync::Mutex<HashMap<usize, (Arc<SnapshotRow>, Bytes)>>,
}

impl EncodedSnapshots {
    /// `snap`'s snapshot message without a nonce, encoded once for every stream.
    pub(super) fn get(&self, snap: &Arc<SnapshotRow>) -> Bytes {
        let key = Arc::as_ptr(snap) as usize;
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, encoded)) = map.get(&key) {
            return encoded.clone();
        }
        // Snapshots no one else holds any more (the hub moved on) are forgotten.
        map.retain(|_, (s, _)| Arc::strong_count(s) > 1);
        let encoded = encode_snapshot(snap);
        map.insert(key, (snap.clone(), encoded.clone()));
        encoded
    }
}

/// The codec of the sync stream on the server: [`Frame`]s out, [`AgentMessage`]s in.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SyncCodec;

impl Codec for SyncCodec {
    type Encode = Frame;
    type Decode = AgentMessage;
    type Encoder = FrameEncoder;
    type Decoder = AgentDecoder;

    fn encoder(&mut self) -> FrameEncoder {
        FrameEncoder
    }

    fn decoder(&mut self) -> AgentDecoder {
        AgentDecoder
    }
}

#[derive(Debug)]
pub(super) struct FrameEncoder;

impl Encoder for FrameEncoder {
    type Item = Frame;
    type Error = Status;

    fn encode(&mut self, item: Frame, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(buf);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(STREAM_BUFFER, YIELD_THRESHOLD)
    }
}

#[derive(Debug)]
pub(super) struct AgentDecoder;

impl Decoder for AgentDecoder {
    type Item = AgentMessage;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<AgentMessage>, Status> {
        AgentMessage::decode(buf).map(Some).map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(STREAM_BUFFER, YIELD_THRESHOLD)
    }
}

/// The `levee.sync.v1.LeveeSync` gRPC service with the sync codec: what the generated
/// server would be, for its one method, without encoding each snapshot per stream. Cheap
/// to clone.
#[derive(Clone, Debug)]
pub struct SyncServer {
    svc: SyncService,
}

impl SyncServer {
    pub(super) fn new(svc: SyncService) -> Self {
        SyncServer { svc }
    }
}

impl tonic::server::NamedService for SyncServer {
    const NAME: &'static str = "levee.sync.v1.LeveeSync";
}

impl<B> Service<http::Request<B>> for SyncServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SYNC_PATH {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        }
        let method = SyncMethod(self.svc.clone());
        Box::pin(async move {
            // Stated, and the agents' own: a snapshot under the budget of `policy::accept`
            // is far below it, and `Session::offer` never sends a larger message.
            let mut grpc = tonic::server::Grpc::new(SyncCodec)
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            Ok(grpc.streaming(method, req).await)
        })
    }
}

struct SyncMethod(SyncService);

impl tonic::server::StreamingService<AgentMessage> for SyncMethod {
    type Response = Frame;
    type ResponseStream = SyncStream;
    type Future = BoxFuture<Response<SyncStream>, Status>;

    fn call(&mut self, request: Request<Streaming<AgentMessage>>) -> Self::Future {
        let svc = self.0.clone();
        Box::pin(async move { svc.sync(request).await })
    }
}

#[cfg(test)]
mod tests {
    use levee_agent::proto::server_message;

    use super::*;

    /// The message [`Frame::Snapshot`] stands for, built as prost would.
    fn snapshot_message(snap: &SnapshotRow, nonce: u64) -> ServerMessage {
        ServerMessage {
            kind: Some(server_message::Kind::Snapshot(Snapshot {
                service: snap.service.clone(),
                revision: snap.revision,
                hash: snap.hash.clone(),
                body: Bytes::copy_from_slice(snap.body.as_bytes()),
                nonce,
                schema_version: SCHEMA_VERSION,
                environment: snap.environment.clone(),
                created_at_ms: snap.created_at,
            })),
        }
    }

    fn row(revision: u64) -> Arc<SnapshotRow> {
        Arc::new(SnapshotRow {
            environment: "prod".into(),
            service: "checkout".into(),
            revision,
            hash: "ab".repeat(32),
            body: format!("{{\"revision\":{revision},\"text\":\"{}\"}}", "x".repeat(300)),
            created_at: 1_764_590_400_000,
        })
    }

    /// A snapshot written from the shared bytes decodes as the message prost would have
    /// written for that stream, for nonces of every varint length, and its length is the one
    /// the size check uses.
    #[test]
    fn a_shared_snapshot_decodes_as_the_message_with_the_streams_nonce() {
        let snap = row(7);
        let encoded = EncodedSnapshots::default().get(&snap);
        for nonce in [0, 1, 127, 128, 300, 1 << 35, u64::MAX] {
            let mut buf = BytesMut::new();
            Frame::Snapshot { encoded: encoded.clone(), nonce }.encode(&mut buf);
            assert_eq!(buf.len(), Frame::snapshot_len(&encoded, nonce), "nonce {nonce}");
            let decoded = ServerMessage::decode(buf.freeze()).unwrap();
            assert_eq!(decoded, snapshot_message(&snap, nonce), "nonce {nonce}");
        }
    }

    /// What a session queues for its stream is small: every open stream's queue holds a
    /// block of 32 of them from its creation on (tokio allocates a channel's first block at once).
    #[test]
    fn a_queued_message_is_small() {
        assert!(
            std::mem::size_of::<crate::sync::Outgoing>() <= 64,
            "{}",
            std::mem::size_of::<crate::sync::Outgoing>()
        );
    }

    /// Other messages are written as prost writes them.
    #[test]
    fn other_messages_are_encoded_as_prost_does() {
        let msg = ServerMessage {
            kind: Some(server_message::Kind::GoAway(levee_agent::proto::GoAway {
                reason: "bye".into(),
                shutting_down: true,
            })),
        };
        let mut buf = BytesMut::new();
        Frame::Message(Box::new(msg.clone())).encode(&mut buf);
        assert_eq!(buf.freeze(), Bytes::from(msg.encode_to_vec()));
    }

    /// A snapshot is encoded once for every stream, while anyone holds it; one no one holds
    /// any more is forgotten at the next encoding.
    #[test]
    fn a_snapshot_is_encoded_once_while_it_is_held() {
        let cache = EncodedSnapshots::default();
        let first = row(1);
        let a = cache.get(&first);
        let b = cache.get(&first);
        assert_eq!(a.as_ptr(), b.as_ptr(), "the same bytes, not a second encoding");
        let second = row(2);
        cache.get(&second);
        assert_eq!(cache.map.lock().unwrap().len(), 2, "both held elsewhere");
        drop(first);
        cache.get(&row(3));
        let mut kept: Vec<u64> = cache.map.lock().unwrap().values().map(|(s, _)| s.revision).collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![2, 3], "the first, dropped, is forgotten");
    }
}
