//! Just enough of gRPC over HTTP/2 for a worker's one bidirectional call: a connection (plain or TLS
//! with ALPN h2), a call whose request body is a channel, length-prefixed messages each way, and the
//! call's status from its trailers (or from its headers, for a call refused before any message).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::HeaderMap;
use hyper::body::HttpBody;
use hyper::client::conn::SendRequest;
use hyper::{Body, Request};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::errors::Code;

/// Where a connection goes: a host:port address and whether it uses TLS.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Endpoint {
    pub address: String,
    pub secure: bool,
}

/// A call's end: its status, and the metadata a redirect is read from.
#[derive(Debug, Clone)]
pub(crate) struct Status {
    pub code: Code,
    pub message: String,
    pub metadata: HeaderMap,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
            metadata: HeaderMap::new(),
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// An HTTP/2 connection; dropping it closes it.
pub(crate) struct Connection {
    send: SendRequest<Body>,
    driver: JoinHandle<()>,
    authority: String,
    scheme: &'static str,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// How long making a connection may take before the attempt counts as failed (and is retried).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// Connects to `ep`. `tls` is the client configuration for a secure endpoint, `server_name` the name
/// its certificate is checked against. HTTP/2 pings while the connection is open, so that a call to a
/// server that froze or was cut off fails instead of waiting forever.
pub(crate) async fn connect(
    ep: &Endpoint,
    tls: Option<(Arc<rustls::ClientConfig>, String)>,
) -> Result<Connection, Status> {
    let unavailable = |what: &str, err: &dyn std::fmt::Display| {
        Status::new(Code::Unavailable, format!("{what} {}: {err}", ep.address))
    };
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&ep.address))
        .await
        .map_err(|e| unavailable("connecting to", &e))?
        .map_err(|e| unavailable("connecting to", &e))?;
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Io> = match tls {
        Some((config, server_name)) => {
            let name = rustls::ServerName::try_from(server_name.as_str()).map_err(|e| {
                Status::new(
                    Code::InvalidArgument,
                    format!("TLS server name {server_name:?}: {e}"),
                )
            })?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| unavailable("TLS handshake with", &e))?;
            Box::new(stream)
        }
        None => Box::new(tcp),
    };
    let (send, conn) = hyper::client::conn::Builder::new()
        .http2_only(true)
        .http2_adaptive_window(true)
        .http2_keep_alive_interval(Duration::from_secs(20))
        .http2_keep_alive_timeout(Duration::from_secs(10))
        .http2_keep_alive_while_idle(true)
        .handshake::<_, Body>(io)
        .await
        .map_err(|e| unavailable("HTTP/2 with", &e))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Connection {
        send,
        driver,
        authority: ep.address.clone(),
        scheme: if ep.secure { "https" } else { "http" },
    })
}

/// A call in progress: its messages as they arrive.
pub(crate) struct Call {
    headers: HeaderMap,
    body: Body,
    buffer: BytesMut,
}

impl Connection {
    /// Starts the call `path` sending `body` (the caller writes the messages into its sender) and waits
    /// for the response's headers; a call refused at once ends with its status.
    pub async fn call(&mut self, path: &str, token: Option<&str>, body: Body) -> Result<Call, Status> {
        let mut request = Request::post(format!("{}://{}{}", self.scheme, self.authority, path))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", concat!("cronoq-rust/", env!("CARGO_PKG_VERSION")));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request
            .body(body)
            .map_err(|e| Status::new(Code::InvalidArgument, format!("the request: {e}")))?;
        futures_util::future::poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .map_err(|e| Status::new(Code::Unavailable, format!("the connection: {e}")))?;
        let response = self
            .send
            .send_request(request)
            .await
            .map_err(|e| Status::new(Code::Unavailable, format!("the call: {e}")))?;
        let (parts, body) = response.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(Status {
                code: http_code(parts.status),
                message: format!("HTTP status {}", parts.status),
                metadata: parts.headers,
            });
        }
        if let Some(status) = status_of(&parts.headers) {
            return Err(status); // trailers-only: refused before any message
        }
        Ok(Call {
            headers: parts.headers,
            body,
            buffer: BytesMut::new(),
        })
    }
}

impl Call {
    /// The next message, or the call's end: its status from the trailers (OK when the server ended it
    /// cleanly). Metadata of a failed call holds the headers and then the trailers.
    pub async fn recv(&mut self) -> Result<Bytes, Status> {
        loop {
            if let Some(message) = self.take().map_err(|why| Status::new(Code::Internal, why))? {
                return Ok(message);
            }
            match self.body.data().await {
                Some(Ok(chunk)) => self.buffer.put(chunk),
                Some(Err(e)) => return Err(Status::new(Code::Unavailable, format!("the stream: {e}"))),
                None => break,
            }
        }
        if !self.buffer.is_empty() {
            return Err(Status::new(Code::Internal, "the stream ended inside a message"));
        }
        let trailers = self
            .body
            .trailers()
            .await
            .map_err(|e| Status::new(Code::Unavailable, format!("the stream: {e}")))?
            .unwrap_or_default();
        let mut status = status_of(&trailers)
            .unwrap_or_else(|| Status::new(Code::Internal, "the stream ended without a grpc-status"));
        let mut metadata = self.headers.clone();
        metadata.extend(status.metadata.drain());
        status.metadata = metadata;
        Err(status)
    }

    /// The next whole message in the buffer, if there is one.
    fn take(&mut self) -> Result<Option<Bytes>, &'static str> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        if self.buffer[0] != 0 {
            return Err("the server sent a compressed message");
        }
        let length = u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]);
        let length = length as usize;
        if self.buffer.len() < 5 + length {
            self.buffer.reserve(5 + length - self.buffer.len());
            return Ok(None);
        }
        self.buffer.advance(5);
        Ok(Some(self.buffer.split_to(length).freeze()))
    }
}

/// Appends one message, length-prefixed and uncompressed, to `out`.
pub(crate) fn frame(message: &impl prost::Message, out: &mut BytesMut) {
    let length = message.encoded_len();
    out.reserve(5 + length);
    out.put_u8(0);
    out.put_u32(length as u32);
    message.encode(out).expect("the buffer has room");
}

/// The status in `headers`, when they carry one (trailers, or the headers of a trailers-only
/// response).
fn status_of(headers: &HeaderMap) -> Option<Status> {
    let code = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse::<i32>()
        .ok()?;
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Some(Status {
        code: Code::from_i32(code),
        message,
        metadata: headers.clone(),
    })
}

/// grpc-message is percent-encoded UTF-8.
fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            let hex = std::str::from_utf8(&raw[i + 1..i + 3]).unwrap_or("zz");
            if let Ok(byte) = u8::from_str_radix(hex, 16) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status gRPC gives a call answered with an HTTP error instead of a gRPC response.
fn http_code(status: http::StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_message_is_percent_decoded() {
        assert_eq!(
            percent_decode(b"pool%3A unknown %E2%9C%93"),
            "pool: unknown \u{2713}"
        );
        assert_eq!(percent_decode(b"100%"), "100%");
        assert_eq!(percent_decode(b"%zz"), "%zz");
    }
}
