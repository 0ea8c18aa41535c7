//! Black-box tests of carmy through its public surface: the router in-process
//! (`tower::ServiceExt::oneshot`) and over real loopback sockets. One binary, a module per topic.

mod auth;
mod bounds;
mod builder;
mod catalog;
mod config;
mod connections;
mod disconnect;
mod discovery;
mod embedding;
mod execute;
mod fuzz;
mod idempotency;
mod mcp;
mod mcp_clients;
mod memory_bound;
mod protection;
mod recording;
mod redis_persistence;
mod replicas;
mod requests;
mod routes;
mod schemas;
mod serde_inputs;
mod shutdown;
mod skips;
mod socket;
mod startup;
mod store_contract;
mod store_outage;
mod store_tls;
mod streaming;
mod testing_client;
mod tool_errors;
mod tools;
mod tracing_span;
