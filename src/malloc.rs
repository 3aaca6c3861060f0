//! glibc's allocator, capped at one arena per core.
//!
//! glibc gives threads their own malloc arenas, up to 8 per core. In a hookline process the
//! threads that allocate are many (tokio's workers, librdkafka's broker threads, the stage loops),
//! and memory freed in one thread's arena is not reused by another's: after a backlog drain,
//! librdkafka's emptied fetch queues stay resident in its threads' arenas while the delivery
//! path grows new memory in the workers'. Measured on the dispatcher after a 100k-record drain,
//! then 10,000 deliveries held in flight (docs/performance.md, "10k in flight"): 119 MiB before
//! and 249 MiB at the peak with glibc's default, 79 and 173 MiB with one arena per core, at the
//! same CPU per delivery.
//!
//! `MALLOC_ARENA_MAX` in the environment (glibc's own knob) wins: the cap is set only without it.

/// Caps the arenas before any thread starts (call first in `main`). A no-op off glibc.
pub(crate) fn cap_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return;
        }
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        let arenas = libc::c_int::try_from(cores.max(2)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only changes the allocator's tuning; it is called before any other
        // thread exists, and a refused value (it returns 0) leaves glibc's default in place.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}
