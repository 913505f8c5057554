//! Integration tests against the real binary, real ZeroMQ sockets on 127.0.0.1 and the real gRPC
//! and HTTP servers. One test binary, so RocksDB is linked once.

mod support;

mod auth;
mod backpressure;
mod bootstrap;
mod bootstrap_retry;
mod bounded_requests;
mod caps;
mod connections;
mod convergence;
mod crash_points;
mod durability;
mod durable_state;
mod e2e_mixed;
mod e2e_query;
mod etcd_reset;
mod extras;
mod fixtures;
mod hostile;
mod http_api;
mod http_errors;
mod http_golden;
mod ingest;
mod liveness;
mod recorded;
mod replicas;
mod scenarios;
mod source_order;
mod storage_faults;
