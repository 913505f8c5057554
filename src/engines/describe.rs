//! The engines' own descriptions of their KV-event sources, read from the HTTP server each
//! engine already runs (`docs/engine-discovery.md`, "What the engines say"):
//!
//! - vLLM: `GET /kv_event_sources` is an object from DP rank (decimal text) to that rank's
//!   `KVEventsConfig` as its engine core reported it (`endpoint` with the rank's port offset
//!   applied, `replay_endpoint` or `null`, `topic`, `publisher`, `enable_kv_cache_events`, ...);
//!   `GET /v1/models` lists the served model names.
//! - SGLang: `GET /server_info` carries `kv_event_sources: [{dp_rank, endpoint, topic,
//!   block_size, replay_endpoint?}]` and `served_model_name`.
//!
//! Every parser is total over any JSON: a field of the wrong shape is an error naming it,
//! never a panic; unknown fields are ignored, as the engines' own decoders do.

use std::collections::BTreeMap;

use serde_json::Value;

/// One DP rank's event source as the engine reports it (endpoints not yet rewritten).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedSource {
    pub endpoint: String,
    /// `None`: no replay socket.
    pub replay_endpoint: Option<String>,
    pub topic: String,
    /// SGLang reports its page size; vLLM does not say.
    pub block_size: Option<u32>,
}

/// What one read of an engine's description gave.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Description {
    /// By DP rank.
    pub sources: BTreeMap<u32, ReportedSource>,
    /// Served model names, in the engine's order.
    pub models: Vec<String>,
}

/// Parse vLLM's `/kv_event_sources`. Ranks whose publisher is not ZeroMQ (`"null"`, events
/// disabled) publish nothing and are left out. More than `max_ranks` ranks is refused.
pub fn vllm_sources(
    body: &[u8],
    max_ranks: usize,
) -> Result<BTreeMap<u32, ReportedSource>, String> {
    let value = json(body, "/kv_event_sources")?;
    let Value::Object(ranks) = value else {
        return Err("/kv_event_sources: expected an object of DP rank -> KVEventsConfig".into());
    };
    if ranks.len() > max_ranks {
        return Err(format!(
            "/kv_event_sources names {} ranks; the limit is {max_ranks} (max_ranks_per_engine)",
            ranks.len()
        ));
    }
    let mut sources = BTreeMap::new();
    for (rank_text, config) in &ranks {
        let rank = rank_number(rank_text)
            .ok_or_else(|| format!("/kv_event_sources: {rank_text:?} is not a DP rank"))?;
        let at = |field: &str| format!("/kv_event_sources[{rank}].{field}");
        let Value::Object(config) = config else {
            return Err(format!("/kv_event_sources[{rank}]: expected an object"));
        };
        let enabled = match config.get("enable_kv_cache_events") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(format!(
                    "{}: expected a boolean",
                    at("enable_kv_cache_events")
                ));
            }
        };
        let publisher = opt_str(config.get("publisher"), &at("publisher"))?;
        if !enabled || publisher.is_some_and(|p| p != "zmq") {
            continue;
        }
        let endpoint = opt_str(config.get("endpoint"), &at("endpoint"))?
            .ok_or_else(|| format!("{}: missing", at("endpoint")))?;
        let replay = opt_str(config.get("replay_endpoint"), &at("replay_endpoint"))?;
        let topic = opt_str(config.get("topic"), &at("topic"))?.unwrap_or_default();
        sources.insert(
            rank,
            ReportedSource {
                endpoint: endpoint.to_owned(),
                replay_endpoint: replay.filter(|r| !r.is_empty()).map(str::to_owned),
                topic: topic.to_owned(),
                block_size: None,
            },
        );
    }
    Ok(sources)
}

/// Parse an OpenAI-style `/v1/models` list: the `id` of each entry of `data`.
pub fn vllm_models(body: &[u8], max_models: usize) -> Result<Vec<String>, String> {
    let value = json(body, "/v1/models")?;
    let Some(Value::Array(data)) = value.get("data") else {
        return Err("/v1/models: expected an object with a `data` list".into());
    };
    let mut models = Vec::new();
    for (i, entry) in data.iter().take(max_models).enumerate() {
        match entry.get("id") {
            Some(Value::String(id)) if !id.is_empty() => models.push(id.clone()),
            _ => {
                return Err(format!(
                    "/v1/models: data[{i}].id: expected a non-empty string"
                ));
            }
        }
    }
    Ok(models)
}

