//! A minimal HTTP/1.1 client over a TCP stream (one request per connection), enough to drive the
//! service's JSON and msgpack API byte for byte.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub content_type: String,
    /// Every header, names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// Decode a msgpack body into JSON values for easy comparison.
    pub fn msgpack(&self) -> serde_json::Value {
        rmp_serde::from_slice(&self.body).unwrap_or_else(|e| panic!("not msgpack: {e}"))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    try_request(port, method, path, headers, body)
        .await
        .expect("HTTP request")
}

/// Like [`request`], but a connection failure is an error (for readiness polling).
pub async fn try_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    request_over(stream, method, path, headers, body).await
}

/// One request over an open connection (TCP, or TLS for the TLS tests), read to its end.
pub async fn request_over<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse(&raw)
}

/// A response cut short (the server died while answering) is an error, not a panic.
fn parse(raw: &[u8]) -> std::io::Result<HttpResponse> {
    let cut = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "response cut short");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(cut)?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(cut)?;
    let mut content_type = String::new();
    let mut chunked = false;
    let mut headers = Vec::new();
    for line in lines {
        let (k, v) = line.split_once(':').unwrap_or((line, ""));
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        match k.trim().to_ascii_lowercase().as_str() {
            "content-type" => content_type = v.trim().to_owned(),
            "transfer-encoding" => chunked = v.trim().eq_ignore_ascii_case("chunked"),
            _ => {}
        }
    }
    if chunked {
        body = dechunk(&body);
    }
    Ok(HttpResponse {
        status,
        content_type,
        headers,
        body,
    })
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&raw[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
    }
}

pub async fn get(port: u16, path: &str) -> HttpResponse {
    request(port, "GET", path, &[], b"").await
}

pub async fn post_json(port: u16, path: &str, body: &serde_json::Value) -> HttpResponse {
    let bytes = serde_json::to_vec(body).expect("encode JSON");
    request(
        port,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        &bytes,
    )
    .await
}

pub async fn post_msgpack(port: u16, path: &str, body: &rmpv::Value) -> HttpResponse {
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, body).expect("encode msgpack");
    request(
        port,
        "POST",
        path,
        &[("Content-Type", "application/msgpack")],
        &bytes,
    )
    .await
}
