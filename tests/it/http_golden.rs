//! Golden HTTP exchanges: every file of `tests/fixtures/http/` is a list of requests (method,
//! path, headers, body bytes) sent in order to one fresh service, each with the status,
//! `Content-Type` and body bytes it must answer, compared byte for byte. JSON bodies are kept
//! as text, msgpack ones as hex. `BLESS_HTTP_FIXTURES=1` rewrites the expected answers from the
//! service (review the diff before committing it).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::support::http;
use crate::support::server::Server;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/http")
}

/// A request or response body: `text` (UTF-8) or `hex`.
fn body_of(case: &Map<String, Value>, text: &str, hex: &str) -> Option<Vec<u8>> {
    if let Some(t) = case.get(text).and_then(Value::as_str) {
        return Some(t.as_bytes().to_vec());
    }
    let h = case.get(hex)?.as_str()?;
    Some(decode_hex(h))
}

fn decode_hex(h: &str) -> Vec<u8> {
    let h: String = h.chars().filter(|c| !c.is_whitespace()).collect();
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
        .collect()
}

fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Run one file's exchanges; returns how many ran and a line per mismatch.
async fn run_file(path: &Path, bless: bool) -> (usize, Vec<String>) {
    let text = std::fs::read_to_string(path).expect("fixture file");
    let mut doc: Value = serde_json::from_str(&text).expect("fixture JSON");
    let config = doc.get("config").cloned().unwrap_or_else(|| json!({}));
    let server = Server::start_with(config).await;
    let mut failures = Vec::new();
    let cases = doc["cases"].as_array_mut().expect("cases");
    for case in cases.iter_mut() {
        let case = case.as_object_mut().expect("case object");
        let name = case["name"].as_str().expect("name").to_owned();
        let method = case["method"].as_str().expect("method").to_owned();
        let route = case["path"].as_str().expect("path").to_owned();
        let headers: Vec<(String, String)> = case
            .get("headers")
            .and_then(Value::as_object)
            .map(|h| {
                h.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().expect("header").to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let header_refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let body = body_of(case, "body", "body_hex").unwrap_or_default();
        let r = http::request(server.http_port, &method, &route, &header_refs, &body).await;
        let msgpack = r.content_type.contains("msgpack");
        if bless {
            case.insert("status".into(), json!(r.status));
            case.insert("content_type".into(), json!(r.content_type));
            case.remove("response");
            case.remove("response_hex");
            match (msgpack, String::from_utf8(r.body.clone())) {
                (false, Ok(t)) => case.insert("response".into(), json!(t)),
                _ => case.insert("response_hex".into(), json!(encode_hex(&r.body))),
            };
            continue;
        }
        let expected = body_of(case, "response", "response_hex")
            .unwrap_or_else(|| panic!("{}: case {name:?} has no expected answer", path.display()));
        let got = (r.status, r.content_type.as_str(), &r.body);
        let want = (
            case["status"].as_u64().expect("status") as u16,
            case["content_type"].as_str().expect("content_type"),
            &expected,
        );
        if got != want {
            failures.push(format!(
                "{}: {name}: got {} {} {:?} ({}), want {} {} {:?} ({})",
                path.file_name().unwrap().to_string_lossy(),
                got.0,
                got.1,
                String::from_utf8_lossy(got.2),
                encode_hex(got.2),
                want.0,
                want.1,
                String::from_utf8_lossy(want.2),
                encode_hex(want.2)
            ));
        }
    }
    let n = cases.len();
    if bless {
        let mut out = serde_json::to_string_pretty(&doc).unwrap();
        out.push('\n');
        std::fs::write(path, out).unwrap();
    }
    (n, failures)
}

/// Every route's golden exchanges, JSON and msgpack, every error reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_the_golden_bytes() {
    let bless = std::env::var_os("BLESS_HTTP_FIXTURES").is_some();
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
        .expect("tests/fixtures/http")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    for route in [
        "register",
        "unregister",
        "query",
        "query_by_hash",
        "global_view",
        "services",
        "fallbacks",
    ] {
        assert!(names.iter().any(|n| n == route), "no golden file {route}");
    }
    let (mut total, mut failures) = (0, Vec::new());
    for file in &files {
        let (n, mut failed) = run_file(file, bless).await;
        total += n;
        failures.append(&mut failed);
    }
    assert!(
        failures.is_empty(),
        "{} of {total} golden exchanges differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(total > 100, "only {total} golden exchanges");
}
