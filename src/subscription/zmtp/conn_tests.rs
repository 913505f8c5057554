//! The connection against a scripted peer on an in-memory stream.

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use std::time::Duration;

use tokio::time::Instant;

use super::codec::{self, FLAG_COMMAND, FLAG_LONG, FLAG_MORE, GREETING_LEN, SocketType};
use super::{Connection, Heartbeat, ZmtpError};

fn ready_of(socket_type: &str) -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    let mut frame = vec![FLAG_COMMAND, body.len() as u8];
    frame.extend_from_slice(&body);
    frame
}

/// The peer's side of a handshake: greet, read our greeting and READY, answer as `peer_type`.
async fn peer_handshake(peer: &mut DuplexStream, peer_type: &str) -> Vec<u8> {
    peer_handshake_as(peer, peer_type, 1).await
}

/// [`peer_handshake`] announcing ZMTP 3.`minor`.
async fn peer_handshake_as(peer: &mut DuplexStream, peer_type: &str, minor: u8) -> Vec<u8> {
    let mut greeting = codec::greeting();
    greeting[11] = minor;
    peer.write_all(&greeting).await.unwrap();
    let mut ours = [0u8; GREETING_LEN];
    peer.read_exact(&mut ours).await.unwrap();
    let mut header = [0u8; 2];
    peer.read_exact(&mut header).await.unwrap();
    let mut ready = vec![0u8; header[1] as usize];
    peer.read_exact(&mut ready).await.unwrap();
    peer.write_all(&ready_of(peer_type)).await.unwrap();
    ready
}

async fn connected(
    limit: usize,
    socket_type: SocketType,
) -> (Connection<DuplexStream>, DuplexStream) {
    let (ours, mut peer) = tokio::io::duplex(1 << 16);
    let peer_type = match socket_type {
        SocketType::Sub => "PUB",
        SocketType::Dealer => "ROUTER",
        SocketType::Pub => "SUB",
        SocketType::Router => "DEALER",
    };
    let (conn, ready) = tokio::join!(
        Connection::handshake(ours, socket_type, limit),
        peer_handshake(&mut peer, peer_type)
    );
    assert!(ready.starts_with(b"\x05READY"));
    (conn.unwrap(), peer)
}

#[tokio::test]
async fn a_2_pow_62_frame_header_is_refused_before_any_allocation() {
    let (mut conn, mut peer) = connected(1 << 20, SocketType::Sub).await;
    let mut header = vec![FLAG_LONG];
    header.extend_from_slice(&(1u64 << 62).to_be_bytes());
    peer.write_all(&header).await.unwrap();
    let e = conn.recv().await.unwrap_err();
    assert!(e.is_oversized(), "{e}");
}

#[tokio::test]
async fn the_bound_covers_the_whole_message_and_every_frame() {
    let (mut conn, mut peer) = connected(1000, SocketType::Sub).await;
    // Two frames of 400 bytes fit (with their overhead); a third does not.
    let body = [7u8; 400];
    peer.write_all(&codec::encode_message(&[&body, &body]))
        .await
        .unwrap();
    let frames = conn.recv().await.unwrap();
    assert_eq!(
        frames.iter().map(|f| f.len()).collect::<Vec<_>>(),
        [400, 400]
    );
    peer.write_all(&codec::encode_message(&[&body, &body, &body]))
        .await
        .unwrap();
    assert!(conn.recv().await.unwrap_err().is_oversized());

    // Countless empty frames are bounded too.
    let (mut conn, mut peer) = connected(1000, SocketType::Sub).await;
    let writer = tokio::spawn(async move {
        for _ in 0..1000 {
            if peer.write_all(&[FLAG_MORE, 0]).await.is_err() {
                return;
            }
        }
    });
    assert!(conn.recv().await.unwrap_err().is_oversized());
    drop(conn);
    writer.await.unwrap();
}

#[tokio::test]
async fn frames_split_across_reads_and_long_frames_arrive_whole() {
    let (mut conn, mut peer) = connected(1 << 20, SocketType::Sub).await;
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    let wire = codec::encode_message(&[b"", &7u64.to_be_bytes(), &big]);
    let writer = tokio::spawn(async move {
        for chunk in wire.chunks(777) {
            peer.write_all(chunk).await.unwrap();
        }
        peer
    });
    let frames = conn.recv().await.unwrap();
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[1].as_ref(), 7u64.to_be_bytes());
    assert_eq!(frames[2].as_ref(), big.as_slice());
    let peer = writer.await.unwrap();
    drop(peer);
    assert!(matches!(conn.recv().await, Err(ZmtpError::Closed)));
}

