//! `play` reads its peers through the service's bounded ZMTP reader: a peer announcing a
//! 2^62-byte frame (9 bytes on the wire) at the replay socket or at the PUB loses its own
//! connection, and `play` goes on publishing and answering replay requests.

use std::time::Duration;

use mooncake_conductor::subscription::socket::END_OF_REPLAY_SEQ;
use mooncake_conductor::subscription::zmtp::{Connection, SocketType};

use crate::support::raw_zmtp::{long_frame_header, send_after_handshake};
use crate::support::tool::Tool;
use crate::support::{WAIT, free_port};

const LIMIT: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2_pow_62_frame_header_at_play_leaves_it_publishing_and_replaying() {
    let (bind, replay_bind) = (
        format!("tcp://127.0.0.1:{}", free_port()),
        format!("tcp://127.0.0.1:{}", free_port()),
    );
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/events/vllm_basic.jsonl");
    // Publishes once a subscriber joined, then re-sends the last batch while it lingers.
    let _player = Tool::spawn(&[
        "play",
        file.to_str().unwrap(),
        "--bind",
        &bind,
        "--replay-bind",
        &replay_bind,
        "--as-fast",
        "--wait-subscriber",
        "30",
        "--linger",
        "60",
        "--repeat-last",
        "0.1",
    ]);
    // The hostile peers: each connection is closed on the header, before anything is reserved.
    for (endpoint, as_type) in [(&replay_bind, "DEALER"), (&bind, "SUB")] {
        let closed =
            send_after_handshake(endpoint, as_type, &long_frame_header(1 << 62), WAIT).await;
        assert!(
            closed,
            "play dropped the {as_type} that announced 2^62 bytes"
        );
    }

    // A subscriber still gets the live stream: `[topic, seq, payload]`.
    let mut sub = Connection::connect(&bind, SocketType::Sub, LIMIT, None)
        .await
        .expect("play still accepts subscribers");
    sub.subscribe_all().await.unwrap();
    let live = tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("a live message")
        .unwrap();
    assert_eq!(live.len(), 3, "{live:?}");
    let seq = u64::from_be_bytes(live[1].as_ref().try_into().unwrap());

    // And a replay from the start answers the buffered batches, then the end marker.
    let mut dealer = Connection::connect(&replay_bind, SocketType::Dealer, LIMIT, None)
        .await
        .expect("play still accepts replay requests");
    dealer.send(&[b"", &0u64.to_be_bytes()]).await.unwrap();
    let mut replayed = Vec::new();
    loop {
        let frames = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
            .await
            .expect("a replay message")
            .unwrap();
        assert_eq!(
            frames.first().map(|f| f.is_empty()),
            Some(true),
            "{frames:?}"
        );
        let at = u64::from_be_bytes(frames[2].as_ref().try_into().unwrap());
        if at == END_OF_REPLAY_SEQ {
            break;
        }
        replayed.push(at);
    }
    assert!(
        replayed.contains(&seq),
        "{replayed:?} holds the live seq {seq}"
    );
}
