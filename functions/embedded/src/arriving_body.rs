//! A request body with a deadline for the whole of it, that tells its connection
//! while its reader is waiting for it.
//!
//! Why not tower-http's body timeout alone: it times each frame, so a client sending a
//! byte every few seconds holds its request open until the request timeout (60 s). And
//! why the connection must know: a request whose handler waits for its body counts as
//! running, and a running request's connection is never evicted at the connection cap.
//! A tenant's key (a valid one passes authentication on the headers alone) could then
//! hold every connection with bodies it never finishes, and lock every other client out.
//! A request whose handler is waiting for its body has had nothing done for it yet
//! (the handlers read their whole body before they act), so its connection may be
//! closed for a new one like an idle connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use entrega_http::api::BodyTooSlow;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// See the module docs.
pub struct ArrivingBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// The connection's count of requests waiting for their body now.
    waiting_count: Arc<AtomicUsize>,
    /// Whether this body is in that count: its reader is waiting for the next frame.
    /// Only then: a handler that does not read its body, or is busy with what has
    /// arrived, is doing work that must not be cut off.
    waiting: bool,
}

impl ArrivingBody {
    /// `inner`, which must have arrived whole within `limit`; counted in
    /// `waiting_count` while its reader waits for it.
    pub fn new(inner: Incoming, limit: Duration, waiting_count: &Arc<AtomicUsize>) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            waiting_count: waiting_count.clone(),
            waiting: false,
        }
    }

    fn set_waiting(&mut self, waiting: bool) {
        if waiting != self.waiting {
            self.waiting = waiting;
            if waiting {
                self.waiting_count.fetch_add(1, Ordering::AcqRel);
            } else {
                self.waiting_count.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl Drop for ArrivingBody {
    fn drop(&mut self) {
        self.set_waiting(false);
    }
}

impl Body for ArrivingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.set_waiting(false);
                Poll::Ready(frame.map(|r| r.map_err(BoxError::from)))
            }
            Poll::Pending if this.deadline.as_mut().poll(cx).is_ready() => {
                this.set_waiting(false);
                Poll::Ready(Some(Err(BodyTooSlow.into())))
            }
            Poll::Pending => {
                this.set_waiting(true);
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use axum::extract::FromRequest;
    use entrega_http::api::extract::JsonBody;
    use hyper::Response;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const LIMIT: Duration = Duration::from_millis(400);

    /// A server whose one route reads a JSON body within [`LIMIT`] and answers with
    /// the extractor's status; the count of bodies being waited for.
    async fn server() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let waiting = Arc::new(AtomicUsize::new(0));
        let count = waiting.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let count = count.clone();
                let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let body = ArrivingBody::new(req.into_body(), LIMIT, &count);
                    async move {
                        let req = axum::extract::Request::new(axum::body::Body::new(body));
                        let status =
                            match JsonBody::<serde_json::Value>::from_request(req, &()).await {
                                Ok(_) => 200,
                                Err(e) => e.status.as_u16(),
                            };
                        let mut response = Response::new(String::new());
                        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        (addr, waiting)
    }

    async fn status_line(stream: &mut tokio::net::TcpStream) -> String {
        let mut answer = vec![0u8; 64];
        let n = stream.read(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    #[tokio::test]
    async fn a_body_trickling_in_past_its_deadline_gets_408_and_stops_counting() {
        let (addr, waiting) = server().await;
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{")
            .await
            .unwrap();
        // A byte every 100 ms: a timeout per chunk would never fire.
        let started = std::time::Instant::now();
        let mut seen_waiting = false;
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            seen_waiting |= waiting.load(Ordering::Acquire) == 1;
            let _ = stream.write_all(b" ").await;
        }
        assert!(seen_waiting, "counted while its reader waited");
        let line = status_line(&mut stream).await;
        assert!(line.contains(" 408 "), "{line}");
        assert!(started.elapsed() < LIMIT * 3, "{:?}", started.elapsed());
        assert_eq!(waiting.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_body_that_arrives_in_time_is_read_and_stops_counting() {
        let (addr, waiting) = server().await;
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n{\"a\":")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(waiting.load(Ordering::Acquire), 1, "waiting for the rest");
        stream.write_all(b" 1}").await.unwrap();
        let line = status_line(&mut stream).await;
        assert!(line.contains(" 200 "), "{line}");
        assert_eq!(waiting.load(Ordering::Acquire), 0);
    }
}
