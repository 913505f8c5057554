//! One write per answer on the gRPC server's connections.
//!
//! h2 writes a DATA frame of more than 256 bytes straight from its buffer (chained after the
//! frame head) and must flush it before it can encode the next frame, so a unary answer (HEADERS,
//! a DATA frame of a few kilobytes, the trailers) leaves in two writes: two segments on the wire,
//! two wake-ups of the client, and a syscall more than the HTTP/1.1 path, for every call.
//!
//! [`CoalescedWrites`] holds what h2 writes during one poll of the connection and writes it all
//! at once on the next poll: its `poll_flush` only asks for that poll (it wakes the task), and the
//! connection's next read, which h2 does on every poll, first writes the held bytes. The cost is
//! a second poll of the connection per answer on the same thread, well below a syscall.
//!
//! Bounds: at most [`HOLD_BYTES`] are held (a larger write goes out, after what is held, as it
//! comes), and shutdown writes what is held before closing, so large answers and snapshot streams
//! are written as before.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What one poll may hold back: a query answer for a few hundred instances, while writes of
/// bulk answers (global views, snapshot chunks of h2's 16 KiB frames) are not copied twice.
pub const HOLD_BYTES: usize = 64 * 1024;

/// An I/O object whose writes of one poll leave together (see the module doc).
pub struct CoalescedWrites<T> {
    io: T,
    held: Vec<u8>,
    /// Bytes of `held` already written.
    written: usize,
    /// The socket refused the held bytes last time (its send buffer is full): it wakes the task
    /// when it can take more, so a flush must not wake it meanwhile (that would poll the
    /// connection in a loop for as long as a client does not read).
    blocked: bool,
}

