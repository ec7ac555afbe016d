//! The client's connection as the proxy writes to it: a client that takes
//! nothing of its answer for the send timeout is cut off, as nginx's
//! `send_timeout` does. hyper writes an answer only as fast as the client
//! reads it, and a vendor's body is read only as fast as it is written,
//! so a client that stops reading would hold its lane's in-flight slot,
//! and the vendor call, for as long as it keeps the connection open.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::stall::Stall;

/// A client's stream whose writes fail once one has waited the send
/// timeout for the client to take anything.
pub(super) struct Client<S> {
    stream: S,
    stall: Stall,
}

impl<S> Client<S> {
    pub(super) fn new(stream: S, timeout: Duration) -> Self {
        Self {
            stream,
            stall: Stall::new(timeout),
        }
    }

    /// What a write that went through (or failed) says; a waiting one
    /// waits on, unless the client has taken nothing for the timeout.
    fn waited<T>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        self.stall.wait(cx, written).map(|waited| {
            waited.unwrap_or_else(|timeout| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took nothing of its answer for {timeout:?}"),
                ))
            })
        })
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Client<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Client<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.waited(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.waited(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.stream).poll_flush(cx);
        self.waited(cx, flushed)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let shut = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.waited(cx, shut)
    }
}