#[tokio::test]
async fn ping_is_answered_between_messages() {
    let (mut conn, mut peer) = connected(1 << 20, SocketType::Dealer).await;
    let mut ping = vec![FLAG_COMMAND, 9, 4];
    ping.extend_from_slice(b"PING");
    ping.extend_from_slice(&[0, 0, b'a', b'b']);
    peer.write_all(&ping).await.unwrap();
    peer.write_all(&codec::encode_message(&[b"x"]))
        .await
        .unwrap();
    assert_eq!(
        conn.recv().await.unwrap(),
        vec![bytes::Bytes::from_static(b"x")]
    );
    let mut pong = [0u8; 9];
    peer.read_exact(&mut pong).await.unwrap();
    assert_eq!(&pong, b"\x04\x07\x04PONGab");
}

#[tokio::test]
async fn a_wrong_peer_type_an_error_or_a_huge_command_fails_the_handshake() {
    let (ours, mut peer) = tokio::io::duplex(1 << 16);
    let (conn, _) = tokio::join!(
        Connection::handshake(ours, SocketType::Sub, 1 << 20),
        peer_handshake(&mut peer, "ROUTER")
    );
    let e = conn.err().unwrap();
    assert!(e.to_string().contains("ROUTER"), "{e}");

    let (ours, mut peer) = tokio::io::duplex(1 << 16);
    let script = async {
        peer.write_all(&codec::greeting()).await.unwrap();
        let mut header = vec![FLAG_COMMAND | FLAG_LONG];
        header.extend_from_slice(&u64::MAX.to_be_bytes());
        peer.write_all(&header).await.unwrap();
    };
    let (conn, ()) = tokio::join!(
        Connection::handshake(ours, SocketType::Sub, 1 << 20),
        script
    );
    assert!(conn.err().unwrap().is_oversized());

    let (ours, mut peer) = tokio::io::duplex(1 << 16);
    let script = async {
        peer.write_all(&[b'G'; 64]).await.unwrap();
    };
    let (conn, ()) = tokio::join!(
        Connection::handshake(ours, SocketType::Sub, 1 << 20),
        script
    );
    assert!(matches!(conn, Err(ZmtpError::Protocol(_))));
}

#[tokio::test]
async fn sub_sends_the_3_0_subscription_and_dealer_sends_frames() {
    let (mut conn, mut peer) = connected(1 << 20, SocketType::Dealer).await;
    conn.send(&[b"", &5u64.to_be_bytes()]).await.unwrap();
    let mut wire = [0u8; 12];
    peer.read_exact(&mut wire).await.unwrap();
    assert_eq!(&wire[..4], &[FLAG_MORE, 0, 0, 8]);
    assert_eq!(&wire[4..], &5u64.to_be_bytes());
    let (mut conn, mut peer) = connected(1 << 20, SocketType::Sub).await;
    conn.subscribe_all().await.unwrap();
    let mut wire = [0u8; 3];
    peer.read_exact(&mut wire).await.unwrap();
    assert_eq!(wire, [0, 1, 1]);
}

const HB: Heartbeat = Heartbeat {
    interval: Duration::from_secs(1),
    timeout: Duration::from_secs(3),
};

/// A SUB connected to a PUB that announced ZMTP 3.`minor`, with the heartbeat `HB`.
async fn sub_with_heartbeat(minor: u8) -> (Connection<DuplexStream>, DuplexStream) {
    let (ours, mut peer) = tokio::io::duplex(1 << 16);
    let (conn, _) = tokio::join!(
        Connection::handshake(ours, SocketType::Sub, 1 << 20),
        peer_handshake_as(&mut peer, "PUB", minor)
    );
    (conn.unwrap().with_heartbeat(Some(HB)), peer)
}

/// The next frame the peer reads: flags and body.
async fn peer_reads_frame(peer: &mut DuplexStream) -> (u8, Vec<u8>) {
    let mut header = [0u8; 2];
    peer.read_exact(&mut header).await.unwrap();
    let mut body = vec![0u8; header[1] as usize];
    peer.read_exact(&mut body).await.unwrap();
    (header[0], body)
}

/// The body of our PING number `n`: TTL 30 tenths (the 3 s timeout), context `n`.
fn ping_body(n: u64) -> Vec<u8> {
    let mut body = b"\x04PING\x00\x1e".to_vec();
    body.extend_from_slice(&n.to_be_bytes());
    body
}