impl<T> CoalescedWrites<T> {
    pub fn new(io: T) -> Self {
        CoalescedWrites {
            io,
            held: Vec::new(),
            written: 0,
            blocked: false,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }

    fn holding(&self) -> usize {
        self.held.len() - self.written
    }
}

impl<T: AsyncWrite + Unpin> CoalescedWrites<T> {
    /// Write what is held; `Pending` only if the socket cannot take all of it now.
    fn write_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.held.len() {
            let wrote = Pin::new(&mut self.io).poll_write(cx, &self.held[self.written..]);
            self.blocked = wrote.is_pending();
            let n = ready!(wrote)?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.held.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for CoalescedWrites<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.holding() > 0 {
            // A full socket send buffer must not stop reading: the held bytes go out when the
            // socket is writable again, which wakes this task as well.
            if let Poll::Ready(Err(e)) = this.write_held(cx) {
                return Poll::Ready(Err(e));
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CoalescedWrites<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.holding() + buf.len() > HOLD_BYTES {
            ready!(this.write_held(cx))?;
            if buf.len() > HOLD_BYTES {
                return Pin::new(&mut this.io).poll_write(cx, buf);
            }
        }
        this.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if this.holding() + total > HOLD_BYTES {
            ready!(this.write_held(cx))?;
            if total > HOLD_BYTES {
                return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
            }
        }
        for b in bufs {
            this.held.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        // h2 then chains large DATA payloads instead of copying them into its own buffer; they
        // are copied here once either way.
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.holding() > 0 && !self.blocked {
            // The next poll of the connection writes them, with whatever this poll adds.
            cx.waker().wake_by_ref();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.write_held(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected
    for CoalescedWrites<T>
{
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    async fn pair() -> (CoalescedWrites<TcpStream>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (CoalescedWrites::new(accepted.unwrap().0), client.unwrap())
    }

    /// Reads exactly `n` bytes from `peer`, or fails after 5 s.
    async fn read_n(peer: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut out = vec![0; n];
        tokio::time::timeout(Duration::from_secs(5), peer.read_exact(&mut out))
            .await
            .expect("bytes within 5 s")
            .unwrap();
        out
    }

    /// Nothing is on the wire before the next poll.
    async fn nothing_arrives(peer: &mut TcpStream) {
        let mut byte = [0u8];
        let read = tokio::time::timeout(Duration::from_millis(50), peer.read(&mut byte)).await;
        assert!(read.is_err(), "bytes were written before the next poll");
    }

    #[tokio::test]
    async fn a_flush_asks_for_the_next_poll_which_writes_everything_held() {
        let (mut io, mut peer) = pair().await;
        let wakes = Arc::new(Counting(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut pin = Pin::new(&mut io);
        assert!(matches!(
            pin.as_mut().poll_write(&mut cx, b"head"),
            Poll::Ready(Ok(4))
        ));
        let parts = [io::IoSlice::new(b"-data"), io::IoSlice::new(b"-more")];
        assert!(matches!(
            pin.as_mut().poll_write_vectored(&mut cx, &parts),
            Poll::Ready(Ok(10))
        ));
        assert!(matches!(
            pin.as_mut().poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "the flush must wake the task"
        );
        assert!(matches!(
            pin.as_mut().poll_write(&mut cx, b"-trailers"),
            Poll::Ready(Ok(9))
        ));
        nothing_arrives(&mut peer).await;
        // The next poll reads, and writes what is held first.
        let mut space = [0u8; 16];
        let mut buf = ReadBuf::new(&mut space);
        assert!(pin.as_mut().poll_read(&mut cx, &mut buf).is_pending());
        assert_eq!(read_n(&mut peer, 23).await, b"head-data-more-trailers");
        // Nothing held, nothing to wake for.
        assert!(matches!(
            pin.as_mut().poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn writes_beyond_the_bound_go_out_in_order() {
        let (mut io, mut peer) = pair().await;
        let big: Vec<u8> = (0..HOLD_BYTES + 1000).map(|i| (i % 251) as u8).collect();
        let reader = tokio::spawn(async move { read_n(&mut peer, 5 + big.len() + 3).await });
        io.write_all(b"small").await.unwrap();
        let big_again: Vec<u8> = (0..HOLD_BYTES + 1000).map(|i| (i % 251) as u8).collect();
        io.write_all(&big_again).await.unwrap();
        io.write_all(b"end").await.unwrap();
        io.shutdown().await.unwrap();
        let got = reader.await.unwrap();
        assert_eq!(&got[..5], b"small");
        assert_eq!(&got[5..5 + big_again.len()], &big_again[..]);
        assert_eq!(&got[5 + big_again.len()..], b"end");
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_does_not_get_its_connection_polled_in_a_loop() {
        let (near, mut far) = tokio::io::duplex(16);
        let mut io = CoalescedWrites::new(near);
        let wakes = Arc::new(Counting(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut pin = Pin::new(&mut io);
        let answer = [7u8; 100];
        assert!(matches!(
            pin.as_mut().poll_write(&mut cx, &answer),
            Poll::Ready(Ok(100))
        ));
        assert!(pin.as_mut().poll_flush(&mut cx).is_ready());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the first flush wakes");
        // What h2 does on every poll of a connection: read, then flush. The peer reads nothing,
        // so the held bytes cannot all go out; the socket wakes the task once it can take more,
        // and the flushes meanwhile must not.
        let mut space = [0u8; 16];
        for _ in 0..10 {
            let mut buf = ReadBuf::new(&mut space);
            assert!(pin.as_mut().poll_read(&mut cx, &mut buf).is_pending());
            assert!(pin.as_mut().poll_flush(&mut cx).is_ready());
        }
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "no wake while the peer does not read"
        );
        // Once it reads, the socket wakes the task and the rest goes out, in order.
        let mut got = vec![0u8; 16];
        far.read_exact(&mut got).await.unwrap();
        assert!(wakes.0.load(Ordering::SeqCst) >= 2, "woken by the socket");
        let reader = tokio::spawn(async move {
            let mut rest = vec![0u8; 84];
            far.read_exact(&mut rest).await.unwrap();
            rest
        });
        poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut space);
            let _ = Pin::new(&mut io).poll_read(cx, &mut buf);
            if io.holding() == 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        got.extend(reader.await.unwrap());
        assert_eq!(got, answer);
    }

    #[tokio::test]
    async fn shutdown_writes_what_is_held() {
        let (mut io, mut peer) = pair().await;
        io.write_all(b"last answer").await.unwrap();
        poll_fn(|cx| Pin::new(&mut io).poll_flush(cx))
            .await
            .unwrap();
        io.shutdown().await.unwrap();
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), peer.read_to_end(&mut all))
            .await
            .expect("closed within 5 s")
            .unwrap();
        assert_eq!(all, b"last answer");
    }
}
