//! The byte layout of ZMTP 3.0 and 3.1 with the NULL mechanism, without any I/O: the greeting,
//! frame headers, and the commands this subscriber sends or must understand.

use super::ZmtpError;

/// A greeting is always 64 bytes.
pub const GREETING_LEN: usize = 64;
/// Flag bits of a frame's first byte; the other five bits are reserved and ignored.
pub const FLAG_MORE: u8 = 0x01;
pub const FLAG_LONG: u8 = 0x02;
pub const FLAG_COMMAND: u8 = 0x04;
/// The largest command body accepted. Commands carry a name and a few short properties (READY's
/// socket type and identity, a PING's context of at most 16 bytes): 64 KiB is far above any real
/// one and keeps a hostile handshake cheap.
pub const MAX_COMMAND_BYTES: u64 = 64 * 1024;

/// The socket kinds spoken here: the subscriber's SUB and DEALER, and the PUB and ROUTER the
/// fixture publisher serves (`crate::fixture::serve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    Sub,
    Dealer,
    Pub,
    Router,
}

impl SocketType {
    pub const fn name(self) -> &'static str {
        match self {
            SocketType::Sub => "SUB",
            SocketType::Dealer => "DEALER",
            SocketType::Pub => "PUB",
            SocketType::Router => "ROUTER",
        }
    }

    /// Whether a peer announcing `peer` may talk to this socket (the pairs of the ZeroMQ socket
    /// patterns: SUB with PUB or XPUB; DEALER with ROUTER, DEALER or REP; and back).
    pub fn accepts(self, peer: &[u8]) -> bool {
        match self {
            SocketType::Sub => matches!(peer, b"PUB" | b"XPUB"),
            SocketType::Dealer => matches!(peer, b"ROUTER" | b"DEALER" | b"REP"),
            SocketType::Pub => matches!(peer, b"SUB" | b"XSUB"),
            SocketType::Router => matches!(peer, b"DEALER" | b"REQ" | b"ROUTER"),
        }
    }
}

/// Our greeting: signature, version 3.1, mechanism NULL, client role. 3.1 is what lets us send
/// PING (and what makes libzmq answer it); everything else we send is valid 3.0 as well, so a
/// 3.0 peer is served by the same bytes (see `docs/zmtp.md`).
pub fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 1;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// The ZMTP version a peer's greeting announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PeerVersion {
    pub major: u8,
    pub minor: u8,
}

impl PeerVersion {
    /// Whether the peer speaks ZMTP 3.1 or later, which defines PING and PONG. A 3.0 peer is
    /// never pinged: it would not answer, and may not even accept an unknown command.
    pub fn answers_ping(self) -> bool {
        self >= PeerVersion { major: 3, minor: 1 }
    }
}

/// Check a peer's greeting: the signature, a 3.x (or later) version, and the NULL mechanism.
/// Returns the version it announced.
pub fn check_greeting(g: &[u8; GREETING_LEN]) -> Result<PeerVersion, ZmtpError> {
    if g[0] != 0xFF || g[9] & 0x01 != 0x01 {
        return Err(ZmtpError::Protocol("not a ZMTP greeting".into()));
    }
    if g[10] < 3 {
        return Err(ZmtpError::Protocol(format!(
            "peer speaks ZMTP {}.{}; 3.0 or later is needed",
            g[10], g[11]
        )));
    }
    let mechanism = &g[12..32];
    let name_len = mechanism.iter().position(|&b| b == 0).unwrap_or(20);
    if &mechanism[..name_len] != b"NULL" || mechanism[name_len..].iter().any(|&b| b != 0) {
        return Err(ZmtpError::Protocol(format!(
            "peer wants security mechanism {:?}; only NULL is supported",
            String::from_utf8_lossy(&mechanism[..name_len])
        )));
    }
    Ok(PeerVersion {
        major: g[10],
        minor: g[11],
    })
}

/// Append one frame (header and body) to `out`.
pub fn encode_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() > 255 {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags & !FLAG_LONG);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