/// Parse SGLang's `/server_info`: its `kv_event_sources` and `served_model_name`.
pub fn sglang_server_info(body: &[u8], max_ranks: usize) -> Result<Description, String> {
    let value = json(body, "/server_info")?;
    let Value::Object(info) = value else {
        return Err("/server_info: expected an object".into());
    };
    let list = match info.get("kv_event_sources") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(list)) => list,
        Some(_) => return Err("/server_info.kv_event_sources: expected a list".into()),
    };
    if list.len() > max_ranks {
        return Err(format!(
            "/server_info.kv_event_sources names {} ranks; the limit is {max_ranks} (max_ranks_per_engine)",
            list.len()
        ));
    }
    let mut sources = BTreeMap::new();
    for (i, source) in list.iter().enumerate() {
        let at = |field: &str| format!("/server_info.kv_event_sources[{i}].{field}");
        let Value::Object(source) = source else {
            return Err(format!(
                "/server_info.kv_event_sources[{i}]: expected an object"
            ));
        };
        let rank = match source.get("dp_rank") {
            None => 0,
            Some(v) => v
                .as_u64()
                .filter(|r| *r <= i32::MAX as u64)
                .ok_or_else(|| format!("{}: expected a non-negative integer", at("dp_rank")))?
                as u32,
        };
        let endpoint = opt_str(source.get("endpoint"), &at("endpoint"))?
            .filter(|e| !e.is_empty())
            .ok_or_else(|| format!("{}: missing", at("endpoint")))?;
        let replay = opt_str(source.get("replay_endpoint"), &at("replay_endpoint"))?;
        let topic = opt_str(source.get("topic"), &at("topic"))?.unwrap_or_default();
        let block_size = match source.get("block_size") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(0) => None,
                Some(b) if b <= u32::MAX as u64 => Some(b as u32),
                _ => {
                    return Err(format!(
                        "{}: expected a non-negative integer",
                        at("block_size")
                    ));
                }
            },
        };
        let reported = ReportedSource {
            endpoint: endpoint.to_owned(),
            replay_endpoint: replay.filter(|r| !r.is_empty()).map(str::to_owned),
            topic: topic.to_owned(),
            block_size,
        };
        if sources.insert(rank, reported).is_some() {
            return Err(format!("{}: rank {rank} is listed twice", at("dp_rank")));
        }
    }
    if sources.is_empty()
        && let Some(kv_events) = info.get("kv_events").filter(|v| !v.is_null())
    {
        sources = sglang_publisher_ranks(kv_events, max_ranks)?;
    }
    let models = match info.get("served_model_name") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(name)) if !name.is_empty() => vec![name.clone()],
        Some(_) => {
            return Err("/server_info.served_model_name: expected a non-empty string".into());
        }
    };
    Ok(Description { sources, models })
}

/// SGLang's `kv_events` descriptor, which `/server_info` carries whether or not it lists
/// `kv_event_sources` (those only with `--grpc-port`): rank `r` publishes on
/// `endpoint_port_base + r` (and replays on `replay_endpoint_port_base + r`) at
/// `endpoint_host`, for every rank below `dp_size`.
fn sglang_publisher_ranks(
    kv_events: &Value,
    max_ranks: usize,
) -> Result<BTreeMap<u32, ReportedSource>, String> {
    let at = |field: &str| format!("/server_info.kv_events.{field}");
    let Value::Object(d) = kv_events else {
        return Err("/server_info.kv_events: expected an object".into());
    };
    if opt_str(d.get("publisher"), &at("publisher"))?.is_some_and(|p| p != "zmq") {
        return Ok(BTreeMap::new());
    }
    let number = |field: &str, max: u64| -> Result<Option<u64>, String> {
        match d.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(Some(n)),
                _ => Err(format!("{}: expected an integer in 0..={max}", at(field))),
            },
        }
    };
    let host = opt_str(d.get("endpoint_host"), &at("endpoint_host"))?
        .ok_or_else(|| format!("{}: missing", at("endpoint_host")))?;
    let base = number("endpoint_port_base", 65535)?
        .ok_or_else(|| format!("{}: missing", at("endpoint_port_base")))?;
    let replay_base = number("replay_endpoint_port_base", 65535)?;
    let dp_size = number("dp_size", u32::MAX as u64)?.unwrap_or(1);
    if dp_size > max_ranks as u64 {
        return Err(format!(
            "{} is {dp_size}; the limit is {max_ranks} (max_ranks_per_engine)",
            at("dp_size")
        ));
    }
    let block_size = number("block_size", u32::MAX as u64)?.filter(|b| *b > 0);
    let topic = opt_str(d.get("topic"), &at("topic"))?.unwrap_or_default();
    let host = match host.parse::<std::net::Ipv6Addr>() {
        Ok(_) => format!("[{host}]"),
        Err(_) => host.to_owned(),
    };
    let endpoint = |base: u64, rank: u64, field: &str| match base + rank {
        port @ 1..=65535 => Ok(format!("tcp://{host}:{port}")),
        port => Err(format!(
            "{}: rank {rank} would publish on port {port}",
            at(field)
        )),
    };
    let mut sources = BTreeMap::new();
    for rank in 0..dp_size {
        let replay = match replay_base {
            Some(b) => Some(endpoint(b, rank, "replay_endpoint_port_base")?),
            None => None,
        };
        let source = ReportedSource {
            endpoint: endpoint(base, rank, "endpoint_port_base")?,
            replay_endpoint: replay,
            topic: topic.to_owned(),
            block_size: block_size.map(|b| b as u32),
        };
        sources.insert(rank as u32, source);
    }
    Ok(sources)
}

