//! The load tool's gRPC client: unary calls on one HTTP/2 connection through the h2 crate, with
//! what tonic's channel adds per call taken out (measured in
//! `docs/grpc-path.md`):
//!
//! - the request is encoded once, outside the timed loop, and each call queues its HEADERS and
//!   its single DATA frame with END_STREAM set before the connection is polled, so both leave in
//!   one write (tonic's channel sends HEADERS, DATA and an empty END_STREAM DATA frame, and the
//!   server wakes for each);
//! - the connection is driven by the calling task itself, not a spawned one: no task or thread
//!   hand-off between the caller, a buffer worker and the connection, as with the HTTP/1.1
//!   client, which also does its own socket I/O;
//! - the answer is checked (grpc-status, `ret`, the number of instances) by reading its
//!   top-level fields, without decoding it into prost's maps, as the HTTP client checks only the
//!   status line.
//!
//! One connection per client: nothing else polls it between calls, which is fine with a server
//! that sends no keep-alive pings (frames that arrive between calls are read by the next one) and
//! with connections that are dropped before the service stops (a graceful HTTP/2 shutdown waits
//! for an answer to its ping; the Python client has a thread for that, `python/src/idle.rs`).

use std::future::poll_fn;
use std::pin::Pin;

use bytes::{Buf, Bytes, BytesMut};
use h2::client::{Connection, SendRequest};
use prost::Message;
use tokio::net::TcpStream;

/// The gRPC method of a query (`proto/conductor.proto`).
pub(crate) const QUERY: &str = "/mooncake.conductor.v1.Conductor/Query";

/// A unary call's failure, as text for the report.
type Failure = String;

pub(crate) struct LeanGrpc {
    send: SendRequest<Bytes>,
    connection: Connection<TcpStream, Bytes>,
    authority: String,
}

/// A message framed as a gRPC body: uncompressed flag, big-endian length, the message.
pub(crate) fn framed(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut body = BytesMut::with_capacity(5 + len);
    body.extend_from_slice(&[0]);
    body.extend_from_slice(&(len as u32).to_be_bytes());
    message.encode(&mut body).expect("capacity reserved");
    body.freeze()
}

impl LeanGrpc {
    pub(crate) async fn connect(port: u16) -> std::io::Result<LeanGrpc> {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        // HEADERS+DATA leave in one segment; no Nagle delay waiting for the previous answer's ACK.
        tcp.set_nodelay(true)?;
        // Windows as hyper's client sets them (tonic's channel): far above one answer.
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(2 << 20)
            .initial_connection_window_size(5 << 20)
            .handshake(tcp)
            .await
            .map_err(std::io::Error::other)?;
        Ok(LeanGrpc {
            send,
            connection,
            authority: format!("127.0.0.1:{port}"),
        })
    }

    /// Drive `future` and the connection together on this task until `future` is done.
    async fn driven<F: Future>(
        connection: &mut Connection<TcpStream, Bytes>,
        future: F,
    ) -> F::Output {
        let mut future = std::pin::pin!(future);
        let mut closed = false;
        poll_fn(|cx| {
            if !closed {
                // Ready only once the connection has ended; its error reaches `future` too.
                closed = Pin::new(&mut *connection).poll(cx).is_ready();
            }
            future.as_mut().poll(cx)
        })
        .await
    }

    /// One unary call of `path` with an already framed body: the answer's message bytes.
    pub(crate) async fn unary(&mut self, path: &str, body: &Bytes) -> Result<Bytes, Failure> {
        let request = http::Request::post(format!("http://{}{path}", self.authority))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .map_err(|e| e.to_string())?;
        let (send, connection) = (&mut self.send, &mut self.connection);
        let call = async {
            poll_fn(|cx| send.poll_ready(cx))
                .await
                .map_err(|e| e.to_string())?;
            let (response, mut stream) = send
                .send_request(request, false)
                .map_err(|e| e.to_string())?;
            stream
                .send_data(body.clone(), true)
                .map_err(|e| e.to_string())?;
            let (head, mut body) = response.await.map_err(|e| e.to_string())?.into_parts();
            let mut data = BytesMut::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                let _ = body.flow_control().release_capacity(chunk.len());
                data.extend_from_slice(&chunk);
            }
            let trailers = body.trailers().await.map_err(|e| e.to_string())?;
            // A Trailers-Only answer (an error status) carries grpc-status in its headers.
            let status = trailers
                .as_ref()
                .and_then(|t| t.get("grpc-status"))
                .or_else(|| head.headers.get("grpc-status"))
                .map(|v| v.as_bytes().to_vec());
            if status.as_deref() != Some(b"0") {
                return Err(format!("grpc-status {status:?}"));
            }
            Ok(data.freeze())
        };
        let mut data = LeanGrpc::driven(connection, call).await?;
        if data.len() < 5 || data[0] != 0 {
            return Err("not one uncompressed gRPC message".into());
        }
        data.advance(1);
        let len = data.get_u32() as usize;
        if data.len() != len {
            return Err(format!(
                "message of {} bytes, prefix says {len}",
                data.len()
            ));
        }
        Ok(data)
    }
}

/// `ret` and the number of `hits` entries of a QueryResponse (fields 1 and 3), read from its
/// top-level fields only; `None` if it is not well-formed protobuf.
pub(crate) fn ret_and_instances(mut message: &[u8]) -> Option<(i32, usize)> {
    let (mut ret, mut instances) = (0, 0);
    while !message.is_empty() {
        let key = prost::encoding::decode_varint(&mut message).ok()?;
        match (key >> 3, key & 7) {
            (1, 0) => ret = prost::encoding::decode_varint(&mut message).ok()? as i32,
            (_, 0) => {
                prost::encoding::decode_varint(&mut message).ok()?;
            }
            (field, 2) => {
                let len = prost::encoding::decode_varint(&mut message).ok()? as usize;
                message = message.get(len..)?;
                instances += usize::from(field == 3);
            }
            _ => return None,
        }
    }
    Some((ret, instances))
}
