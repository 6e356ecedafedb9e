//! The launch family, handed out only under tiered spill: the launches
//! count uses for tiered spill's heat and pass its gate; copies, memsets
//! and the other `gate` entries of the hook list pass the gate only.

use std::ffi::c_void;

use crate::engine::Engine;
use crate::engine::driver::Driver;
use crate::ffi::*;

impl<D: Driver> Engine<D> {
    /// A launch of `func` with its `params` and `extra` (null for a
    /// cooperative launch), the hook list's `gate` entries of
    /// `cuLaunchKernel`, `cuLaunchKernelEx` and `cuLaunchCooperativeKernel`
    /// (and their `_ptsz`): counts uses for tiered spill, then makes the
    /// launch through the gate.
    ///
    /// # Safety
    /// The launch function's contract.
    pub unsafe fn launched(
        &'static self,
        func: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
        mut real: impl FnMut() -> CUresult,
    ) -> CUresult {
        if !self.tiers.placing() {
            return real();
        }
        // Under staging, the launch that begins a phase wakes the
        // background thread; staging ahead, it waits (briefly) for the
        // phase's moves to be remapped, so that it runs on them.
        if self.tiers.staging()
            && !func.is_null()
            && let Some(seq) = self.tiers.follow(func as u64)
        {
            self.tiers.wait_remapped(seq);
        }
        // The gate passed before the uses are noted: staging ahead, they
        // stamp the blocks with the epoch the launch is submitted in.
        let _open = self.tiers.enter();
        // SAFETY: the launch function's contract.
        unsafe {
            self.tiers
                .note_launch(self.driver, func as usize, params, extra)
        };
        real()
    }

    /// `cuModuleUnload`, `cuLibraryUnload`: the functions' handles may come
    /// back for other functions, so every parameter layout is asked again.
    pub fn code_unloaded(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        _handle: *mut c_void,
    ) -> CUresult {
        let rc = real();
        if self.tiers.on() {
            self.tiers.forget_layouts();
        }
        rc
    }

    /// A copy, memset, stream memory operation or parameterless launch
    /// whose writes are not decoded (the hook list's `gate` entries):
    /// passes the gate under tiered spill; under staging ahead it may
    /// have written any block.
    pub fn pass_gate(&'static self, mut real: impl FnMut() -> CUresult) -> CUresult {
        let _open = self.tiers.enter();
        self.tiers.wrote_unseen();
        real()
    }

    /// A copy or memset into `dst` (the first argument of most of the
    /// hook list's `gate` entries): passes the gate; under staging ahead
    /// the block at `dst`, if any, is written.
    pub fn wrote(&'static self, dst: CUdeviceptr, mut real: impl FnMut() -> CUresult) -> CUresult {
        let _open = self.tiers.enter();
        self.tiers.wrote(dst);
        real()
    }

    /// A copy of `n` bytes from the host at `src` into `dst`
    /// (`cuMemcpyHtoD*`): as [`Engine::wrote`]; under staging ahead, once
    /// the driver has taken the copy, the bytes copied are read for
    /// addresses of blocks (an array of pointers a kernel will write
    /// through), and such blocks are never staged ahead
    /// (`tiered/ahead.rs`).
    pub fn wrote_from_host(
        &'static self,
        dst: CUdeviceptr,
        src: *const c_void,
        n: usize,
        mut real: impl FnMut() -> CUresult,
    ) -> CUresult {
        let _open = self.tiers.enter();
        self.tiers.wrote(dst);
        let rc = real();
        if rc == CUDA_SUCCESS {
            self.tiers.note_pointers(src, n);
        }
        rc
    }

    /// A copy to the host or to an array, or a wait on a value: passes the
    /// gate; it writes no block.
    pub fn reads(&'static self, mut real: impl FnMut() -> CUresult) -> CUresult {
        let _open = self.tiers.enter();
        real()
    }
}
