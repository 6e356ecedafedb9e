//! Tiered spill's hooks of the program's calls: the launches count uses
//! and pass the gate; copies, memsets and the other `gate` entries of the
//! hook list pass the gate only.

use std::ffi::{c_uint, c_void};

use crate::engine::Engine;
use crate::engine::driver::Driver;
use crate::ffi::*;

impl<D: Driver> Engine<D> {
    /// Counts uses for tiered spill, then makes the launch through the gate.
    ///
    /// # Safety
    /// The launch function's contract.
    unsafe fn launched(
        &'static self,
        func: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
        mut real: impl FnMut() -> CUresult,
    ) -> CUresult {
        if !self.tiers.on() {
            return real();
        }
        // SAFETY: the launch function's contract.
        unsafe {
            self.tiers
                .note_launch(self.base.driver(), func as usize, params, extra)
        };
        let _open = self.tiers.enter();
        real()
    }

    /// `cuLaunchKernel[_ptsz]`.
    ///
    /// # Safety
    /// The driver function's contract.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_kernel(
        &'static self,
        real: impl FnMut() -> CUresult,
        f: CUfunction,
        _gx: c_uint,
        _gy: c_uint,
        _gz: c_uint,
        _bx: c_uint,
        _by: c_uint,
        _bz: c_uint,
        _shared: c_uint,
        _stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult {
        // SAFETY: the driver function's contract.
        unsafe { self.launched(f, params, extra, real) }
    }

    /// `cuLaunchKernelEx[_ptsz]`.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn launch_kernel_ex(
        &'static self,
        real: impl FnMut() -> CUresult,
        _config: *const c_void,
        f: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult {
        // SAFETY: the driver function's contract.
        unsafe { self.launched(f, params, extra, real) }
    }

    /// `cuLaunchCooperativeKernel[_ptsz]`.
    ///
    /// # Safety
    /// The driver function's contract.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_cooperative(
        &'static self,
        real: impl FnMut() -> CUresult,
        f: CUfunction,
        _gx: c_uint,
        _gy: c_uint,
        _gz: c_uint,
        _bx: c_uint,
        _by: c_uint,
        _bz: c_uint,
        _shared: c_uint,
        _stream: CUstream,
        params: *mut *mut c_void,
    ) -> CUresult {
        // SAFETY: the driver function's contract.
        unsafe { self.launched(f, params, std::ptr::null_mut(), real) }
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
