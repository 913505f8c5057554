//! A flood of idle connections from one loopback client, paced and bounded in time, and the
//! service's open descriptors as `/proc` counts them.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// What a flood did: connections opened, and over how long.
#[derive(Debug, Clone, Copy)]
pub struct Flooded {
    pub opened: u64,
    pub took: Duration,
}

impl Flooded {
    pub fn per_second(&self) -> f64 {
        self.opened as f64 / self.took.as_secs_f64()
    }
}

/// Open connections to 127.0.0.1 at `rate` per second for `span`, round the `ports`, sending
/// nothing on any. The newest `held` stay open until the flood ends (the service has closed the
/// older ones to make room, or they would hold descriptors in this process without end).
pub async fn idle_flood(ports: &[u16], rate: u32, span: Duration, held: usize) -> Flooded {
    let start = Instant::now();
    let mut open = VecDeque::with_capacity(held + 1);
    let (mut attempts, mut opened) = (0u64, 0u64);
    while start.elapsed() < span {
        let due = (start.elapsed().as_secs_f64() * f64::from(rate)) as u64;
        if attempts >= due {
            // The flood's pacing.
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let port = ports[attempts as usize % ports.len()];
        attempts += 1;
        let connect = from_another_loopback(port);
        if let Ok(Ok(socket)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
            open.push_back(socket);
            if open.len() > held {
                open.pop_front();
            }
            opened += 1;
        }
    }
    Flooded {
        opened,
        took: start.elapsed(),
    }
}

/// A connection to 127.0.0.1:`port` from 127.0.0.2: the flood's thousands of ephemeral ports
/// are then 127.0.0.2's, so a test that starts a service again on a port of 127.0.0.1 while a
/// flood runs beside it never finds that port taken by one of them.
async fn from_another_loopback(port: u16) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(([127, 0, 0, 2], 0).into())?;
    socket.connect(([127, 0, 0, 1], port).into()).await
}

/// The descriptors process `pid` has open.
pub fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}