/// A multipart message as frames on the wire.
pub fn encode_message(frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(frames.iter().map(|f| f.len() + 9).sum());
    for (i, frame) in frames.iter().enumerate() {
        let more = if i + 1 < frames.len() { FLAG_MORE } else { 0 };
        encode_frame(&mut out, more, frame);
    }
    out
}

/// A command frame: name length, name, then the body.
fn encode_command(name: &[u8], body: &[u8]) -> Vec<u8> {
    let mut command = Vec::with_capacity(1 + name.len() + body.len());
    command.push(name.len() as u8);
    command.extend_from_slice(name);
    command.extend_from_slice(body);
    let mut out = Vec::with_capacity(command.len() + 9);
    encode_frame(&mut out, FLAG_COMMAND, &command);
    out
}

/// READY with our socket type (and, for a DEALER, an empty identity: the ROUTER picks one).
pub fn ready(socket_type: SocketType) -> Vec<u8> {
    let mut props = Vec::new();
    push_property(&mut props, b"Socket-Type", socket_type.name().as_bytes());
    if socket_type == SocketType::Dealer {
        push_property(&mut props, b"Identity", b"");
    }
    encode_command(b"READY", &props)
}

fn push_property(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value);
}

/// The answer to a PING: PONG with the PING's context.
pub fn pong(context: &[u8]) -> Vec<u8> {
    encode_command(b"PONG", context)
}

/// The most context a PING may carry (ZMTP 3.1).
pub const MAX_PING_CONTEXT: usize = 16;

/// A PING (ZMTP 3.1 heartbeat): the TTL, 2 bytes big-endian in tenths of a second (how long the
/// peer may wait for our next traffic before it gives the connection up; 0: no limit), then a
/// context of at most 16 bytes that the peer's PONG echoes. `ttl` is rounded up to a tenth of a
/// second and capped at the largest TTL the field holds (6553.5 s); a longer context is cut.
pub fn ping(ttl: std::time::Duration, context: &[u8]) -> Vec<u8> {
    let tenths = ttl.as_millis().div_ceil(100).min(u128::from(u16::MAX)) as u16;
    let mut body = Vec::with_capacity(2 + MAX_PING_CONTEXT);
    body.extend_from_slice(&tenths.to_be_bytes());
    body.extend_from_slice(&context[..context.len().min(MAX_PING_CONTEXT)]);
    encode_command(b"PING", &body)
}

/// Subscribe to every topic, in ZMTP 3.0's form: a one-frame message `0x01` + topic (empty).
/// libzmq (pyzmq), which vLLM and SGLang publish with, and zmq.rs accept this form from a 3.0
/// peer.
pub fn subscribe_all() -> Vec<u8> {
    encode_message(&[&[0x01]])
}

