//! The gate that moves close: the launch, copy and memset hooks hold it
//! shared across their driver call, a round's move exclusively
//! (`engine/mod.rs` has the lock order).

#[allow(unused_imports)]
use super::*;

/// The most bytes of a copy to the GPU staging ahead reads for pointers.
pub const POINTER_SCAN_BYTES: usize = 64 << 10;

/// How long a context's destroy waits for synchronisations a placement
/// round left running (`Tiers::no_round`): longer than the longest wait
/// of a round (8 s).
const QUIESCE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Tiers {
    /// Passes the gate: held for a gated driver call.
    pub fn enter(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        self.on.then(|| read!(self.gate))
    }

    /// Closes the gate, waiting at most [`STOP_WAIT`].
    pub(in crate::engine) fn stop(&self) -> Option<std::sync::RwLockWriteGuard<'_, ()>> {
        let until = std::time::Instant::now() + STOP_WAIT;
        loop {
            match self.gate.try_write() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// Under staging ahead, with the gate passed: work just submitted may
    /// write the block at `dst` (a copy or memset into it), so a copy of
    /// it made ahead since the last stop is stale (`ahead.rs`).
    pub fn wrote(&self, dst: u64) {
        if !self.ahead_on {
            return;
        }
        let (lo, hi) = self.span();
        if dst < lo || dst >= hi {
            return;
        }
        if let Some(b) = block_at(&read!(self.blocks), dst) {
            b.written
                .store(self.epoch.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Under staging ahead, with the gate passed and the copy made: the
    /// `n` bytes at `src` the program copied to the GPU are read (at most
    /// [`POINTER_SCAN_BYTES`]) for words that point into blocks, which are
    /// marked as reached through memory and stamped as written (a copy
    /// already staged ahead of one is made again). The bytes are read with
    /// `process_vm_readv`, which answers an error rather than a fault for
    /// memory the CPU cannot read (a device address under unified
    /// addressing); managed memory it may move to the host.
    pub fn note_pointers(&self, src: *const c_void, n: usize) {
        if !self.ahead_on || src.is_null() || n < 8 {
            return;
        }
        let (lo, hi) = self.span();
        if lo >= hi {
            return;
        }
        let mut buf = vec![0u8; n.min(POINTER_SCAN_BYTES)];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: src.cast_mut(),
            iov_len: buf.len(),
        };
        // SAFETY: one local buffer of its length; the remote range is only
        // read, by the kernel, which answers EFAULT where it is not mapped.
        let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if got < 8 {
            return;
        }
        let epoch = self.epoch.load(Ordering::Relaxed);
        let map = read!(self.blocks);
        for word in buf[..got as usize].chunks_exact(8) {
            let w = u64::from_ne_bytes(word.try_into().unwrap_or([0; 8]));
            if w >= lo
                && w < hi
                && let Some(b) = block_at(&map, w)
            {
                b.indirect.store(true, Ordering::Relaxed);
                b.written.store(epoch, Ordering::Relaxed);
            }
        }
    }

    /// Under staging ahead, with the gate passed: work just submitted may
    /// write any block (its writes are not decoded), so every copy made
    /// ahead since the last stop is stale.
    pub fn wrote_unseen(&self) {
        if self.ahead_on {
            self.unseen_at
                .store(self.epoch.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// A stop drained the GPU, the gate still closed: work submitted from
    /// now on is of a later epoch (`ahead.rs`), which a copy made ahead
    /// after this stop may not have seen. Only a drained stop raises it:
    /// work submitted before a stop that gave up may still run.
    pub(super) fn drained_stop(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
    }

    /// The epoch staging ahead stamps writes with now (`ahead.rs`); 0 when
    /// it is off (no stamps).
    pub(super) fn write_epoch(&self) -> u64 {
        if self.ahead_on {
            self.epoch.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    /// `Tiers::running` held shared, as a round holds it throughout (the
    /// lock order's first: the engine takes it before the cache's ordering
    /// lock, `Engine::tier_round`).
    pub(in crate::engine) fn round_running(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.running.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Under tiered spill, `Tiers::running` held exclusively: no placement
    /// round runs while it is held (a round holds it shared throughout),
    /// so none is pushing, synchronising or copying on a context the
    /// program is destroying; and no thread a round left synchronising
    /// contexts (it gave up waiting for the GPU) is still in the driver.
    /// Such a thread ends when the GPU's work does, which the driver's
    /// destroy waits for too; after [`QUIESCE_WAIT`] the destroy goes ahead
    /// anyway, with a line in the log, rather than hang on work that waits
    /// for something the program will not do, and later ones no longer
    /// wait for such threads.
    pub(in crate::engine) fn no_round(&self) -> Option<std::sync::RwLockWriteGuard<'_, ()>> {
        if !self.on() {
            return None;
        }
        let only = self.running.write().unwrap_or_else(|e| e.into_inner());
        let start = std::time::Instant::now();
        while self.quiescing.load(Ordering::SeqCst) > 0
            && !self.quiesce_abandoned.load(Ordering::SeqCst)
        {
            if start.elapsed() > QUIESCE_WAIT {
                self.quiesce_abandoned.store(true, Ordering::SeqCst);
                log_once!(
                    Warn,
                    "tiered spill: a context is destroyed while a synchronisation a move started has not returned after {QUIESCE_WAIT:?}; going ahead"
                );
                break;
            }
            std::thread::yield_now();
        }
        Some(only)
    }
}
