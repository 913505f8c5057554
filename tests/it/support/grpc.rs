//! gRPC helpers every scenario shares: the JSON registration as a `RegisterRequest`, and
//! registering it on a server.

use mooncake_conductor::gateway::pb;

use super::server::Server;

/// The JSON registration (as `engine::Registration::json` builds it) as the gRPC request: absent keys
/// stay absent, so a test can leave out a field to see it rejected.
pub fn register_request(v: &serde_json::Value) -> pb::RegisterRequest {
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let i = |k: &str| v.get(k).and_then(|x| x.as_i64());
    let profile = v
        .get("hash_profile")
        .and_then(|p| p.as_object())
        .cloned()
        .unwrap_or_default();
    pb::RegisterRequest {
        instance_id: s("instance_id"),
        endpoint: s("endpoint"),
        replay_endpoint: s("replay_endpoint"),
        publisher_type: s("publisher_type"),
        model_name: s("model_name"),
        lora_name: s("lora_name"),
        tenant_id: s("tenant_id"),
        block_size: i("block_size"),
        dp_rank: i("dp_rank"),
        cache_group: i("cache_group"),
        hybrid_parts: s("hybrid_parts"),
        has_hash_profile: v.get("hash_profile").is_some(),
        hash_profile: profile
            .into_iter()
            .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_owned()))
            .collect(),
    }
}

impl Server {
    /// Register `registration` over gRPC and hand back the reply; a transport error fails the
    /// test.
    pub async fn register(&self, registration: &serde_json::Value) -> pb::RegisterResponse {
        self.grpc()
            .await
            .register(register_request(registration))
            .await
            .expect("register")
            .into_inner()
    }

    /// Register `registration` and require it accepted (`ret` 0), showing the error detail if
    /// not.
    pub async fn register_ok(&self, registration: &serde_json::Value) {
        let reply = self.register(registration).await;
        assert_eq!(reply.ret, 0, "{:?}", reply.error);
    }

    /// Unregister `instance`, rank 0, over gRPC and require it accepted.
    pub async fn unregister_ok(&self, instance: &str) {
        let request = pb::UnregisterRequest {
            instance_id: instance.into(),
            tenant_id: String::new(),
            dp_rank: 0,
        };
        let reply = self
            .grpc()
            .await
            .unregister(request)
            .await
            .expect("unregister")
            .into_inner();
        assert_eq!(reply.ret, 0, "{:?}", reply.error);
    }
}
