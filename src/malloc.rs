//! One jemalloc heap for the whole process: Rust's allocations and every C library's `malloc`
//! (librdkafka's above all; tikv-jemallocator's `unprefixed_malloc_on_supported_platforms`
//! exports jemalloc as `malloc`/`free`, so glibc's allocator is never used).
//!
//! Why: glibc's allocator was ~14% of the dispatcher's CPU (`malloc`/`free` and their arena
//! locks), and with one heap per allocator memory freed by librdkafka's threads after a drain
//! could not be reused by the delivery path. Measured in alternating pairs (docs/performance.md,
//! runs 10 and 17): the deduper ~5 µs and the dispatcher ~5 µs less CPU per record, the peak
//! with 10,000 deliveries in flight unchanged, the idle process after a drain a third of the
//! memory.
//!
//! It cannot run under libfaketime (`LD_PRELOAD`): the two deadlock at start, each initialising
//! through the other. The clock-jump fault test steps hookline's own clock helper instead
//! (`common/src/runtime/clock.rs`). jemalloc's knobs are read from `MALLOC_CONF`.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
