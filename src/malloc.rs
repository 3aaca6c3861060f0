//! The process's allocator: jemalloc, for Rust and for librdkafka alike.
//!
//! `tikv-jemallocator` with `unprefixed_malloc_on_supported_platforms` defines `malloc`, `free`
//! and the rest in the binary, so librdkafka's C code (linked statically) allocates from the same
//! heap as the Rust code. One heap matters: librdkafka's broker threads free their fetch buffers
//! after a backlog drain while the delivery path grows new memory in tokio's workers, and with two
//! allocators (or glibc's per-thread arenas) neither can reuse the other's freed pages.
//!
//! Measured in alternating A/B bench runs (docs/performance.md, run 10), glibc with its arenas
//! capped at one per core (this module's previous content) against jemalloc for the whole
//! process, 100k-record drain then 10k deliveries held in flight:
//! - CPU per record at the drain: deduper 19.1–20.1 → 13.6–14.8 µs, dispatcher 35.9–36.7 →
//!   30.4–32.0 µs; at 50% and 90% of the rate within noise;
//! - dispatcher RSS before the in-flight run 115–116 → 40–41 MiB, at its peak 171–198 →
//!   173–175 MiB.
//!
//! A Rust-only allocator (mimalloc, or jemalloc prefixed) saved the same CPU but held ~90 MiB
//! more at the in-flight peak (259–278 MiB): librdkafka's freed memory stayed in glibc's heap.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
