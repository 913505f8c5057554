//! The tests' player is the product's publisher ([`Publisher`], what `mooncake_conductor play`
//! serves fixtures with), bound on free loopback ports; a failed send fails the test.

use bytes::Bytes;
use mooncake_conductor::fixture::publisher::Publisher;

pub struct Player {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    publisher: Publisher,
}

impl Player {
    /// Bind a PUB (and a ROUTER when `with_replay`) on free loopback ports; sequence starts at
    /// `first_seq` (0 for engines, 1 for the Mooncake store).
    pub async fn start(with_replay: bool, first_seq: u64) -> Player {
        let publisher = Publisher::loopback(with_replay, first_seq)
            .await
            .expect("bind the player's sockets");
        Player {
            endpoint: publisher.endpoint.clone(),
            replay_endpoint: publisher.replay_endpoint.clone(),
            publisher,
        }
    }

    /// Connections the PUB accepted so far.
    pub fn accepted(&self) -> usize {
        self.publisher.accepted()
    }

    /// Replay requests the ROUTER answered in full so far.
    pub fn replays_answered(&self) -> usize {
        self.publisher.replays_answered()
    }

    pub fn next_seq(&self) -> u64 {
        self.publisher.next_seq()
    }

    /// Publish a payload with the next seq (and keep it for replay).
    pub async fn publish(&mut self, payload: Vec<u8>) -> u64 {
        self.publisher.publish(payload).await.expect("PUB send")
    }

    /// Take the next seq and keep the payload for replay, but lose it on the live stream.
    pub fn publish_lost(&mut self, payload: Vec<u8>) -> u64 {
        self.publisher.publish_lost(payload)
    }

    /// Send raw frames on the live stream (malformed-input tests).
    pub async fn send_raw(&mut self, parts: Vec<Bytes>) {
        self.publisher.send_raw(parts).await.expect("PUB send");
    }

    /// Re-send an already published seq (used to beat the slow-joiner race: duplicates are ignored).
    pub async fn resend(&mut self, seq: u64) {
        self.publisher.resend(seq).await.expect("PUB send");
    }

    /// The publisher process restarted: seq starts over and the replay buffer is empty.
    pub fn restart(&mut self, first_seq: u64) {
        self.publisher.restart(first_seq);
    }

    /// From now on the replay buffer keeps only its newest `keep` batches, as a publisher's
    /// bounded buffer does.
    pub fn keep_at_most(&mut self, keep: usize) {
        self.publisher.limit_replay(Some(keep));
    }

    /// Keep only the newest `keep` batches in the replay buffer.
    pub fn truncate_replay(&self, keep: usize) {
        self.publisher.truncate_replay(keep);
    }
}
