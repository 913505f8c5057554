//! A loopback TCP relay that can freeze: it forwards bytes both ways between its clients and a
//! target, and on `freeze` stops forwarding in both directions while keeping every socket open,
//! as a network path does when a host hangs or a NAT entry expires (no FIN, no RST, no byte).
//! Connections accepted while frozen are frozen too. `resume` lets the held bytes through.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub struct Relay {
    /// Where clients connect (`tcp://127.0.0.1:port`).
    pub endpoint: String,
    flowing: watch::Sender<bool>,
    accepted: Arc<AtomicUsize>,
    cancel: CancellationToken,
}

impl Relay {
    /// Relay to `target` (`tcp://host:port`), forwarding from the start.
    pub async fn start(target: &str) -> Relay {
        let target = target
            .strip_prefix("tcp://")
            .expect("a tcp:// target")
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("tcp://{}", listener.local_addr().expect("addr"));
        let (flowing, _) = watch::channel(true);
        let accepted = Arc::new(AtomicUsize::new(0));
        let cancel = CancellationToken::new();
        let (tx, count, stop) = (flowing.clone(), accepted.clone(), cancel.clone());
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    _ = stop.cancelled() => return,
                    a = listener.accept() => match a {
                        Ok((client, _)) => client,
                        Err(_) => continue,
                    },
                };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(upstream) = TcpStream::connect(&target).await else {
                    continue; // the client sees its connection closed
                };
                let (client_rd, client_wr) = client.into_split();
                let (up_rd, up_wr) = upstream.into_split();
                tokio::spawn(pipe(client_rd, up_wr, tx.subscribe(), stop.clone()));
                tokio::spawn(pipe(up_rd, client_wr, tx.subscribe(), stop.clone()));
            }
        });
        Relay {
            endpoint,
            flowing,
            accepted,
            cancel,
        }
    }

    /// Stop forwarding, both ways, on every connection; nothing is closed.
    pub fn freeze(&self) {
        self.flowing.send_replace(false);
    }

    pub fn resume(&self) {
        self.flowing.send_replace(true);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Copy `from` to `to` while flowing. Frozen, it neither reads nor writes: bytes already read
/// wait, and the kernel buffers fill behind them. An end on one side closes the other's write
/// side.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut flowing: watch::Receiver<bool>,
    cancel: CancellationToken,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            _ = cancel.cancelled() => return,
            n = async {
                let _ = flowing.wait_for(|f| *f).await;
                from.read(&mut buf).await
            } => n,
        };
        let n = match n {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = flowing.wait_for(|f| *f) => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
