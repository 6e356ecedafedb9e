//! The allocation family's handlers (plain, pitched and managed memory),
//! over the allocation pipeline every allocating family shares
//! (`engine/pipeline/`). Frees are `free.rs`; the memory queries
//! `queries.rs`.

use std::ffi::c_uint;

use crate::engine::Engine;
use crate::engine::driver::Driver;
use crate::engine::pipeline::{Made, Request};
use crate::ffi::*;

/// A driver call's answer as a `Result`.
pub(in crate::engine) fn checked(rc: CUresult) -> Result<(), CUresult> {
    match rc {
        CUDA_SUCCESS => Ok(()),
        rc => Err(rc),
    }
}

/// The pitch the driver picks is not known before the call: reserve for a
/// row rounded up to 512 bytes (what current drivers use), then settle to
/// the real `pitch × height`.
fn pitch_estimate(width: u64, height: u64) -> u64 {
    width
        .checked_next_multiple_of(512)
        .and_then(|w| w.checked_mul(height))
        .unwrap_or(u64::MAX)
}

impl<D: Driver> Engine<D> {
    /// `cuMemAlloc_v2` of `bytes`: `real` makes the real call and answers
    /// the address it made (the boundary reads and writes the caller's
    /// pointer, `boundary/allocs.rs`).
    pub fn mem_alloc(
        &'static self,
        real: impl FnMut() -> Result<Made, CUresult>,
        bytes: u64,
    ) -> Result<Made, CUresult> {
        let target = self.accounting.current();
        self.capped_alloc("cuMemAlloc", bytes, Request::Plain, target, real, |_| bytes)
    }

    /// `cuMemAllocPitch_v2`: reserved at [`pitch_estimate`], settled to the
    /// real `pitch × height`.
    pub fn mem_alloc_pitch(
        &'static self,
        real: impl FnMut() -> Result<Made, CUresult>,
        width: u64,
        height: u64,
        element_size: c_uint,
    ) -> Result<Made, CUresult> {
        let request = Request::Pitch {
            width,
            height,
            elem: element_size,
        };
        let target = self.accounting.current();
        self.capped_alloc(
            "cuMemAllocPitch",
            pitch_estimate(width, height),
            request,
            target,
            real,
            |made| made.pitch.saturating_mul(height),
        )
    }

    /// `cuMemAllocManaged`: counted against the current device's cap (it can
    /// occupy that device in full), never cached and never spilled: past the
    /// cap it is refused in every mode (docs/design/spill-modes.md).
    pub fn mem_alloc_managed(
        &'static self,
        real: impl FnMut() -> Result<Made, CUresult>,
        bytes: u64,
    ) -> Result<Made, CUresult> {
        let target = self.accounting.current();
        let request = Request::Managed;
        self.capped_alloc("cuMemAllocManaged", bytes, request, target, real, |_| bytes)
    }
}