/// A command the subscriber understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// READY with the peer's socket type (absent if the peer sent none).
    Ready { socket_type: Option<&'a [u8]> },
    /// ERROR: the peer refuses the connection, with its reason.
    Error(String),
    /// PING (ZMTP 3.1 heartbeat): answered with PONG and this context.
    Ping { context: &'a [u8] },
    /// PONG: the answer to one of our PINGs, with that PING's context. Like any byte from the
    /// peer, it shows the connection alive.
    Pong { context: &'a [u8] },
    /// Anything else (SUBSCRIBE sent to us, future commands): ignored.
    Other,
}

/// Parse a command frame's body.
pub fn parse_command(body: &[u8]) -> Result<Command<'_>, ZmtpError> {
    let bad = |what: &str| ZmtpError::Protocol(format!("malformed command: {what}"));
    let (&name_len, rest) = body.split_first().ok_or_else(|| bad("empty"))?;
    let name_len = name_len as usize;
    if rest.len() < name_len {
        return Err(bad("name longer than the frame"));
    }
    let (name, data) = rest.split_at(name_len);
    match name {
        b"READY" => {
            let mut socket_type = None;
            for (key, value) in properties(data).map_err(|e| bad(&e))? {
                if key.eq_ignore_ascii_case(b"Socket-Type") {
                    socket_type = Some(value);
                }
            }
            Ok(Command::Ready { socket_type })
        }
        b"ERROR" => {
            let reason = data
                .split_first()
                .map(|(&n, r)| &r[..r.len().min(n as usize)])
                .unwrap_or_default();
            Ok(Command::Error(String::from_utf8_lossy(reason).into_owned()))
        }
        b"PING" => {
            // Two bytes of TTL, then up to 16 bytes of context.
            let context = data.get(2..).unwrap_or_default();
            Ok(Command::Ping {
                context: &context[..context.len().min(MAX_PING_CONTEXT)],
            })
        }
        b"PONG" => Ok(Command::Pong {
            context: &data[..data.len().min(MAX_PING_CONTEXT)],
        }),
        _ => Ok(Command::Other),
    }
}

/// A metadata property: name and value.
type Property<'a> = (&'a [u8], &'a [u8]);

/// The metadata of READY: name length (1 byte), name, value length (4 bytes BE), value.
fn properties(mut data: &[u8]) -> Result<Vec<Property<'_>>, String> {
    let mut out = Vec::new();
    while let Some((&name_len, rest)) = data.split_first() {
        let name_len = name_len as usize;
        if rest.len() < name_len + 4 {
            return Err("property shorter than its header".into());
        }
        let (name, rest) = rest.split_at(name_len);
        let (len, rest) = rest.split_at(4);
        let value_len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if rest.len() < value_len {
            return Err("property value longer than the frame".into());
        }
        let (value, rest) = rest.split_at(value_len);
        out.push((name, value));
        data = rest;
    }
    Ok(out)
}

