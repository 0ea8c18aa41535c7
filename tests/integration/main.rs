//! Black-box tests of carmy through its public surface: the router in-process
//! (`tower::ServiceExt::oneshot`) and over real loopback sockets. One binary, a module per topic.

mod builder;
mod catalog;
mod discovery;
mod routes;
mod schemas;
mod socket;
