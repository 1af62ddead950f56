//! The codec of `WorkerControl`: its messages are the API's serde types (`squadron-api`),
//! encoded as JSON inside gRPC framing. Hand-written because tonic ships only the protobuf
//! codec; the trait is small and this one adds nothing but serde_json.

use std::marker::PhantomData;

use bytes::{Buf, BufMut};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Encodes `E` and decodes `D` as JSON.
#[derive(Debug)]
pub struct JsonCodec<E, D>(PhantomData<(E, D)>);

impl<E, D> Default for JsonCodec<E, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<E, D> Codec for JsonCodec<E, D>
where
    E: Serialize + Send + 'static,
    D: DeserializeOwned + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = JsonEncoder<E>;
    type Decoder = JsonDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        JsonEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        JsonDecoder(PhantomData)
    }
}

#[derive(Debug)]
pub struct JsonEncoder<E>(PhantomData<E>);

impl<E: Serialize> Encoder for JsonEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        serde_json::to_writer(dst.writer(), &item)
            .map_err(|e| Status::internal(format!("encoding the JSON message: {e}")))
    }
}

#[derive(Debug)]
pub struct JsonDecoder<D>(PhantomData<D>);

impl<D: DeserializeOwned> Decoder for JsonDecoder<D> {
    type Item = D;
    type Error = Status;

    /// A message that does not decode names the field (`body.lease: invalid type …`); the
    /// size is bounded before this by the service's decoding limit.
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        let mut json = serde_json::Deserializer::from_reader(src.reader());
        serde_path_to_error::deserialize(&mut json)
            .map(Some)
            .map_err(|e| {
                let field = e.path().to_string();
                Status::invalid_argument(format!("invalid field {field}: {}", e.inner()))
            })
    }
}
