//! A TCP relay on loopback between a client and a server that can stop passing a connection's
//! server-to-client bytes after a given count, until the server closes it: a server that stalls
//! mid-stream at a point the test chooses, deterministically. Its target can be changed (a
//! server restarted on another port).

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Proxy {
    pub port: u16,
    target: Arc<AtomicU16>,
    /// Server-to-client bytes the next connection passes before it holds; `u64::MAX`: no hold.
    hold_next: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let target = Arc::new(AtomicU16::new(target));
        let hold_next = Arc::new(AtomicU64::new(u64::MAX));
        let accept = {
            let (target, hold_next) = (target.clone(), hold_next.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let hold = hold_next.swap(u64::MAX, Ordering::SeqCst);
                    let port = target.load(Ordering::SeqCst);
                    tokio::spawn(relay(client, port, hold));
                }
            })
        };
        Proxy {
            port,
            target,
            hold_next,
            accept,
        }
    }

    pub fn retarget(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }

    /// The next connection passes `bytes` of the server's bytes, then holds the rest.
    pub fn hold_next_after(&self, bytes: u64) {
        self.hold_next.store(bytes, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Relay one connection; a server that cannot be reached closes the client's at once.
async fn relay(client: TcpStream, port: u16, hold_after: u64) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let upstream = async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
        let _ = to_server.shutdown().await;
    };
    let downstream = async move {
        let mut passed = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_server.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let room = hold_after.saturating_sub(passed).min(n as u64) as usize;
            if room > 0 && to_client.write_all(&buf[..room]).await.is_err() {
                break;
            }
            passed += room as u64;
        }
        // The server is gone: so is the client's connection.
        let _ = to_client.shutdown().await;
    };
    // The first side to end ends the relay (dropping the other closes its sockets).
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}
