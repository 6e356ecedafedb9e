//! Handlers for virtual memory management (`cuMemCreate` and friends).
//!
//! `cuMemCreate` counts `size` against the device in its location
//! properties; host and host-NUMA locations count against nothing. The
//! count lives with the handle, which may be retained or imported again in
//! this process (each adds a reference); the bytes go back when the last
//! reference is released. Handles imported from other processes are their
//! memory, not counted. Each mapping (`cuMemMap`) holds a reference too,
//! until `cuMemUnmap`: the driver frees the memory only when it is both
//! released and unmapped. Address reservations are passed through.

use std::ffi::{c_int, c_void};

use vramcap_core::page::DeviceSlot;

use super::on_success;
use crate::engine::Engine;
use crate::engine::accounting::records::Object;
use crate::engine::driver::Driver;
use crate::engine::handlers::alloc::checked;
use crate::ffi::*;
use crate::log::{log_at, log_once};

const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;

impl<D: Driver> Engine<D> {
    /// `cuMemCreate`.
    ///
    /// # Safety
    /// The driver function's contract (`prop` null or a valid
    /// `CUmemAllocationProp`).
    pub unsafe fn mem_create(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        _flags: u64,
    ) -> CUresult {
        if handle.is_null() || prop.is_null() || size == 0 {
            return real();
        }
        // SAFETY: the caller passes a valid CUmemAllocationProp, which
        // starts with the fields read here.
        let location = unsafe { (*prop).location };
        if location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
            return real(); // host memory: not the device cap's business
        }
        let device = location.id;
        if self.tiers.on()
            // SAFETY: `handle` is non-null; the caller's contract.
            && let Some(rc) = unsafe { self.tiered_create(&mut real, handle, size as u64, device) }
        {
            return rc;
        }
        let _inflight = self.inflight.enter();
        let (slot, _) = match self.reserve("cuMemCreate", device, size as u64) {
            Ok(x) => x,
            Err(rc) => {
                if self.settings.spill != vramcap_core::settings::Spill::Off && !self.tiers.on() {
                    log_once!(
                        Warn,
                        "cuMemCreate: VMM memory is not spilled by VRAMCAP_SPILL={} (it takes cudaMalloc memory only), so past the cap it is refused; VRAMCAP_SPILL=tiered spills it (PyTorch allocates this way with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
                        self.settings.spill.name()
                    );
                }
                return rc;
            }
        };
        if let Err(rc) = self.call_with_retry(device, size as u64, || checked(real())) {
            self.accounting.release_on(slot, device, size as u64);
            return rc;
        }
        DeviceSlot::add(&slot.allocs, 1);
        // SAFETY: the driver succeeded and wrote the handle.
        let h = unsafe { *handle };
        self.vmm.insert(
            h,
            Object {
                device: device as u16,
                bytes: size as u64,
                refs: 1,
                alias_of: 0,
                ctx: 0,
            },
        );
        log_at!(
            Debug,
            "cuMemCreate: {size} bytes on device {device}, handle {h:#x}"
        );
        CUDA_SUCCESS
    }

    /// Another reference to a handle the engine counts (a retain yields the
    /// same handle value).
    fn add_ref(&self, h: u64) {
        if let Some(mut o) = self.vmm.get_mut(&h) {
            o.refs += 1;
        }
    }

    /// Drops one reference to the allocation behind `handle`; gives its
    /// bytes back with the last one.
    fn drop_ref(&self, handle: u64) {
        let target = match self.vmm.get(&handle).map(|o| o.alias_of) {
            None => return,
            Some(0) => handle,
            Some(original) => {
                self.vmm.remove(&handle);
                original
            }
        };
        self.unref(target);
    }

    /// One reference less on a counted allocation (by its own handle).
    fn unref(&self, target: u64) {
        let gone = self.vmm.remove_if_mut(&target, |_, o| {
            o.refs = o.refs.saturating_sub(1);
            o.refs == 0
        });
        if let Some((_, o)) = gone {
            self.accounting.give_back(o.device, o.bytes);
        }
    }

    /// The counted allocation behind a handle (itself, or what it aliases).
    fn target_of(&self, handle: u64) -> Option<u64> {
        self.vmm
            .get(&handle)
            .map(|o| if o.alias_of == 0 { handle } else { o.alias_of })
    }

    /// `cuMemMap`: a mapping keeps the allocation's memory alive even after
    /// its last handle is released, so each holds a reference until
    /// `cuMemUnmap`.
    pub fn mem_map(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: u64,
    ) -> CUresult {
        if self.tiers.on()
            && let Some(rc) = self.tiered_map(ptr, size as u64, offset as u64, handle, flags)
        {
            return rc;
        }
        let rc = real();
        if rc == CUDA_SUCCESS
            && let Some(target) = self.target_of(handle)
        {
            self.add_ref(target);
            self.maps.insert(ptr, (target, size as u64));
        }
        rc
    }

    /// `cuMemUnmap`: drops the references of the mappings in the range.
    pub fn mem_unmap(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        ptr: CUdeviceptr,
        size: usize,
    ) -> CUresult {
        let end = ptr.saturating_add(size as u64);
        let detached = if self.tiers.on() {
            self.tiered_unmapping(ptr, end)
        } else {
            Vec::new()
        };
        let rc = real();
        if rc != CUDA_SUCCESS {
            for b in detached {
                self.tiers.reattach(b);
            }
            return rc;
        }
        let mut gone = Vec::new();
        self.maps.retain(|start, (target, _)| {
            let inside = (ptr..end).contains(start);
            if inside {
                gone.push((*start, *target));
            }
            !inside
        });
        for (start, target) in gone {
            if self.tiers.on() && self.handles.contains(target) {
                self.tiered_unmapped(target, start);
            } else {
                self.unref(target);
            }
        }
        rc
    }

    /// `cuMemRelease`.
    pub fn mem_release(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        handle: CUmemGenericAllocationHandle,
    ) -> CUresult {
        if self.tiers.on()
            && let Some(rc) = self.tiered_release(handle)
        {
            return rc;
        }
        on_success(real(), || self.drop_ref(handle))
    }

    /// `cuMemRetainAllocationHandle`.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_retain_allocation_handle(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        handle: *mut CUmemGenericAllocationHandle,
        addr: *mut c_void,
    ) -> CUresult {
        if self.tiers.on()
            && !handle.is_null()
            && let Some(h) = self.tiered_retain(addr as u64)
        {
            // SAFETY: checked non-null; the caller's contract.
            unsafe { *handle = h };
            return CUDA_SUCCESS;
        }
        if self.tiers.on() && self.tiers.contains(addr as u64) {
            // A tiered block is plain device memory to the program, which
            // the driver would refuse here; its memory also changes when
            // it moves, which a handle held elsewhere would not follow.
            return CUDA_ERROR_INVALID_VALUE;
        }
        let rc = real();
        if rc == CUDA_SUCCESS && !handle.is_null() {
            // SAFETY: written by the driver on success.
            self.add_ref(unsafe { *handle });
        }
        rc
    }

    /// `cuMemExportToShareableHandle`: remembers which handle a POSIX
    /// descriptor exports, so an import of it in this process is known to
    /// be the same allocation (`exports.rs`: by its open file, not its
    /// number, which another process's export may have by then).
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_export_to_shareable_handle(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        shareable: *mut c_void,
        handle: CUmemGenericAllocationHandle,
        kind: c_int,
        flags: u64,
    ) -> CUresult {
        let tiered = if self.tiers.on() {
            // SAFETY: the caller's contract.
            unsafe { self.tiered_export(shareable, handle, kind, flags) }
        } else {
            None
        };
        let rc = match tiered {
            Some(rc) => rc,
            None => real(),
        };
        if rc == CUDA_SUCCESS {
            self.park.note_export();
        }
        if rc == CUDA_SUCCESS
            && kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            && !shareable.is_null()
            && tiered.is_none()
            && self.vmm.contains_key(&handle)
        {
            // SAFETY: for this handle type the driver wrote an int.
            let fd = unsafe { *shareable.cast::<c_int>() };
            self.exports.add(fd, handle, |h| self.vmm.contains_key(&h));
        }
        rc
    }

    /// `cuMemImportFromShareableHandle`: an import of this process's own
    /// export refers to an allocation already counted, so the new handle
    /// becomes another reference to it. Imports of other processes'
    /// exports are their memory and are not counted.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_import_from_shareable_handle(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        handle: *mut CUmemGenericAllocationHandle,
        os_handle: *mut c_void,
        kind: c_int,
    ) -> CUresult {
        let rc = real();
        if rc != CUDA_SUCCESS || handle.is_null() {
            return rc;
        }
        // SAFETY: written by the driver on success.
        let h = unsafe { *handle };
        if self.tiers.on()
            && kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            // SAFETY: `handle` is non-null and the driver wrote it.
            && unsafe { self.tiered_import(handle, os_handle as usize as c_int) }
        {
            return rc;
        }
        if self.vmm.contains_key(&h) {
            self.add_ref(h);
        } else if kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            && let Some(original) = self.exports.of(os_handle as usize as c_int)
            && let Some(o) = self.vmm.get(&original).map(|o| *o)
        {
            self.add_ref(original);
            self.vmm.insert(
                h,
                Object {
                    refs: 0,
                    alias_of: original,
                    ..o
                },
            );
        }
        rc
    }
}
