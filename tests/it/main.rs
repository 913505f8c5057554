//! Integration tests against the real binary, real ZeroMQ sockets on 127.0.0.1 and the real gRPC
//! and HTTP servers. One test binary, so RocksDB is linked once.

mod support;

mod auth;
mod backpressure;
mod bootstrap;
mod bootstrap_deadline;
mod bootstrap_empty;
mod bootstrap_retry;
mod bounded_requests;
mod budget;
mod caps;
mod chain_tuning;
mod connections;
mod convergence;
mod crash_points;
mod durability;
mod durable_state;
mod e2e_mixed;
mod e2e_query;
mod engines;
mod etcd_reset;
mod extras;
mod fixtures;
mod holder_records;
mod hostile;
mod http_api;
mod http_errors;
mod http_golden;
mod hybrid;
mod ingest;
mod liveness;
mod play_hostile;
mod recorded;
mod replicas;
mod scenarios;
mod snapshot_export;
mod source_order;
mod storage_faults;
mod tls;
mod trace_replay;