fn json(body: &[u8], route: &str) -> Result<Value, String> {
    serde_json::from_slice(body).map_err(|e| format!("{route}: not JSON ({e})"))
}

fn opt_str<'a>(value: Option<&'a Value>, at: &str) -> Result<Option<&'a str>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("{at}: expected a string")),
    }
}

/// A DP rank written as JSON object keys write it: canonical decimal digits.
fn rank_number(text: &str) -> Option<u32> {
    let canonical = !text.is_empty() && (text == "0" || !text.starts_with('0'));
    (canonical && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse::<u32>().ok())
        .flatten()
        .filter(|r| *r <= i32::MAX as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape vLLM 0.33's route answers for two ranks (FastAPI's encoding of
    /// `dict[int, KVEventsConfig]`), with the rank offset already in the port.
    const VLLM_TWO_RANKS: &str = r#"{
        "0": {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
              "replay_endpoint": "tcp://*:5600", "buffer_steps": 10000, "hwm": 100000,
              "max_queue_size": 100000, "topic": "kv"},
        "1": {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5558",
              "replay_endpoint": null, "buffer_steps": 10000, "hwm": 100000,
              "max_queue_size": 100000, "topic": "kv"}}"#;

    #[test]
    fn vllm_sources_by_rank() {
        let s = vllm_sources(VLLM_TWO_RANKS.as_bytes(), 8).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[&0].endpoint, "tcp://*:5557");
        assert_eq!(s[&0].replay_endpoint.as_deref(), Some("tcp://*:5600"));
        assert_eq!(s[&1].replay_endpoint, None);
        assert_eq!(s[&1].topic, "kv");
        assert_eq!(s[&1].block_size, None);
        // A render-only server answers {}; a disabled or null publisher publishes nothing.
        assert!(vllm_sources(b"{}", 8).unwrap().is_empty());
        let off = br#"{"0": {"enable_kv_cache_events": false, "publisher": "null", "endpoint": "tcp://*:1"}}"#;
        assert!(vllm_sources(off, 8).unwrap().is_empty());
    }

    #[test]
    fn vllm_descriptions_of_the_wrong_shape_name_the_field() {
        for (body, why) in [
            (&b"[]"[..], "expected an object"),
            (b"{\"x\": {}}", "not a DP rank"),
            (b"{\"01\": {}}", "not a DP rank"),
            (b"{\"0\": 5}", "[0]: expected an object"),
            (b"{\"0\": {\"endpoint\": 5}}", "[0].endpoint"),
            (b"{\"0\": {}}", "[0].endpoint: missing"),
            (
                b"{\"0\": {\"endpoint\": \"tcp://*:1\", \"topic\": []}}",
                "[0].topic",
            ),
            (b"not json", "not JSON"),
        ] {
            let e = vllm_sources(body, 8).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let many: String = (0..9)
            .map(|r| format!("\"{r}\": {{}}"))
            .collect::<Vec<_>>()
            .join(",");
        let e = vllm_sources(format!("{{{many}}}").as_bytes(), 8).unwrap_err();
        assert!(e.contains("limit is 8"), "{e}");
    }

    #[test]
    fn vllm_models_list() {
        let body = br#"{"object": "list", "data": [{"id": "llama", "object": "model"}, {"id": "lora-a"}]}"#;
        assert_eq!(vllm_models(body, 16).unwrap(), ["llama", "lora-a"]);
        assert!(
            vllm_models(br#"{"data": [{"id": 3}]}"#, 16)
                .unwrap_err()
                .contains("data[0].id")
        );
        assert!(vllm_models(b"{}", 16).unwrap_err().contains("`data`"));
    }

    #[test]
    fn sglang_server_info_sources_and_model() {
        let body = br#"{"model_path": "/m", "served_model_name": "qwen", "page_size": 64,
            "kv_event_sources": [
              {"dp_rank": 1, "endpoint": "tcp://127.0.0.1:5558", "topic": "", "block_size": 64},
              {"dp_rank": 0, "endpoint": "tcp://127.0.0.1:5557", "topic": "", "block_size": 64,
               "replay_endpoint": "tcp://127.0.0.1:5600"}]}"#;
        let d = sglang_server_info(body, 8).unwrap();
        assert_eq!(d.models, ["qwen"]);
        assert_eq!(d.sources.len(), 2);
        assert_eq!(
            d.sources[&0].replay_endpoint.as_deref(),
            Some("tcp://127.0.0.1:5600")
        );
        assert_eq!(d.sources[&1].block_size, Some(64));
        // An engine without KV events has no list.
        assert!(sglang_server_info(b"{}", 8).unwrap().sources.is_empty());
    }

    #[test]
    fn sglang_publisher_descriptor_without_a_source_list() {
        // What /server_info says without --grpc-port: the publisher's descriptor only.
        let body = br#"{"served_model_name": "qwen", "kv_events": {"publisher": "zmq",
            "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "", "block_size": 64,
            "dp_size": 2, "replay_endpoint_port_base": 5600}}"#;
        let d = sglang_server_info(body, 8).unwrap();
        assert_eq!(d.sources.len(), 2);
        assert_eq!(d.sources[&1].endpoint, "tcp://*:5558");
        assert_eq!(
            d.sources[&1].replay_endpoint.as_deref(),
            Some("tcp://*:5601")
        );
        assert_eq!(d.sources[&0].block_size, Some(64));
        let v6 = br#"{"kv_events": {"endpoint_host": "fd00::2", "endpoint_port_base": 7000}}"#;
        assert_eq!(
            sglang_server_info(v6, 8).unwrap().sources[&0].endpoint,
            "tcp://[fd00::2]:7000"
        );
        for (body, why) in [
            (&br#"{"kv_events": {"endpoint_host": "*", "endpoint_port_base": 65535, "dp_size": 2}}"#[..], "port 65536"),
            (br#"{"kv_events": {"endpoint_host": "*", "endpoint_port_base": 1, "dp_size": 9}}"#, "limit is 8"),
            (br#"{"kv_events": {"endpoint_port_base": 1}}"#, "endpoint_host: missing"),
            (br#"{"kv_events": 3}"#, "expected an object"),
        ] {
            let e = sglang_server_info(body, 8).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        // A listed source wins over the descriptor.
        let both = br#"{"kv_event_sources": [{"endpoint": "tcp://127.0.0.1:9"}],
            "kv_events": {"endpoint_host": "*", "endpoint_port_base": 5557, "dp_size": 4}}"#;
        assert_eq!(sglang_server_info(both, 8).unwrap().sources.len(), 1);
    }

    #[test]
    fn sglang_descriptions_of_the_wrong_shape_name_the_field() {
        for (body, why) in [
            (&br#"{"kv_event_sources": {}}"#[..], "expected a list"),
            (
                br#"{"kv_event_sources": [{"dp_rank": -1, "endpoint": "tcp://a:1"}]}"#,
                "[0].dp_rank",
            ),
            (
                br#"{"kv_event_sources": [{"dp_rank": 0}]}"#,
                "[0].endpoint: missing",
            ),
            (
                br#"{"kv_event_sources": [{"endpoint": "tcp://a:1", "block_size": "x"}]}"#,
                "[0].block_size",
            ),
            (
                br#"{"kv_event_sources": [{"endpoint": "tcp://a:1"}, {"endpoint": "tcp://a:2"}]}"#,
                "listed twice",
            ),
            (br#"{"served_model_name": 7}"#, "served_model_name"),
        ] {
            let e = sglang_server_info(body, 8).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }
}
