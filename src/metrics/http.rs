//! The `/metrics` endpoint: a minimal HTTP/1.1 server on a TCP listener.
//! One request per connection (`Connection: close`); `GET` or `HEAD
//! /metrics` gets the exposition, any other path 404, another method 405,
//! anything unreadable 400. A client that sends no request head within
//! [`READ_TIMEOUT`] is dropped, and at most [`MAX_CONNECTIONS`] are served
//! at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::text::CONTENT_TYPE;

pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_CONNECTIONS: usize = 16;
/// Longest request head read; Prometheus sends a few hundred bytes.
const MAX_HEAD: usize = 8192;

/// Serves `render()` at `/metrics` on `listener` until `shutdown`
/// resolves.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    render: F,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = String> + Send,
{
    let render = Arc::new(render);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let (conn, peer) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            res = listener.accept() => match res {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics: too many connections; dropped");
            continue;
        };
        let render = render.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(conn, &*render).await {
                tracing::debug!(%peer, error = %e, "metrics: connection failed");
            }
            drop(slot);
        });
    }
}

/// The client side, for `tpcsi` and the tests: `GET /metrics` at `addr`,
/// and the samples of the answer, by series (`name{labels}`).
pub async fn scrape(
    addr: std::net::SocketAddr,
) -> Result<std::collections::BTreeMap<String, f64>, String> {
    let fail = |e: std::io::Error| format!("metrics at {addr}: {e}");
    let mut conn = TcpStream::connect(addr).await.map_err(fail)?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: thinpool-csi\r\nConnection: close\r\n\r\n")
        .await
        .map_err(fail)?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.map_err(fail)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("metrics at {addr}: no HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200 OK") {
        let status = head.lines().next().unwrap_or_default();
        return Err(format!("metrics at {addr}: {status}"));
    }
    Ok(super::text::samples(body))
}

async fn handle<F, Fut>(mut conn: TcpStream, render: &F) -> std::io::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = String>,
{
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut conn)).await {
        Ok(res) => res?,
        Err(_) => return Ok(()),
    };
    let (status, body, head_only) = match parse_request_line(&head) {
        None => ("400 Bad Request", "bad request\n".to_string(), false),
        Some((method, path)) => match (method, path) {
            (_, p) if p != "/metrics" => {
                ("404 Not Found", "not found; try /metrics\n".into(), false)
            }
            ("GET", _) => ("200 OK", render().await, false),
            ("HEAD", _) => ("200 OK", render().await, true),
            _ => ("405 Method Not Allowed", "use GET\n".into(), false),
        },
    };
    let content_type = if status.starts_with("200") {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        reply.push_str("Allow: GET, HEAD\r\n");
    }
    reply.push_str("\r\n");
    if !head_only {
        reply.push_str(&body);
    }
    conn.write_all(reply.as_bytes()).await?;
    conn.shutdown().await
}

/// Reads up to the blank line that ends a request head (or EOF, or
/// [`MAX_HEAD`] bytes).
async fn read_head(conn: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while buf.len() < MAX_HEAD {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// `METHOD /path[?query] HTTP/1.x` → method and path.
fn parse_request_line(head: &str) -> Option<(&str, &str)> {
    let line = head.lines().next()?;
    let mut parts = line.split_ascii_whitespace();
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Some((method, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            parse_request_line("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            parse_request_line("GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(parse_request_line("GET /metrics\r\n\r\n"), None);
        assert_eq!(parse_request_line("GET /metrics SPDY/3\r\n\r\n"), None);
        assert_eq!(parse_request_line(""), None);
    }

    /// Sends `request` raw and returns the whole answer.
    async fn ask(addr: std::net::SocketAddr, request: &str) -> String {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_404_elsewhere() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let scrapes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n = scrapes.clone();
        let render = move || {
            let n = n.clone();
            async move {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                "# TYPE up gauge\nup 1\n".to_string()
            }
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, render, async {
            let _ = stopped.await;
        }));

        let ok = ask(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let (head, body) = ok.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(head.contains("Content-Length: 21\r\n"), "{head}");
        assert_eq!(body, "# TYPE up gauge\nup 1\n");

        let head_only = ask(addr, "HEAD /metrics HTTP/1.1\r\n\r\n").await;
        assert!(head_only.starts_with("HTTP/1.1 200 OK"), "{head_only}");
        assert!(head_only.ends_with("\r\n\r\n"), "{head_only}");

        for path in ["/", "/metricsx", "/metrics/", "/favicon.ico"] {
            let r = ask(addr, &format!("GET {path} HTTP/1.1\r\n\r\n")).await;
            assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{path}: {r}");
        }
        let r = ask(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
        assert!(r.contains("Allow: GET, HEAD\r\n"), "{r}");
        let r = ask(addr, "garbage\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
        // Only the two requests for /metrics rendered anything.
        assert_eq!(scrapes.load(std::sync::atomic::Ordering::SeqCst), 2);

        // Shutdown ends the server (and drops its listener).
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the server stops on shutdown")
            .unwrap()
            .unwrap();
    }
}