/// What one frame costs against a message's byte budget: its body plus a fixed overhead, so a
/// message of countless empty frames is bounded too (each frame is held as a `Bytes`).
pub const fn frame_cost(size: u64) -> u64 {
    size.saturating_add(std::mem::size_of::<bytes::Bytes>() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_greeting_is_accepted_by_our_own_check() {
        let g = greeting();
        assert_eq!(g.len(), 64);
        assert_eq!((g[0], g[9], g[10], g[11]), (0xFF, 0x7F, 3, 1));
        assert_eq!(&g[12..16], b"NULL");
        assert!(g[16..].iter().all(|&b| b == 0), "padding, client, filler");
        assert!(check_greeting(&g).unwrap().answers_ping());
    }

    #[test]
    fn greetings_of_old_versions_or_other_mechanisms_are_refused() {
        let mut g = greeting();
        (g[10], g[11]) = (2, 0);
        assert!(check_greeting(&g).unwrap_err().to_string().contains("2.0"));
        let mut g = greeting();
        g[12..17].copy_from_slice(b"CURVE");
        assert!(
            check_greeting(&g)
                .unwrap_err()
                .to_string()
                .contains("CURVE")
        );
        let mut g = greeting();
        g[0] = b'G'; // an HTTP server, say
        assert!(check_greeting(&g).is_err());
        let mut g = greeting();
        g[11] = 0; // 3.0 is fine, but not pinged
        let v = check_greeting(&g).unwrap();
        assert_eq!(v, PeerVersion { major: 3, minor: 0 });
        assert!(!v.answers_ping());
        for (major, minor) in [(3, 1), (3, 2), (4, 0)] {
            let mut g = greeting();
            (g[10], g[11]) = (major, minor);
            assert!(
                check_greeting(&g).unwrap().answers_ping(),
                "{major}.{minor}"
            );
        }
    }

    #[test]
    fn ping_carries_its_ttl_in_tenths_of_a_second_and_at_most_16_bytes_of_context() {
        use std::time::Duration;
        let frame = ping(Duration::from_millis(1500), b"ctx");
        // A short command frame: flags, size, then `\x04PING`, TTL 15 (BE), context.
        assert_eq!(frame, b"\x04\x0a\x04PING\x00\x0fctx".to_vec());
        assert_eq!(
            parse_command(&frame[2..]).unwrap(),
            Command::Ping { context: b"ctx" }
        );
        // Rounded up, and capped at what two bytes hold.
        assert_eq!(&ping(Duration::from_millis(1), b"")[7..9], &[0, 1]);
        assert_eq!(
            &ping(Duration::from_secs(100_000), b"")[7..9],
            &[0xFF, 0xFF]
        );
        let long = ping(Duration::from_secs(1), &[9; 40]);
        assert_eq!(long.len(), 2 + 5 + 2 + MAX_PING_CONTEXT);
    }

    #[test]
    fn pong_is_parsed_with_the_context_it_echoes() {
        let frame = pong(b"\x00\x00\x00\x07");
        assert_eq!(
            parse_command(&frame[2..]).unwrap(),
            Command::Pong {
                context: b"\x00\x00\x00\x07"
            }
        );
        assert_eq!(
            parse_command(b"\x04PONG").unwrap(),
            Command::Pong { context: b"" }
        );
    }

    #[test]
    fn frames_are_short_up_to_255_bytes_and_long_above() {
        let mut out = Vec::new();
        encode_frame(&mut out, FLAG_MORE, &[7; 255]);
        assert_eq!(&out[..2], &[FLAG_MORE, 255]);
        assert_eq!(out.len(), 257);
        let mut out = Vec::new();
        encode_frame(&mut out, 0, &[7; 256]);
        assert_eq!(out[0], FLAG_LONG);
        assert_eq!(&out[1..9], &256u64.to_be_bytes());
        assert_eq!(out.len(), 9 + 256);
        let m = encode_message(&[b"", &[1, 2]]);
        assert_eq!(m, vec![FLAG_MORE, 0, 0, 2, 1, 2]);
        assert_eq!(subscribe_all(), vec![0, 1, 1]);
    }

    #[test]
    fn ready_round_trips_through_the_parser() {
        for socket_type in [SocketType::Sub, SocketType::Dealer] {
            let frame = ready(socket_type);
            assert_eq!(frame[0], FLAG_COMMAND);
            assert_eq!(frame[1] as usize, frame.len() - 2);
            let parsed = parse_command(&frame[2..]).unwrap();
            assert_eq!(
                parsed,
                Command::Ready {
                    socket_type: Some(socket_type.name().as_bytes())
                }
            );
        }
        assert!(SocketType::Sub.accepts(b"PUB") && SocketType::Sub.accepts(b"XPUB"));
        assert!(!SocketType::Sub.accepts(b"ROUTER"));
        assert!(SocketType::Dealer.accepts(b"ROUTER") && !SocketType::Dealer.accepts(b"PUB"));
    }

    #[test]
    fn malformed_commands_are_errors_not_panics() {
        assert!(parse_command(&[]).is_err());
        assert!(parse_command(&[9, b'R']).is_err());
        // READY whose property claims a 4 GB value.
        let mut body = vec![5];
        body.extend_from_slice(b"READY");
        body.push(1);
        body.push(b'x');
        body.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_command(&body).is_err());
        // A truncated property header.
        let mut body = vec![5];
        body.extend_from_slice(b"READY");
        body.extend_from_slice(&[3, b'a']);
        assert!(parse_command(&body).is_err());
    }

    #[test]
    fn ping_gets_its_context_back_and_error_its_reason() {
        let mut ping = vec![4];
        ping.extend_from_slice(b"PING");
        ping.extend_from_slice(&[0, 10]);
        ping.extend_from_slice(b"ctx");
        let Command::Ping { context } = parse_command(&ping).unwrap() else {
            panic!("not a ping");
        };
        assert_eq!(context, b"ctx");
        let pong_frame = pong(context);
        assert_eq!(&pong_frame[2..], b"\x04PONGctx");
        let mut error = vec![5];
        error.extend_from_slice(b"ERROR");
        error.push(6);
        error.extend_from_slice(b"denied");
        assert_eq!(
            parse_command(&error).unwrap(),
            Command::Error("denied".into())
        );
        let mut other = vec![9];
        other.extend_from_slice(b"SUBSCRIBE");
        assert_eq!(parse_command(&other).unwrap(), Command::Other);
    }

    #[test]
    fn every_frame_costs_at_least_its_overhead() {
        assert!(frame_cost(0) >= 32);
        assert_eq!(frame_cost(u64::MAX), u64::MAX);
    }
}
