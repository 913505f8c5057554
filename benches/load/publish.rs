//! Publishers and their payloads: the shared prompt and its block keys, a msgpack writer, vLLM
//! event batches, PUB sockets and the seq-0 handshake.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mooncake_conductor::hashing::{HashProfile, PrefixKeys};
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

use crate::BS;
use crate::client::{HttpConn, status};

/// The shared prompt: deterministic token ids in a realistic vocabulary range. The Python
/// benchmark builds the same list.
pub(crate) fn prompt(len: usize) -> Vec<i32> {
    (0..len).map(|i| ((i * 7919 + 17) % 32000) as i32).collect()
}

pub(crate) const PROFILE: [(&str, &str); 4] = [
    ("strategy", "vllm_v1"),
    ("algorithm", "sha256_cbor"),
    ("python_hash_seed", "0"),
    ("index_projection", "low64_be"),
];

/// The event hashes vLLM publishes for the complete blocks of `tokens`.
pub(crate) fn block_keys(tokens: &[i32]) -> Vec<u64> {
    let profile = HashProfile::from_pairs(PROFILE).expect("profile");
    let hasher = profile.hasher("", "");
    let mut chain = hasher.chain(BS, tokens);
    (0..chain.num_blocks()).map(|i| chain.key(i).0).collect()
}

pub(crate) use mooncake_conductor::test_rng::mix64 as mix;

/// The msgpack values the payloads need, written directly with `rmp` so that encoding stays
/// cheap next to what the service does with them.
pub(crate) enum Mp<'a> {
    Str(&'a str),
    U(u64),
    Nil,
    Us(&'a [u64]),
    Is(&'a [i32]),
    Nils(usize),
    Bin(&'a [u8]),
    Arr(Vec<Mp<'a>>),
    Map(Vec<(&'a str, Mp<'a>)>),
}

pub(crate) fn write(w: &mut Vec<u8>, v: &Mp) {
    use rmp::encode::*;
    const OK: &str = "writing to a Vec cannot fail";
    let len = |n: usize| u32::try_from(n).expect("msgpack length");
    let uint = |w: &mut Vec<u8>, u: u64| _ = write_uint(w, u).expect(OK);
    match v {
        Mp::Str(s) => write_str(w, s).expect(OK),
        Mp::U(u) => uint(w, *u),
        Mp::Nil => write_nil(w).expect(OK),
        Mp::Us(xs) => {
            write_array_len(w, len(xs.len())).expect(OK);
            xs.iter().for_each(|x| uint(w, *x));
        }
        Mp::Is(xs) => {
            write_array_len(w, len(xs.len())).expect(OK);
            xs.iter()
                .for_each(|x| _ = write_sint(w, (*x).into()).expect(OK));
        }
        Mp::Nils(n) => {
            write_array_len(w, len(*n)).expect(OK);
            (0..*n).for_each(|_| write_nil(w).expect(OK));
        }
        Mp::Bin(b) => write_bin(w, b).expect(OK),
        Mp::Arr(items) => {
            write_array_len(w, len(items.len())).expect(OK);
            items.iter().for_each(|v| write(w, v));
        }
        Mp::Map(pairs) => {
            write_map_len(w, len(pairs.len())).expect(OK);
            for (k, v) in pairs {
                write_str(w, k).expect(OK);
                write(w, v);
            }
        }
    }
}

/// A vLLM `BlockStored` map event with every field vLLM sends.
pub(crate) fn stored<'a>(
    hashes: &'a [u64],
    parent: Option<u64>,
    tokens: &'a [i32],
    medium: &'a str,
) -> Mp<'a> {
    Mp::Map(vec![
        ("type", Mp::Str("BlockStored")),
        ("block_hashes", Mp::Us(hashes)),
        ("parent_block_hash", parent.map_or(Mp::Nil, Mp::U)),
        ("token_ids", Mp::Is(tokens)),
        ("block_size", Mp::U(BS.into())),
        ("lora_id", Mp::Nil),
        ("medium", Mp::Str(medium)),
        ("lora_name", Mp::Nil),
        ("extra_keys", Mp::Nils(hashes.len())),
        ("group_idx", Mp::U(0)),
        ("kv_cache_spec_kind", Mp::Str("full_attention")),
    ])
}

pub(crate) fn removed<'a>(hashes: &'a [u64], medium: &'a str) -> Mp<'a> {
    let (kind, group) = (Mp::Str("BlockRemoved"), Mp::U(0));
    Mp::Map(vec![
        ("type", kind),
        ("block_hashes", Mp::Us(hashes)),
        ("medium", Mp::Str(medium)),
        ("group_idx", group),
    ])
}

/// msgspec's `[ts, events, dp_rank]` array batch (ts is float seconds; never read back here).
pub(crate) fn batch(events: Vec<Mp>, rank: u32) -> Bytes {
    let mut w = Vec::new();
    write(
        &mut w,
        &Mp::Arr(vec![
            Mp::U(1_700_000_000),
            Mp::Arr(events),
            Mp::U(rank.into()),
        ]),
    );
    Bytes::from(w)
}

/// An engine's PUB socket: `[topic, seq BE8, payload]` like vLLM.
pub(crate) struct Publisher {
    pub(crate) instance: String,
    pub(crate) rank: u32,
    pub(crate) endpoint: String,
    socket: PubSocket,
    next_seq: u64,
}

impl Publisher {
    pub(crate) async fn bind(instance: String, rank: u32) -> Publisher {
        let mut socket = PubSocket::new();
        let endpoint = socket
            .bind("tcp://127.0.0.1:0")
            .await
            .expect("bind PUB")
            .to_string();
        Publisher {
            instance,
            rank,
            endpoint,
            socket,
            next_seq: 0,
        }
    }

    pub(crate) fn service(&self) -> String {
        format!("{}|default|{}", self.instance, self.rank)
    }

    async fn send_seq(&mut self, seq: u64, payload: Bytes) {
        let parts = vec![
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ];
        let message = ZmqMessage::try_from(parts).expect("frames");
        self.socket.send(message).await.expect("PUB send");
    }

    pub(crate) async fn publish(&mut self, payload: Bytes) {
        self.next_seq += 1;
        self.send_seq(self.next_seq - 1, payload).await;
    }
}

/// Send each publisher's seq-0 batch again and again until its subscription applied it: a PUB
/// drops what it sends before the SUB's subscription arrived, and duplicates are ignored.
pub(crate) async fn handshake(pubs: &mut [Publisher], first: &[Bytes], http: &mut HttpConn) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done: HashSet<String> = (status(http).await.iter())
            .filter(|s| s["last_seq"].as_u64().is_some())
            .filter_map(|s| s["service"].as_str().map(str::to_owned))
            .collect();
        let mut pending = 0;
        for (p, payload) in pubs.iter_mut().zip(first) {
            if !done.contains(&p.service()) {
                pending += 1;
                p.send_seq(0, payload.clone()).await;
            }
        }
        if pending == 0 {
            pubs.iter_mut().for_each(|p| p.next_seq = 1);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pending} subscriptions never applied seq 0"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
