//! When a connection pings its peer and when it gives a silent peer up, without any I/O.
//!
//! A peer whose network path freezes (host gone, a NAT or conntrack entry expired) sends nothing
//! and closes nothing: without a deadline, a reader waits for it for ever. A peer that speaks ZMTP
//! 3.1 answers PING with PONG by itself, so a connection to one sends a PING every `interval` and
//! gives up once nothing at all (message, PONG, any byte) came for `timeout`. A 3.0 peer is never
//! pinged and never timed out here: it may stay quiet for good reasons, and TCP keepalive (set
//! on the socket, see `conn`) finds a dead host under it. `docs/zmtp.md` has the reasoning.

use std::time::Duration;

use tokio::time::Instant;

/// How a connection checks that its peer is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// A PING goes to a peer that speaks ZMTP 3.1 or later this often.
    pub interval: Duration,
    /// A pinged peer that sent nothing for this long is given up. Also the TTL our PINGs carry:
    /// the peer may give the connection up when it hears nothing from us for that long.
    pub timeout: Duration,
}

impl Heartbeat {
    /// TCP keepalive for the socket: the first probe after `interval` of idleness, then one every
    /// `interval`, and the connection fails after enough unanswered probes to cover `timeout`.
    /// Linux counts keepalive times in whole seconds, so each is at least one second.
    pub fn keepalive(self) -> socket2::TcpKeepalive {
        let every = self.interval.max(Duration::from_secs(1));
        let probes = self.timeout.saturating_sub(every).as_millis() / every.as_millis().max(1);
        socket2::TcpKeepalive::new()
            .with_time(every)
            .with_interval(every)
            .with_retries(probes.clamp(1, 127) as u32)
    }
}

/// What a connection's timer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Nothing yet.
    Nothing,
    /// Send a PING with this sequence number as its context.
    Ping(u64),
    /// The peer sent nothing for this long, past the timeout: give it up.
    Silent(Duration),
}

/// The heartbeat state of one connection.
#[derive(Debug)]
pub struct Liveness {
    /// `None`: the peer is not pinged (no heartbeat configured, or a 3.0 peer).
    heartbeat: Option<Heartbeat>,
    /// The last time a byte came from the peer, or we started waiting for one.
    heard: Instant,
    next_ping: Instant,
    pings_sent: u64,
}

impl Liveness {
    /// A connection whose peer is pinged with `heartbeat` (or not at all), the first PING one
    /// interval from `now`.
    pub fn new(heartbeat: Option<Heartbeat>, now: Instant) -> Self {
        Liveness {
            heartbeat,
            heard: now,
            next_ping: now + heartbeat.map_or(Duration::ZERO, |h| h.interval),
            pings_sent: 0,
        }
    }

    pub fn heartbeat(&self) -> Option<Heartbeat> {
        self.heartbeat
    }

    /// Bytes came from the peer.
    pub fn heard(&mut self, now: Instant) {
        self.heard = self.heard.max(now);
    }

    /// We start waiting for the peer again. Silence counts only while we wait: a reader that held
    /// off reading (its consumer pushed back) must not blame the peer for the time it did not
    /// listen.
    pub fn listening(&mut self, now: Instant) {
        self.heard(now);
    }

    /// When the timer must next wake the reader; `None` without a heartbeat.
    pub fn wake_at(&self) -> Option<Instant> {
        let h = self.heartbeat?;
        Some(self.next_ping.min(self.heard + h.timeout))
    }

    /// The moment the peer counts as silent, for bounding our own writes to it.
    pub fn silent_at(&self) -> Option<Instant> {
        self.heartbeat.map(|h| self.heard + h.timeout)
    }

    /// What is due at `now`. A PING reported here counts as sent.
    pub fn due(&mut self, now: Instant) -> Due {
        let Some(h) = self.heartbeat else {
            return Due::Nothing;
        };
        let silent_for = now.saturating_duration_since(self.heard);
        if silent_for >= h.timeout {
            return Due::Silent(silent_for);
        }
        if now >= self.next_ping {
            // The next one an interval after this one, not after the missed slot: a reader that
            // did not listen for a while sends one PING, not a burst.
            self.next_ping = now + h.interval;
            self.pings_sent += 1;
            return Due::Ping(self.pings_sent);
        }
        Due::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Heartbeat = Heartbeat {
        interval: Duration::from_secs(2),
        timeout: Duration::from_secs(6),
    };

    #[test]
    fn a_pinged_peer_is_pinged_every_interval_and_given_up_after_the_timeout() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(HB), t0);
        assert_eq!(l.wake_at(), Some(t0 + HB.interval));
        assert_eq!(l.due(t0 + Duration::from_secs(1)), Due::Nothing);
        assert_eq!(l.due(t0 + HB.interval), Due::Ping(1));
        assert_eq!(l.wake_at(), Some(t0 + 2 * HB.interval));
        assert_eq!(l.due(t0 + 2 * HB.interval), Due::Ping(2));
        // A PONG (any byte) moves the silence deadline.
        l.heard(t0 + Duration::from_secs(5));
        assert_eq!(l.due(t0 + 3 * HB.interval), Due::Ping(3));
        assert_eq!(l.silent_at(), Some(t0 + Duration::from_secs(11)));
        assert_eq!(
            l.due(t0 + Duration::from_secs(11)),
            Due::Silent(Duration::from_secs(6))
        );
    }

    #[test]
    fn time_spent_not_listening_does_not_count_as_silence() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(HB), t0);
        // The reader was held up for 10 s, then waits again: one PING, no timeout.
        l.listening(t0 + Duration::from_secs(10));
        assert_eq!(l.due(t0 + Duration::from_secs(10)), Due::Ping(1));
        assert_eq!(l.due(t0 + Duration::from_secs(10)), Due::Nothing);
        assert_eq!(l.wake_at(), Some(t0 + Duration::from_secs(12)));
    }

    #[test]
    fn without_a_heartbeat_nothing_is_ever_due() {
        let t0 = Instant::now();
        let mut l = Liveness::new(None, t0);
        assert_eq!(l.wake_at(), None);
        assert_eq!(l.silent_at(), None);
        assert_eq!(l.due(t0 + Duration::from_secs(3600)), Due::Nothing);
    }

    /// The options a socket reads back after `keepalive` was set on it.
    fn applied(hb: Heartbeat) -> (bool, Duration, Duration, u32) {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("a TCP socket");
        socket.set_tcp_keepalive(&hb.keepalive()).unwrap();
        (
            socket.keepalive().unwrap(),
            socket.tcp_keepalive_time().unwrap(),
            socket.tcp_keepalive_interval().unwrap(),
            socket.tcp_keepalive_retries().unwrap(),
        )
    }

    #[test]
    fn keepalive_covers_the_timeout_in_whole_seconds() {
        // 5 s idle, then probes every 5 s: two unanswered ones reach 15 s.
        let hb = Heartbeat {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(15),
        };
        let five = Duration::from_secs(5);
        assert_eq!(applied(hb), (true, five, five, 2));
        // Sub-second heartbeats still give valid keepalive times.
        let hb = Heartbeat {
            interval: Duration::from_millis(200),
            timeout: Duration::from_millis(1000),
        };
        let one = Duration::from_secs(1);
        assert_eq!(applied(hb), (true, one, one, 1));
    }
}
