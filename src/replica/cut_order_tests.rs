//! The cut's order with the real actors and a real publisher on loopback: a context a source
//! creates after the contexts were listed (while they wait for their export) is missing from
//! the snapshot, and the new replica's replay from the source's position brings it back, while
//! the context the snapshot holds skips what it already has.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Addr};
use rmpv::Value as M;

use crate::durability::recovery::Recovered;
use crate::fixture::publisher::Publisher;
use crate::gateway::registration::PYTHON_NAMES;
use crate::index::ContextSnapshot;
use crate::index::actor::Snapshot;
use crate::index::directory::{ArbiterPool, ContextDirectory};
use crate::model::{PublisherConfig, SubscriptionKey};
use crate::registry::{ListServices, Origin, Register, Registry, SubscriptionDirectory};
use crate::storage::KvStore;
use crate::storage::memory::MemoryStore;

use super::cut::Listing;

/// One replica's moving parts, without its servers.
struct Replica {
    store: Arc<dyn KvStore>,
    contexts: ContextDirectory,
    subscriptions: SubscriptionDirectory,
    registry: Addr<Registry>,
}

impl Replica {
    fn start(
        loaded: Option<Recovered>,
    ) -> (
        Replica,
        Vec<crate::durability::recovery::RestoredRegistration>,
    ) {
        let store: Arc<dyn KvStore> = Arc::new(MemoryStore::default());
        let contexts = ContextDirectory::new(ArbiterPool::new(1));
        let mut registrations = Vec::new();
        if let Some(recovered) = loaded {
            for index in recovered.contexts {
                contexts.insert(contexts.start(index));
            }
            registrations = recovered.registrations;
        }
        let subscriptions = SubscriptionDirectory::default();
        let settings = crate::config::Config::parse("{}", "test")
            .expect("default config")
            .subscription_settings();
        let registry = Registry::new(
            contexts.clone(),
            subscriptions.clone(),
            settings,
            store.clone(),
        )
        .start();
        let replica = Replica {
            store,
            contexts,
            subscriptions,
            registry,
        };
        (replica, registrations)
    }

    async fn register(
        &self,
        config: PublisherConfig,
        restored: Option<crate::durability::sources::Restored>,
    ) {
        self.registry
            .send(Register {
                config,
                names: PYTHON_NAMES,
                restored,
                origin: Origin::Request,
            })
            .await
            .expect("registry")
            .expect("registered");
    }

    /// Wait until the subscription applied batch `seq`, re-sending it meanwhile (a PUB drops
    /// what it sends before the subscription reached it; duplicates are ignored).
    async fn applied(&self, publisher: &mut Publisher, seq: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let services = self.registry.send(ListServices).await.expect("registry");
            if services.iter().all(|s| s.status.last_seq == Some(seq)) {
                return;
            }
            assert!(Instant::now() < deadline, "batch {seq} never applied");
            publisher.resend(seq).await.expect("resend");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every context's content, by key.
    async fn contents(&self) -> Vec<ContextSnapshot> {
        let mut out = Vec::new();
        for handle in self.contexts.all() {
            out.push(handle.send(Snapshot).await.expect("context"));
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

/// A vLLM batch storing one block (two tokens, distinct per `n`) of the adapter `lora`.
fn stored(n: i64, lora: Option<&str>) -> Vec<u8> {
    let s = |v: &str| M::from(v);
    let event = M::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), M::Array(vec![M::from(1000 + n)])),
        (s("parent_block_hash"), M::Nil),
        (
            s("token_ids"),
            M::Array(vec![M::from(2 * n), M::from(2 * n + 1)]),
        ),
        (s("block_size"), M::from(2)),
        (s("lora_id"), lora.map_or(M::Nil, |_| M::from(1))),
        (s("medium"), s("GPU")),
        (s("lora_name"), lora.map_or(M::Nil, M::from)),
        (s("extra_keys"), M::Array(vec![M::Nil])),
        (s("group_idx"), M::from(0)),
        (s("kv_cache_spec_kind"), s("full_attention")),
    ]);
    let mut out = Vec::new();
    let batch = M::Array(vec![M::F64(1.5e9), M::Array(vec![event]), M::from(0)]);
    rmpv::encode::write_value(&mut out, &batch).expect("encode");
    out
}

/// The snapshot's chunks loaded as a pull loads them: built as they arrive, each source
/// resuming from the position the begin mark names.
fn load(chunks: &[crate::gateway::pb::SnapshotChunk]) -> Recovered {
    let begin = chunks[0].begin.clone().expect("begin mark");
    assert!(!begin.sources.is_empty());
    super::build_tests::build(chunks).expect("built")
}

#[test]
fn a_context_created_during_the_export_is_replayed_on_the_new_replica() {
    actix_rt::System::new().block_on(async {
        let mut publisher = Publisher::loopback(true, 0).await.expect("publisher");
        let config = PublisherConfig {
            replay_endpoint: publisher.replay_endpoint.clone().expect("replay endpoint"),
            block_size: 2,
            ..PublisherConfig::test_vllm("e0", &publisher.endpoint)
        };
        let source: SubscriptionKey = config.subscription_key();
        let (peer, _) = Replica::start(None);
        peer.register(config.clone(), None).await;
        assert!(publisher.wait_subscriber(Duration::from_secs(10)).await);
        publisher.publish(stored(0, None)).await.expect("publish");
        peer.applied(&mut publisher, 0).await;

        // The cut begins: the source's position (batch 0) is taken, then the contexts listed.
        let listing = Listing::take(&peer.contexts, &peer.subscriptions).await;
        // Before the listed context is exported, batch 1 creates the adapter's context and
        // batch 2 moves the base model's context past it.
        publisher
            .publish(stored(1, Some("ad")))
            .await
            .expect("publish");
        publisher.publish(stored(2, None)).await.expect("publish");
        peer.applied(&mut publisher, 2).await;
        let cut = listing.export(peer.store.as_ref()).await.expect("cut");
        assert_eq!(
            cut.contexts.len(),
            1,
            "the adapter's context is not in the cut"
        );
        assert_eq!(cut.positions.get(&source).map(|m| m.seq), Some(0));
        let exported_mark = cut.contexts[0]
            .watermarks
            .iter()
            .find(|(s, _)| *s == source)
            .and_then(|(_, m)| *m);
        assert_eq!(
            exported_mark.map(|m| m.seq),
            Some(2),
            "exported after batch 2"
        );

        let chunks: Vec<_> = cut.into_chunks("peer".into(), 64 * 1024).collect();
        let recovered = load(&chunks);
        let (replica, registrations) = Replica::start(Some(recovered));
        assert_eq!(registrations.len(), 1);
        let restored = registrations.into_iter().next().expect("registration");
        assert_eq!(
            restored.restored.resume.map(|m| m.seq),
            Some(0),
            "resumes from the cut's position"
        );
        replica
            .register(restored.config, Some(restored.restored))
            .await;
        replica.applied(&mut publisher, 2).await;

        let on_peer = peer.contents().await;
        assert_eq!(on_peer.len(), 2);
        assert_eq!(replica.contents().await, on_peer);
    });
}
