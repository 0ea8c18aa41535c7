//! Black-box tests of carmy through its public surface: the router in-process
//! (`tower::ServiceExt::oneshot`) and over real loopback sockets. One binary, a module per topic.

mod auth;
mod builder;
mod catalog;
mod disconnect;
mod discovery;
mod execute;
mod fuzz;
mod health;
mod idempotency;
mod mcp;
mod mcp_clients;
mod protection;
mod replicas;
mod routes;
mod schemas;
mod shutdown;
mod socket;
mod store_contract;
mod store_outage;
mod streaming;
mod testing_client;
mod tools;
mod tracing_span;
