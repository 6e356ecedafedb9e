//! Handlers for arrays and mipmapped arrays: reserved from the descriptor
//! (an upper bound), then settled to the size the driver reports
//! (`cuArrayGetMemoryRequirements`), released on destroy or with the
//! context that made them (`lifecycle`).

use std::ffi::{c_int, c_uint};

use vramcap_core::page::DeviceSlot;

use crate::engine::Engine;
use crate::engine::accounting::records::Object;
use crate::engine::driver::Driver;
use crate::ffi::*;
use crate::log::log_at;

/// Bytes per element of a `CUarray_format`; 16 (the widest) for formats
/// not listed, so the estimate stays an upper bound until settled.
fn format_bytes(format: c_int) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 16,
    }
}

/// An upper-bound estimate: rows padded to 512 bytes.
pub fn array_estimate(
    width: usize,
    height: usize,
    depth: usize,
    format: c_int,
    channels: c_uint,
) -> u64 {
    let row = (width as u64)
        .saturating_mul(format_bytes(format))
        .saturating_mul(u64::from(channels.max(1)))
        .checked_next_multiple_of(512)
        .unwrap_or(u64::MAX);
    row.saturating_mul(height.max(1) as u64)
        .saturating_mul(depth.max(1) as u64)
}

/// An array creation's descriptor.
#[derive(Clone, Copy)]
pub enum ArrayDesc<'a> {
    /// `cuArrayCreate_v2`.
    Flat(&'a CUDA_ARRAY_DESCRIPTOR),
    /// `cuArray3DCreate_v2`.
    Layered(&'a CUDA_ARRAY3D_DESCRIPTOR),
    /// `cuMipmappedArrayCreate`.
    Mipmapped(&'a CUDA_ARRAY3D_DESCRIPTOR),
}

impl<D: Driver> Engine<D> {
    /// `cuArrayCreate_v2`, `cuArray3DCreate_v2` and `cuMipmappedArrayCreate`
    /// of the descriptor `desc`: reserve its estimate, create, settle to the
    /// driver's reported size, record. `real` makes the real call and
    /// answers the handle it made (the boundary reads the caller's pointer,
    /// `boundary/allocs.rs`).
    pub fn array_create(
        &'static self,
        mut real: impl FnMut() -> Result<CUarray, CUresult>,
        desc: ArrayDesc<'_>,
    ) -> CUresult {
        let (what, mipmapped, estimate) = match desc {
            ArrayDesc::Flat(d) => (
                "cuArrayCreate",
                false,
                array_estimate(d.width, d.height, 1, d.format, d.channels),
            ),
            ArrayDesc::Layered(d) => (
                "cuArray3DCreate",
                false,
                array_estimate(d.width, d.height, d.depth, d.format, d.channels),
            ),
            // All levels together are less than twice the first one.
            ArrayDesc::Mipmapped(d) => (
                "cuMipmappedArrayCreate",
                true,
                array_estimate(d.width, d.height, d.depth, d.format, d.channels).saturating_mul(2),
            ),
        };
        let passed = |r: Result<CUarray, CUresult>| r.err().unwrap_or(CUDA_SUCCESS);
        if estimate == 0 {
            return passed(real());
        }
        let Some((ctx, device)) = self.accounting.current() else {
            return passed(real());
        };
        let _inflight = self.inflight.enter();
        let (slot, limit) = match self.reserve(what, device, estimate) {
            Ok(x) => x,
            Err(rc) => return rc,
        };
        let h = match self.call_with_retry(device, estimate, real) {
            Ok(a) => a as usize,
            Err(rc) => {
                self.accounting.release_on(slot, device, estimate);
                return rc;
            }
        };
        let bytes = self
            .driver
            .array_size(h, device, mipmapped)
            .ok()
            .filter(|&b| b > 0)
            .unwrap_or(estimate);
        if let Err(rc) = self
            .accounting
            .settle(what, device, slot, limit, estimate, bytes)
        {
            let _ = self.driver.array_destroy(h, mipmapped);
            return rc;
        }
        DeviceSlot::add(&slot.allocs, 1);
        self.arrays.insert(
            h as u64,
            Object {
                device: device as u16,
                bytes,
                refs: 1,
                alias_of: 0,
                ctx,
            },
        );
        log_at!(Debug, "{what}: {bytes} bytes on device {device}");
        CUDA_SUCCESS
    }

    /// `cuArrayDestroy` and `cuMipmappedArrayDestroy`: the record is taken
    /// out *before* the call (once the driver has destroyed it, another
    /// thread may be handed the same handle value and record it anew) and
    /// put back if the call fails.
    pub fn array_destroy(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        h: CUarray,
    ) -> CUresult {
        let record = self.arrays.remove(&(h as u64)).map(|(_, o)| o);
        let rc = real();
        match record {
            Some(o) if rc == CUDA_SUCCESS => self.accounting.give_back(o.device, o.bytes),
            Some(o) => {
                self.arrays.insert(h as u64, o);
            }
            None => {}
        }
        rc
    }
}
