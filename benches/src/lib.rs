//! Benchmarks of carmy; see `BENCHMARKS.md`. The binaries are the servers and measurements that
//! `benches/run.py` drives; `benches/micro.rs` holds the in-process micro-benchmarks.
