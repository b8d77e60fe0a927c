//! Transport tests against listeners on loopback (never any other address).

use std::time::Duration;

use entrega_core::outcome::{FailureKind, TransportResult};
use entrega_core::ports::{SignedRequest, Transport};
use reqwest::dns::{Name, Resolve};
use std::str::FromStr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

fn loopback_allowed() -> TargetPolicy {
    TargetPolicy {
        allowed_ranges: vec!["127.0.0.0/8".parse().unwrap()],
        allow_http: true,
    }
}

fn request(url: String) -> SignedRequest {
    SignedRequest {
        url,
        headers: vec![("webhook-id".into(), "evt_1".into())],
        body: "{}".into(),
        timeout: Duration::from_secs(2),
    }
}

/// A one-shot HTTP server answering `response` (raw bytes) to the first request.
async fn raw_server(response: Vec<u8>) -> (std::net::SocketAddr, tokio::task::JoinHandle<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 8192];
        let n = sock.read(&mut buf).await.unwrap();
        let _ = sock.write_all(&response).await;
        let _ = sock.shutdown().await;
        n
    });
    (addr, handle)
}

#[tokio::test]
async fn the_resolver_refuses_names_that_resolve_to_forbidden_addresses() {
    let strict = GuardedResolver {
        policy: Arc::new(TargetPolicy::default()),
    };
    let err = match strict.resolve(Name::from_str("localhost").unwrap()).await {
        Ok(_) => panic!("localhost resolved through a strict guard"),
        Err(e) => e,
    };
    assert!(err.downcast_ref::<Refused>().is_some(), "{err}");
    let open = GuardedResolver {
        policy: Arc::new(TargetPolicy {
            allowed_ranges: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            allow_http: true,
        }),
    };
    let addrs: Vec<_> = match open.resolve(Name::from_str("localhost").unwrap()).await {
        Ok(addrs) => addrs.collect(),
        Err(e) => panic!("allowlisted localhost refused: {e}"),
    };
    assert!(addrs.iter().all(|a| a.ip().is_loopback()));
}

#[tokio::test]
async fn a_refused_target_is_never_connected_to() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let strict = HttpTransport::new(TargetPolicy {
        allowed_ranges: vec![],
        allow_http: true,
    });
    for url in [
        format!("http://{addr}/"),
        format!("http://localhost:{}/", addr.port()),
    ] {
        let result = strict.send(&request(url)).await;
        assert!(
            matches!(
                result,
                TransportResult::Failed {
                    kind: FailureKind::TargetRefused,
                    ..
                }
            ),
            "{result:?}"
        );
    }
    let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(accepted.is_err(), "something connected to the listener");
}

#[tokio::test]
async fn status_retry_after_and_a_capped_body_are_reported() {
    let big_body = "x".repeat(MAX_RESPONSE_BYTES * 4);
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nretry-after: 120\r\ncontent-length: {}\r\n\r\n{big_body}",
        big_body.len()
    );
    let (addr, server) = raw_server(response.into_bytes()).await;
    let t = HttpTransport::new(loopback_allowed());
    let result = t.send(&request(format!("http://{addr}/hook"))).await;
    let TransportResult::Response {
        status,
        retry_after,
        excerpt,
    } = result
    else {
        panic!("{result:?}")
    };
    assert_eq!(status, 503);
    assert_eq!(retry_after.as_deref(), Some("120"));
    assert_eq!(
        excerpt.len(),
        entrega_core::delivery::RESPONSE_EXCERPT_BYTES
    );
    let request_bytes = server.await.unwrap();
    assert!(request_bytes > 0);
}

#[tokio::test]
async fn a_redirect_is_reported_not_followed() {
    let (target, _target_server) =
        raw_server(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec()).await;
    let response = format!("HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{target}/\r\ncontent-length: 0\r\n\r\n");
    let (addr, _server) = raw_server(response.into_bytes()).await;
    let t = HttpTransport::new(loopback_allowed());
    let result = t.send(&request(format!("http://{addr}/"))).await;
    assert_eq!(result.status(), Some(307));
    assert_eq!(result.failure_kind(), Some(FailureKind::Redirect));
}

/// A broken answer's record says what was wrong with it, not only that sending failed.
#[tokio::test]
async fn a_broken_answer_is_reported_with_its_cause() {
    let t = HttpTransport::new(loopback_allowed());
    for (answer, cause) in [
        (&b"HTTP/1.1 2000 OK\r\n\r\n"[..], "status-code"),
        (&b"HELLO THERE\r\n\r\n"[..], "HTTP version"),
        (&b""[..], "connection closed before message completed"),
    ] {
        let (addr, _server) = raw_server(answer.to_vec()).await;
        let result = t.send(&request(format!("http://{addr}/"))).await;
        let TransportResult::Failed { kind, message } = &result else {
            panic!("{result:?}");
        };
        assert_eq!(*kind, FailureKind::Transport, "{message}");
        assert!(
            message.starts_with("error sending request") && message.contains(cause),
            "{:?}: {message}",
            String::from_utf8_lossy(answer)
        );
    }
}

#[tokio::test]
async fn silence_is_a_timeout_and_a_closed_port_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Accept and say nothing.
    let _hold = tokio::spawn(async move {
        let (_sock, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let t = HttpTransport::new(loopback_allowed());
    let mut req = request(format!("http://{addr}/"));
    req.timeout = Duration::from_millis(300);
    let result = t.send(&req).await;
    assert_eq!(
        result.failure_kind(),
        Some(FailureKind::Timeout),
        "{result:?}"
    );

    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let result = t.send(&request(format!("http://{closed}/"))).await;
    assert_eq!(
        result.failure_kind(),
        Some(FailureKind::ConnectionRefused),
        "{result:?}"
    );
}
