use super::*;

#[test]
fn embedded_default_parses_to_the_documented_values() {
    let c = Config::embedded_default();
    assert_eq!((c.http_server_port, c.rpc_server_port), (8080, 50052));
    assert!(c.kvevent_instance.is_empty());
    assert_eq!(c.data_dir, PathBuf::from("./conductor-data"));
    assert_eq!(c.checkpoint_interval_ms, 1000);
    assert_eq!(c.max_publisher_message_bytes, 64 << 20);
    assert_eq!(c.max_replay_held_bytes, 256 << 20);
    assert_eq!(c.warning_interval_ms, 10_000);
    assert_eq!(c.max_query_tokens, 4 << 20);
    assert_eq!(c.http_inflight_body_bytes, 256 << 20);
    assert_eq!(c.registration_policy(), RegistrationPolicy::default());
    assert_eq!((c.max_subscriptions, c.max_name_bytes), (4096, 256));
    assert_eq!(c.max_contexts_per_source, 64);
    assert!(c.auth_tokens.is_empty() && !c.auth_reads);
}

#[test]
fn endpoint_policy_keys() {
    let c = Config::parse(
        r#"{"allowed_endpoint_hosts": ["10.0.0.0/8", "::1", "pub"], "max_subscriptions": 3}"#,
        "c",
    )
    .unwrap();
    assert_eq!(
        c.registration_policy().allowed_hosts.map(|h| h.len()),
        Some(3)
    );
    assert_eq!(c.registration_policy().max_subscriptions, 3);
    let e = Config::parse(r#"{"allowed_endpoint_hosts": ["ok", "10.0.0.0/40"]}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("allowed_endpoint_hosts[1]"));
    let e = Config::parse(r#"{"allowed_endpoint_hosts": []}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("allowed_endpoint_hosts"));
    for key in [
        "max_subscriptions",
        "max_name_bytes",
        "max_contexts_per_source",
    ] {
        let e = Config::parse(&format!(r#"{{"{key}": 0}}"#), "c").unwrap_err();
        assert_eq!(e.field.as_deref(), Some(key));
    }
}

#[test]
fn missing_port_means_default_not_zero() {
    let c = Config::parse(r#"{"kvevent_instance": {}}"#, "t.json").unwrap();
    assert_eq!((c.http_server_port, c.rpc_server_port), (8080, 50052));
    let c = Config::parse(r#"{"http_server_port": 0}"#, "t.json").unwrap();
    assert_eq!(c.http_server_port, 0, "an explicit 0 asks for a free port");
}

#[test]
fn errors_name_the_file_and_the_field() {
    let e = Config::parse(r#"{"http_server_port": "80"}"#, "conf.json").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("http_server_port"));
    assert!(
        e.to_string()
            .starts_with("config conf.json: field `http_server_port`"),
        "{e}"
    );
    let e = Config::parse(r#"{"rpc_server_port": 70000}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("rpc_server_port"));
    let e = Config::parse(r#"{"typo_port": 1}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("typo_port"));
    let e = Config::parse(r#"{"kvevent_instance": {"a": 3}}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("kvevent_instance.a"));
    let e = Config::parse(r#"{"checkpoint_interval_ms": 0}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("checkpoint_interval_ms"));
    let e = Config::parse(r#"{"max_publisher_message_bytes": 0}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("max_publisher_message_bytes"));
    let e = Config::parse(r#"{"max_query_tokens": 0}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("max_query_tokens"));
    let e = Config::parse(r#"{"http_inflight_body_bytes": -1}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("http_inflight_body_bytes"));
    let e = Config::parse(r#"{"registry": {"etcd": {"endpoints": []}}}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("registry.etcd.endpoints"));
    let c = Config::parse(
        r#"{"registry": {"etcd": {"endpoints": ["http://e:2379"]}}}"#,
        "c",
    );
    let etcd = c.unwrap().shared_registry.expect("etcd registry");
    assert_eq!(etcd.endpoints, vec!["http://e:2379"]);
    assert!(Config::embedded_default().shared_registry.is_none());
}

#[test]
fn bootstrap_attempts_default_to_a_bound_and_zero_means_no_limit() {
    let c = Config::parse("{}", "c").unwrap();
    assert_eq!(
        c.replica.bootstrap_attempts,
        super::DEFAULT_BOOTSTRAP_ATTEMPTS
    );
    let c = Config::parse(r#"{"bootstrap_attempts": 0}"#, "c").unwrap();
    assert_eq!(c.replica.bootstrap_attempts, 0);
    for bad in [r#"-1"#, r#""3""#, "1.5", "4294967296"] {
        let e = Config::parse(&format!(r#"{{"bootstrap_attempts": {bad}}}"#), "c").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("bootstrap_attempts"), "{bad}");
        assert!(e.message.contains("0..="), "{bad}: {}", e.message);
    }
}

#[test]
fn bootstrap_from_needs_an_http_address_and_replica_id_a_short_name() {
    let c = Config::parse(
        r#"{"bootstrap_from": "http://10.0.0.5:50051", "bootstrap_allow_plain_http": true,
            "replica_id": "r-1"}"#,
        "c",
    )
    .unwrap();
    assert_eq!(
        c.replica.bootstrap_from.as_deref(),
        Some("http://10.0.0.5:50051")
    );
    assert_eq!(c.replica.replica_id.as_deref(), Some("r-1"));
    let e = Config::parse(r#"{"bootstrap_from": "10.0.0.5:50051"}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("bootstrap_from"));
    let e = Config::parse(r#"{"replica_id": ""}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("replica_id"));
    let e = Config::parse("[1]", "c").unwrap_err();
    assert_eq!(e.field, None);
    let e = Config::parse("{", "broken.json").unwrap_err();
    assert!(
        e.to_string().contains("broken.json") && e.to_string().contains("invalid JSON"),
        "{e}"
    );
}

#[test]
fn plain_http_bootstrap_to_another_host_needs_the_opt_in() {
    for peer in [
        "http://10.0.0.5:50051",
        "http://peer.example:1",
        "http://[fd00::1]:1",
    ] {
        let e = Config::parse(&format!(r#"{{"bootstrap_from": "{peer}"}}"#), "c").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("bootstrap_from"), "{peer}");
        assert!(e.message.contains("bootstrap_allow_plain_http"), "{e}");
    }
    for peer in ["http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1"] {
        let c = Config::parse(&format!(r#"{{"bootstrap_from": "{peer}"}}"#), "c").unwrap();
        assert_eq!(c.replica.bootstrap_from.as_deref(), Some(peer));
    }
    let e = Config::parse(r#"{"bootstrap_allow_plain_http": 1}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("bootstrap_allow_plain_http"));
}

#[test]
fn https_bootstrap_needs_a_ca_and_tls_names_its_fields() {
    let e = Config::parse(r#"{"bootstrap_from": "https://peer:1"}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("bootstrap_from"));
    assert!(e.message.contains("bootstrap_tls"), "{e}");
    let c = Config::parse(
        r#"{"bootstrap_from": "https://peer:1", "bootstrap_tls": {"ca_file": "ca.pem", "domain": "p"}}"#,
        "c",
    )
    .unwrap();
    let tls = c.replica.bootstrap_tls.expect("bootstrap_tls");
    assert_eq!(tls.ca_file, std::path::Path::new("ca.pem"));
    assert_eq!(tls.domain.as_deref(), Some("p"));
    let e = Config::parse(
        r#"{"bootstrap_from": "http://127.0.0.1:1", "bootstrap_tls": {"ca_file": "ca.pem"}}"#,
        "c",
    )
    .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("bootstrap_tls"));
    let e = Config::parse(r#"{"bootstrap_tls": {"domain": "p"}}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("bootstrap_tls.ca_file"));

    let c = Config::parse(
        r#"{"tls": {"cert_file": "c.pem", "key_file": "k.pem"}}"#,
        "c",
    )
    .unwrap();
    let tls = c.tls.expect("tls");
    assert_eq!(tls.handshake_timeout_ms, 10_000);
    assert_eq!(tls.key_file, std::path::Path::new("k.pem"));
    for (bad, field) in [
        (r#"{"cert_file": "c.pem"}"#, "tls.key_file"),
        (r#"{"cert_file": "", "key_file": "k"}"#, "tls.cert_file"),
        (
            r#"{"cert_file": "c", "key_file": "k", "handshake_timeout_ms": 0}"#,
            "tls.handshake_timeout_ms",
        ),
        (
            r#"{"cert_file": "c", "key_file": "k", "certfile": "c"}"#,
            "tls.certfile",
        ),
        (r#""c.pem""#, "tls"),
    ] {
        let e = Config::parse(&format!(r#"{{"tls": {bad}}}"#), "c").unwrap_err();
        assert_eq!(e.field.as_deref(), Some(field), "{bad}");
    }
}

#[test]
fn tokens_come_from_the_file_unless_the_environment_sets_them() {
    let mut c = Config::parse(r#"{"auth_token": "a,b", "auth_reads": true}"#, "c").unwrap();
    assert_eq!(c.auth_tokens, Tokens::parse("a,b").unwrap());
    assert!(c.auth_reads);
    c.apply_token_env(Some("  ")).unwrap();
    assert_eq!(c.auth_tokens.len(), 2, "an empty variable changes nothing");
    c.apply_token_env(Some("env")).unwrap();
    assert_eq!(c.auth_tokens, Tokens::parse("env").unwrap());
    let e = c.apply_token_env(Some("a b")).unwrap_err();
    assert!(
        e.to_string().contains(AUTH_TOKEN_ENV) && !e.to_string().contains("a b"),
        "{e}"
    );

    let e = Config::parse(r#"{"auth_token": "x,,y"}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("auth_token"));
    assert!(
        !e.to_string().contains("x,,y"),
        "never repeats the secret: {e}"
    );
    let e = Config::parse(r#"{"auth_reads": "yes"}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("auth_reads"));
    let mut c = Config::parse(r#"{"auth_reads": true}"#, "c").unwrap();
    let e = c.apply_token_env(None).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("auth_reads"), "nothing to ask for");
    let debug = format!(
        "{:?}",
        Config::parse(r#"{"auth_token": "zq9secret"}"#, "c").unwrap()
    );
    assert!(!debug.contains("zq9secret"), "{debug}");
}

#[test]
fn static_entries_are_all_kept() {
    let c = Config::parse(
        r#"{"kvevent_instance": {"b": {"type": "vLLM"}, "a": {}}}"#,
        "c",
    )
    .unwrap();
    let keys: Vec<&str> = c.kvevent_instance.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 2);
    assert!(keys.contains(&"a") && keys.contains(&"b"));
}

#[test]
fn unreadable_file_names_the_path() {
    let e = Config::from_file(Path::new("/nonexistent/conductor.json")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/conductor.json"), "{e}");
}

#[test]
fn log_levels_are_case_insensitive() {
    assert_eq!(LogLevel::parse(Some("debug")), Ok(LogLevel::Debug));
    assert_eq!(LogLevel::parse(Some("Warn")), Ok(LogLevel::Warn));
    assert_eq!(LogLevel::parse(Some("ERROR")), Ok(LogLevel::Error));
    assert_eq!(LogLevel::parse(None), Ok(LogLevel::Info));
    assert_eq!(LogLevel::parse(Some("")), Ok(LogLevel::Info));
    assert!(LogLevel::parse(Some("verbose")).is_err());
}

#[test]
fn publisher_liveness_keys() {
    let c = Config::embedded_default();
    assert_eq!(
        (
            c.publisher_heartbeat_ms,
            c.publisher_timeout_ms,
            c.publisher_unreachable_grace_ms
        ),
        (5_000, 15_000, 30_000)
    );
    let c = Config::parse(
        r#"{"publisher_heartbeat_ms": 200, "publisher_timeout_ms": 1000,
            "publisher_unreachable_grace_ms": 1500}"#,
        "c",
    )
    .unwrap();
    let s = c.subscription_settings();
    assert_eq!(
        s.timings.heartbeat,
        Heartbeat {
            interval: std::time::Duration::from_millis(200),
            timeout: std::time::Duration::from_millis(1000),
        }
    );
    assert_eq!(s.unreachable_grace, std::time::Duration::from_millis(1500));
    // A timeout no longer than the interval would give up on a peer before it could answer.
    let e = Config::parse(
        r#"{"publisher_heartbeat_ms": 2000, "publisher_timeout_ms": 2000}"#,
        "c",
    )
    .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("publisher_timeout_ms"));
    for key in [
        "publisher_heartbeat_ms",
        "publisher_timeout_ms",
        "publisher_unreachable_grace_ms",
    ] {
        let e = Config::parse(&format!(r#"{{"{key}": 0}}"#), "c").unwrap_err();
        assert_eq!(e.field.as_deref(), Some(key));
    }
    let e = Config::parse(r#"{"publisher_timeout_ms": 7000000}"#, "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("publisher_timeout_ms"));
}

#[test]
fn bootstrap_bounds_default_and_are_positive() {
    let c = Config::parse("{}", "c").unwrap();
    assert_eq!(
        c.replica.bootstrap_deadline_ms,
        super::DEFAULT_BOOTSTRAP_DEADLINE_MS
    );
    assert_eq!(
        c.replica.bootstrap_max_bytes,
        super::DEFAULT_BOOTSTRAP_MAX_BYTES
    );
    let c = Config::parse(
        r#"{"bootstrap_deadline_ms": 500, "bootstrap_max_bytes": 9}"#,
        "c",
    )
    .unwrap();
    assert_eq!(
        (
            c.replica.bootstrap_deadline_ms,
            c.replica.bootstrap_max_bytes
        ),
        (500, 9)
    );
    for (key, bad) in [
        ("bootstrap_deadline_ms", "0"),
        ("bootstrap_max_bytes", "0"),
        ("bootstrap_max_bytes", r#""1G""#),
    ] {
        let e = Config::parse(&format!(r#"{{"{key}": {bad}}}"#), "c").unwrap_err();
        assert_eq!(e.field.as_deref(), Some(key), "{bad}");
    }
}

#[test]
fn snapshot_export_needs_a_token_unless_opened() {
    let c = Config::parse("{}", "c").unwrap();
    assert!(
        !c.replica.snapshot_export_open,
        "refused without a token by default"
    );
    assert!(
        Config::parse(r#"{"snapshot_export": "open"}"#, "c")
            .unwrap()
            .replica
            .snapshot_export_open
    );
    assert!(
        !Config::parse(r#"{"snapshot_export": "auth"}"#, "c")
            .unwrap()
            .replica
            .snapshot_export_open
    );
    for bad in [r#""yes""#, "true", "1"] {
        let e = Config::parse(&format!(r#"{{"snapshot_export": {bad}}}"#), "c").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("snapshot_export"), "{bad}");
        assert!(e.message.contains("\"open\""), "{}", e.message);
    }
}

#[test]
fn memory_budget_keys() {
    let c = Config::embedded_default();
    assert_eq!((c.max_index_bytes, c.max_context_blocks), (None, 0));
    let budget = c.index_budget();
    assert_eq!(
        budget.max_index_bytes(),
        crate::index::budget::default_max_index_bytes(),
        "unset: sized from the machine"
    );
    let c = Config::parse(
        r#"{"max_index_bytes": 0, "max_context_blocks": 200000}"#,
        "c",
    )
    .unwrap();
    let budget = c.index_budget();
    assert_eq!(
        (budget.max_index_bytes(), budget.max_context_blocks()),
        (0, 200_000)
    );
    let c = Config::parse(r#"{"max_index_bytes": 1073741824}"#, "c").unwrap();
    assert_eq!(c.index_budget().max_index_bytes(), 1 << 30);
    for (key, value) in [
        ("max_index_bytes", "1000"),
        ("max_index_bytes", "-1"),
        ("max_index_bytes", "\"1G\""),
        ("max_context_blocks", "-5"),
        ("max_context_blocks", "1e20"),
    ] {
        let e = Config::parse(&format!(r#"{{"{key}": {value}}}"#), "c").unwrap_err();
        assert_eq!(e.field.as_deref(), Some(key), "{key} = {value}");
    }
}
