//! The tonic service: translate protobuf messages to the operation layer and back. Failures of an
//! operation are answers (`ret` + `error`), not gRPC errors; gRPC status codes are left to real
//! transport problems. So is a missing service token: `ret` UNAUTHORIZED, checked from the
//! `authorization` metadata before anything else.

use tonic::{Request, Response, Status};

use crate::error::{Code, OpError};
use crate::gateway::answer_status::InstanceAnswerStatus;
use crate::gateway::auth::Access;
use crate::gateway::engines_api::EngineRequest;
use crate::gateway::grpc_wire::{QueryByHashRequestIn, QueryReply, QueryRequestIn, error_detail};
use crate::gateway::ops::{Ops, QueryByHashInput, QueryContext, QueryInput};
use crate::gateway::pb;
use crate::gateway::registration::{PYTHON_NAMES, RegistrationInput};
use crate::hashing::HashProfile;
use crate::metrics::Transport;

pub struct GrpcService {
    ops: Ops,
}

impl GrpcService {
    pub fn new(ops: Ops) -> Self {
        GrpcService { ops }
    }

    fn authorize<T>(&self, access: Access, request: &Request<T>) -> Result<(), OpError> {
        let value = request.metadata().get("authorization");
        self.ops.authorize(access, value.map(|v| v.as_bytes()))
    }
}

