//! The fixture player: publishes payloads as an engine does (PUB `[topic, seq BE8, payload]`) and
//! answers replay requests on a ROUTER with vLLM's framing, with knobs to lose live messages,
//! restart the sequence and truncate the replay buffer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

type Buffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

pub struct Player {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    socket: PubSocket,
    buffer: Buffer,
    next_seq: u64,
    /// The replay buffer keeps at most this many of the newest batches.
    capacity: Option<usize>,
    cancel: CancellationToken,
}

fn frames(parts: Vec<Bytes>) -> ZmqMessage {
    ZmqMessage::try_from(parts).expect("non-empty message")
}

impl Player {
    /// Bind a PUB (and a ROUTER when `with_replay`) on free loopback ports; sequence starts at
    /// `first_seq` (0 for engines, 1 for the Mooncake store).
    pub async fn start(with_replay: bool, first_seq: u64) -> Player {
        let mut socket = PubSocket::new();
        let bound = socket.bind("tcp://127.0.0.1:0").await.expect("bind PUB");
        let buffer: Buffer = Arc::default();
        let cancel = CancellationToken::new();
        let replay_endpoint = if with_replay {
            let mut router = RouterSocket::new();
            let bound = router.bind("tcp://127.0.0.1:0").await.expect("bind ROUTER");
            tokio::spawn(serve_replay(router, buffer.clone(), cancel.clone()));
            Some(bound.to_string())
        } else {
            None
        };
        Player {
            endpoint: bound.to_string(),
            replay_endpoint,
            socket,
            buffer,
            next_seq: first_seq,
            capacity: None,
            cancel,
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Publish a payload with the next seq (and keep it for replay).
    pub async fn publish(&mut self, payload: Vec<u8>) -> u64 {
        let seq = self.record(payload.clone());
        self.send(seq, payload).await;
        seq
    }

    /// Take the next seq and keep the payload for replay, but lose it on the live stream.
    pub fn publish_lost(&mut self, payload: Vec<u8>) -> u64 {
        self.record(payload)
    }

    /// Send raw frames on the live stream (malformed-input tests).
    pub async fn send_raw(&mut self, parts: Vec<Bytes>) {
        self.socket.send(frames(parts)).await.expect("PUB send");
    }

    /// Re-send an already published seq (used to beat the slow-joiner race: duplicates are ignored).
    pub async fn resend(&mut self, seq: u64) {
        let payload = self
            .buffer
            .lock()
            .unwrap()
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, p)| p.clone());
        if let Some(payload) = payload {
            self.send(seq, payload.to_vec()).await;
        }
    }

    /// The publisher process restarted: seq starts over and the replay buffer is empty.
    pub fn restart(&mut self, first_seq: u64) {
        self.next_seq = first_seq;
        self.buffer.lock().unwrap().clear();
    }

    /// From now on the replay buffer keeps only its newest `keep` batches, as a publisher's
    /// bounded buffer does.
    pub fn keep_at_most(&mut self, keep: usize) {
        self.capacity = Some(keep);
        self.truncate_replay(keep);
    }

    /// Keep only the newest `keep` batches in the replay buffer.
    pub fn truncate_replay(&self, keep: usize) {
        let mut buffer = self.buffer.lock().unwrap();
        while buffer.len() > keep {
            buffer.pop_front();
        }
    }

    fn record(&mut self, payload: Vec<u8>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.buffer
            .lock()
            .unwrap()
            .push_back((seq, Bytes::from(payload)));
        if let Some(keep) = self.capacity {
            self.truncate_replay(keep);
        }
        seq
    }

    async fn send(&mut self, seq: u64, payload: Vec<u8>) {
        let parts = vec![
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ];
        self.socket.send(frames(parts)).await.expect("PUB send");
    }
}

impl Drop for Player {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// vLLM's replay protocol: `[identity, b"", start_seq]` in; every buffered batch with seq >= start
/// as `[identity, b"", topic, seq, payload]`, then `[identity, b"", b"", 0xff.., b""]`.
async fn serve_replay(mut router: RouterSocket, buffer: Buffer, cancel: CancellationToken) {
    loop {
        let request = tokio::select! {
            _ = cancel.cancelled() => return,
            r = router.recv() => match r { Ok(m) => m.into_vec(), Err(_) => return },
        };
        let [identity, _empty, start] = request.as_slice() else {
            continue;
        };
        let mut start_bytes = [0u8; 8];
        if start.len() != 8 {
            continue;
        }
        start_bytes.copy_from_slice(start);
        let start = u64::from_be_bytes(start_bytes);
        let batches: Vec<(u64, Bytes)> = buffer
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, _)| *s >= start)
            .cloned()
            .collect();
        for (seq, payload) in batches {
            let parts = vec![
                identity.clone(),
                Bytes::new(),
                Bytes::new(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ];
            if router.send(frames(parts)).await.is_err() {
                break;
            }
        }
        let end = vec![
            identity.clone(),
            Bytes::new(),
            Bytes::new(),
            Bytes::copy_from_slice(&u64::MAX.to_be_bytes()),
            Bytes::new(),
        ];
        let _ = router.send(frames(end)).await;
    }
}
