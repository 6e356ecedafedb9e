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
        // SAFETY: the launch function's contract.
        unsafe {
            self.tiers
                .note_launch(self.driver, func as usize, params, extra)
        };
        let _open = self.tiers.enter();
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
    /// (the hook list's `gate` entries): passes the gate under tiered
    /// spill, whatever the call's arguments are.
    pub fn pass_gate(&'static self, mut real: impl FnMut() -> CUresult) -> CUresult {
        let _open = self.tiers.enter();
        real()
    }
}