/// A query's reply from the walk's answer, with the engines' loads when asked (`include_load`)
/// and how sure the answer is (`include_status`, computed before the query).
fn reply_with<'a>(
    ops: &'a Ops,
    tenant_id: &'a str,
    include_load: bool,
    status: Option<std::collections::BTreeMap<String, InstanceAnswerStatus>>,
) -> impl FnOnce(crate::index::AnswerView<'_>) -> QueryReply + 'a {
    move |a| {
        let mut reply = QueryReply::answer(a);
        if include_load {
            reply = reply.with_loads(&ops.loads_of(tenant_id, a));
        }
        if let Some(status) = &status {
            reply = reply.with_status(status);
        }
        reply
    }
}

/// How sure the answer is, when the query asks (`include_status`).
async fn status_if(
    ops: &Ops,
    asked: bool,
    q: QueryContext<'_>,
) -> Result<Option<std::collections::BTreeMap<String, InstanceAnswerStatus>>, OpError> {
    match asked {
        false => Ok(None),
        true => ops.answer_status(q).await.map(Some),
    }
}

/// A request's `hash_profile` map as sorted pairs; `None` when the caller sent none.
fn profile_pairs(
    sent: bool,
    map: std::collections::HashMap<String, String>,
) -> Option<Vec<(String, String)>> {
    sent.then(|| {
        let mut pairs: Vec<(String, String)> = map.into_iter().collect();
        pairs.sort();
        pairs
    })
}

fn ret_of<T>(result: &Result<T, OpError>) -> (i32, Option<pb::ErrorDetail>) {
    match result {
        Ok(_) => (Code::Ok.value(), None),
        Err(e) => (e.code.value(), Some(error_detail(e))),
    }
}

pub fn profile_pb(p: &HashProfile) -> pb::HashProfile {
    pb::HashProfile {
        strategy: p.strategy().as_str().to_owned(),
        algorithm: p.algorithm().as_str().to_owned(),
        python_hash_seed: p.python_hash_seed().to_owned(),
        root_digest: p.root_digest_hex(),
        index_projection: p.index_projection().as_str().to_owned(),
    }
}

#[tonic::async_trait]
impl crate::gateway::pb_server::conductor_server::Conductor for GrpcService {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        if let Err(e) = self.authorize(Access::Write, &request) {
            let (ret, error) = ret_of::<()>(&Err(e));
            return Ok(Response::new(pb::RegisterResponse { ret, error }));
        }
        let r = request.into_inner();
        let input = RegistrationInput {
            instance_id: r.instance_id,
            endpoint: r.endpoint,
            replay_endpoint: r.replay_endpoint,
            publisher_type: r.publisher_type,
            model_name: r.model_name,
            lora_name: r.lora_name,
            tenant_id: r.tenant_id,
            block_size: r.block_size.map(i128::from),
            dp_rank: r.dp_rank.map(i128::from),
            cache_group: r.cache_group.map(i128::from),
            hybrid_parts: r.hybrid_parts,
            hash_profile: profile_pairs(r.has_hash_profile, r.hash_profile),
        };
        let result = self.ops.register(input, PYTHON_NAMES).await;
        let (ret, error) = ret_of(&result);
        Ok(Response::new(pb::RegisterResponse { ret, error }))
    }

    async fn register_engine(
        &self,
        request: Request<pb::RegisterEngineRequest>,
    ) -> Result<Response<pb::RegisterEngineResponse>, Status> {
        if let Err(e) = self.authorize(Access::Write, &request) {
            let (ret, error) = ret_of::<()>(&Err(e));
            return Ok(Response::new(pb::RegisterEngineResponse {
                ret,
                error,
                ..Default::default()
            }));
        }
        let r = request.into_inner();
        let input = EngineRequest {
            url: r.url,
            engine_type: r.publisher_type,
            instance_id: r.instance_id,
            tenant_id: r.tenant_id,
            model_name: r.model_name,
            block_size: r.block_size.map(i128::from),
            hash_profile: profile_pairs(r.has_hash_profile, r.hash_profile),
            hybrid_parts: r.hybrid_parts,
        };
        let result = match self.ops.engines() {
            Ok(engines) => engines.register(input).await,
            Err(e) => Err(e),
        };
        let (ret, error) = ret_of(&result);
        let mut response = pb::RegisterEngineResponse {
            ret,
            error,
            ..Default::default()
        };
        if let Ok(reply) = result {
            response.instance_id = reply.instance_id;
            response.model_name = reply.model_name;
            response.ranks = (reply.ranks.into_iter())
                .map(|r| pb::EngineRank {
                    dp_rank: i64::from(r.dp_rank),
                    endpoint: r.endpoint,
                    replay_endpoint: r.replay_endpoint,
                    topic: r.topic,
                    block_size: i64::from(r.block_size),
                })
                .collect();
        }
        Ok(Response::new(response))
    }

    async fn unregister_engine(
        &self,
        request: Request<pb::UnregisterEngineRequest>,
    ) -> Result<Response<pb::UnregisterEngineResponse>, Status> {
        if let Err(e) = self.authorize(Access::Write, &request) {
            let (ret, error) = ret_of::<()>(&Err(e));
            return Ok(Response::new(pb::UnregisterEngineResponse {
                ret,
                error,
                ranks_removed: 0,
            }));
        }
        let r = request.into_inner();
        let result = match self.ops.engines() {
            Ok(engines) => engines.unregister(r.instance_id, r.tenant_id).await,
            Err(e) => Err(e),
        };
        let (ret, error) = ret_of(&result);
        let ranks_removed = result.map_or(0, |n| n as i64);
        Ok(Response::new(pb::UnregisterEngineResponse {
            ret,
            error,
            ranks_removed,
        }))
    }

    async fn unregister(
        &self,
        request: Request<pb::UnregisterRequest>,
    ) -> Result<Response<pb::UnregisterResponse>, Status> {
        if let Err(e) = self.authorize(Access::Write, &request) {
            let (ret, error) = ret_of::<()>(&Err(e));
            return Ok(Response::new(pb::UnregisterResponse { ret, error }));
        }
        let r = request.into_inner();
        let result = self
            .ops
            .unregister(&r.instance_id, &r.tenant_id, i128::from(r.dp_rank))
            .await;
        let (ret, error) = ret_of(&result);
        Ok(Response::new(pb::UnregisterResponse { ret, error }))
    }

    async fn query(
        &self,
        request: Request<QueryRequestIn>,
    ) -> Result<Response<QueryReply>, Status> {
        if let Err(e) = self.authorize(Access::Read, &request) {
            return Ok(Response::new(QueryReply::error(&e)));
        }
        let r = request.into_inner().0;
        let input = QueryInput {
            model_name: r.model_name,
            lora_name: r.lora_name,
            block_size: i128::from(r.block_size),
            tenant_id: r.tenant_id,
            token_ids: r.token_ids,
            cache_salt: r.cache_salt,
            instance_filter: r.instance_filter,
        };
        let status = match status_if(&self.ops, r.include_status, input.context()).await {
            Ok(status) => status,
            Err(e) => return Ok(Response::new(QueryReply::error(&e))),
        };
        let answer = reply_with(&self.ops, &input.tenant_id, r.include_load, status);
        let reply = self.ops.query_with(&input, Transport::Grpc, answer);
        Ok(Response::new(QueryReply::of(reply)))
    }

    async fn query_by_hash(
        &self,
        request: Request<QueryByHashRequestIn>,
    ) -> Result<Response<QueryReply>, Status> {
        if let Err(e) = self.authorize(Access::Read, &request) {
            return Ok(Response::new(QueryReply::error(&e)));
        }
        let r = request.into_inner().0;
        let input = QueryByHashInput {
            model_name: r.model_name,
            lora_name: r.lora_name,
            block_size: i128::from(r.block_size),
            tenant_id: r.tenant_id,
            block_hashes: r.block_hashes,
            instance_filter: r.instance_filter,
        };
        let status = match status_if(&self.ops, r.include_status, input.context()).await {
            Ok(status) => status,
            Err(e) => return Ok(Response::new(QueryReply::error(&e))),
        };
        let answer = reply_with(&self.ops, &input.tenant_id, r.include_load, status);
        let reply = (self.ops).query_by_hash_with(&input, Transport::Grpc, answer);
        Ok(Response::new(QueryReply::of(reply)))
    }

    async fn get_global_view(
        &self,
        request: Request<pb::GetGlobalViewRequest>,
    ) -> Result<Response<pb::GetGlobalViewResponse>, Status> {
        if let Err(e) = self.authorize(Access::Read, &request) {
            let (ret, error) = ret_of::<()>(&Err(e));
            return Ok(Response::new(pb::GetGlobalViewResponse {
                ret,
                error,
                ..Default::default()
            }));
        }
        let contexts: Vec<pb::ContextView> = self
            .ops
            .global_view()
            .into_iter()
            .map(|v| pb::ContextView {
                model_name: v.key.model_name,
                lora_name: v.key.lora_name,
                block_size: i64::from(v.key.block_size),
                tenant_id: v.key.tenant_id,
                prefix_count: v.prefix_count,
                hash_profile: Some(profile_pb(&v.profile)),
                instances: v
                    .instances
                    .into_iter()
                    .map(|(id, ranks)| {
                        (
                            id,
                            pb::RankSet {
                                ranks: ranks.into_iter().collect(),
                            },
                        )
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(pb::GetGlobalViewResponse {
            ret: Code::Ok.value(),
            error: None,
            context_count: contexts.len() as u64,
            contexts,
        }))
    }

    async fn list_services(
        &self,
        request: Request<pb::ListServicesRequest>,
    ) -> Result<Response<pb::ListServicesResponse>, Status> {
        let result = match self.authorize(Access::Read, &request) {
            Ok(()) => self.ops.list_services().await,
            Err(e) => Err(e),
        };
        let (ret, error) = ret_of(&result);
        let services: Vec<pb::ServiceEntry> = result
            .unwrap_or_default()
            .into_iter()
            .map(|s| {
                let c = &s.config;
                pb::ServiceEntry {
                    endpoint: c.endpoint.clone(),
                    replay_endpoint: c.replay_endpoint.clone(),
                    publisher_type: c.publisher_type.as_str().to_owned(),
                    model_name: c.model_name.clone(),
                    lora_name: c.lora_name.clone(),
                    tenant_id: c.tenant_id.clone(),
                    instance_id: c.instance_id.clone(),
                    block_size: i64::from(c.block_size),
                    dp_rank: i64::from(c.dp_rank),
                    cache_group: c.cache_group.map(i64::from),
                    hash_profile: Some(profile_pb(&c.hash_profile)),
                }
            })
            .collect();
        Ok(Response::new(pb::ListServicesResponse {
            ret,
            error,
            count: services.len() as u64,
            services,
        }))
    }

    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        let reason = self.ops.not_ready_reason();
        let ready = reason.is_none();
        Ok(Response::new(pb::HealthResponse {
            ret: if ready {
                Code::Ok.value()
            } else {
                Code::ConductorUnavailable.value()
            },
            ready,
            status: match (reason, self.ops.degraded_reason()) {
                (Some(r), _) => format!("starting: {r}"),
                (None, Some(d)) => format!("degraded: {d}"),
                (None, None) => "ready".to_owned(),
            },
        }))
    }
}
