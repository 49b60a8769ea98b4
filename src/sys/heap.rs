//! The process's heap: memory the C allocator holds after the driver
//! freed it.
//!
//! glibc's malloc gives each thread that allocates an arena of its own (up
//! to 8 per CPU), and hands freed memory back to the kernel only from the
//! top of an arena, past a threshold that grows with the largest block
//! freed. Freed blocks below a live one stay resident. Under tokio's
//! runtime, a refresh of the cached `lvs` report (its text, its rows) runs
//! on whichever worker or blocking thread is free, so each refresh can
//! leave a few MiB resident in another arena: that is how an idle driver's
//! RSS stepped up at every refresh. [`release_free_memory`] is
//! `malloc_trim(0)`: every arena, every free page, back to the kernel.

/// Gives every page glibc's malloc holds free, in every arena, back to
/// the kernel (`malloc_trim(0)`: the top of each heap is cut and the free
/// pages inside it are `MADV_DONTNEED`ed). Whether any memory went back.
/// It locks each arena in turn while it walks the arena's free lists (a
/// few hundred microseconds for a heap of some MiB), and memory malloc
/// takes again later is faulted in anew; so it is called after a large
/// transient allocation, not after every call. Where the C library is not
/// glibc it does nothing (musl's allocator returns freed memory itself).
///
/// Logged at `debug`: it changes nothing anybody else sees.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let started = std::time::Instant::now();
        // SAFETY: malloc_trim takes no pointer and may be called from any
        // thread at any time; it takes each arena's own lock.
        let released = unsafe { libc::malloc_trim(0) } == 1;
        tracing::debug!(released, elapsed = ?started.elapsed(), "malloc_trim(0)");
        released
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap()
    }

    /// Memory freed below a live block stays resident until the trim, which
    /// gives it back. Done on a thread of its own, whose arena holds only
    /// this test's blocks.
    #[test]
    fn freed_memory_below_a_live_block_goes_back_to_the_kernel() {
        std::thread::spawn(|| {
            // 48 MiB in 32 KiB blocks (below malloc's mmap threshold, so
            // in the arena), each written, then all freed but the last.
            let mut blocks: Vec<Vec<u8>> = (0..48 * 32).map(|_| vec![1u8; 32 << 10]).collect();
            let last = blocks.pop().unwrap();
            drop(blocks);
            let before = rss_kib();
            assert!(release_free_memory(), "nothing went back");
            let after = rss_kib();
            drop(last);
            assert!(
                before.saturating_sub(after) >= 24 << 10,
                "RSS {before} KiB before the trim, {after} KiB after"
            );
        })
        .join()
        .unwrap();
    }
}