#[tokio::test(start_paused = true)]
async fn a_3_1_peer_is_pinged_every_interval_and_its_pongs_keep_the_connection() {
    let (mut conn, mut peer) = sub_with_heartbeat(1).await;
    assert!(conn.pings());
    let t0 = Instant::now();
    let reader = tokio::spawn(async move { (conn.recv().await, conn) });
    // Ten intervals, each PING answered: well past the timeout, and still connected.
    for n in 1..=10 {
        let (flags, body) = peer_reads_frame(&mut peer).await;
        assert_eq!((flags, body), (FLAG_COMMAND, ping_body(n)));
        assert_eq!(t0.elapsed(), n as u32 * HB.interval);
        peer.write_all(&codec::pong(&n.to_be_bytes()))
            .await
            .unwrap();
    }
    peer.write_all(&codec::encode_message(&[b"t", b"m"]))
        .await
        .unwrap();
    let (frames, mut conn) = reader.await.unwrap();
    assert_eq!(frames.unwrap().len(), 2);
    // A peer that stops answering is given up after the timeout: PINGs at 1 s and 2 s, silence
    // declared at 3 s.
    let t1 = Instant::now();
    let e = conn.recv().await.unwrap_err();
    assert!(
        matches!(e, ZmtpError::Silent { .. }) && e.is_timeout(),
        "{e}"
    );
    assert_eq!(t1.elapsed(), HB.timeout);
    drop(conn);
    let mut sent = Vec::new();
    peer.read_to_end(&mut sent).await.unwrap();
    assert_eq!(sent.len(), 2 * (2 + ping_body(11).len()), "two PINGs");
}

#[tokio::test(start_paused = true)]
async fn any_traffic_counts_as_alive_and_a_message_split_by_the_timer_arrives_whole() {
    let (mut conn, mut peer) = sub_with_heartbeat(1).await;
    let wire = codec::encode_message(&[b"topic", &[7u8; 100]]);
    let writer = tokio::spawn(async move {
        // Never a PONG: only message bytes, each part within the timeout of the previous one.
        let (first, rest) = wire.split_at(60);
        peer.write_all(first).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        peer.write_all(rest).await.unwrap();
        peer
    });
    let frames = conn.recv().await.unwrap();
    assert_eq!(frames[0].as_ref(), b"topic");
    assert_eq!(frames[1].as_ref(), &[7u8; 100]);
    let mut peer = writer.await.unwrap();
    // Meanwhile PINGs went out (at 1 s and 2 s) and nothing was lost to them.
    assert_eq!(peer_reads_frame(&mut peer).await.1, ping_body(1));
    assert_eq!(peer_reads_frame(&mut peer).await.1, ping_body(2));
}

#[tokio::test(start_paused = true)]
async fn a_3_0_peer_is_never_pinged_nor_timed_out() {
    let (mut conn, mut peer) = sub_with_heartbeat(0).await;
    assert!(!conn.pings());
    assert_eq!(conn.peer_version().minor, 0);
    // An hour of silence: still waiting, and not a byte sent.
    let waited = tokio::time::timeout(Duration::from_secs(3600), conn.recv()).await;
    assert!(waited.is_err(), "still waiting for the peer");
    drop(conn);
    let mut sent = Vec::new();
    peer.read_to_end(&mut sent).await.unwrap();
    assert!(sent.is_empty(), "{sent:?}");
}

#[tokio::test(start_paused = true)]
async fn a_reader_held_up_by_its_consumer_does_not_blame_the_peer() {
    let (mut conn, mut peer) = sub_with_heartbeat(1).await;
    peer.write_all(&codec::encode_message(&[b"a"]))
        .await
        .unwrap();
    conn.recv().await.unwrap();
    // The consumer takes 10 s (back-pressure) before it reads again; the next message comes
    // 1.5 s after that: within the timeout of when we listened again.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        peer.write_all(&codec::encode_message(&[b"b"]))
            .await
            .unwrap();
        peer
    });
    assert_eq!(conn.recv().await.unwrap()[0].as_ref(), b"b");
    // One PING when it listened again (none in a burst for the missed slots), one a second later.
    let mut peer = writer.await.unwrap();
    drop(conn);
    let mut sent = Vec::new();
    peer.read_to_end(&mut sent).await.unwrap();
    assert_eq!(sent.len(), 2 * (2 + ping_body(1).len()), "{sent:?}");
}
