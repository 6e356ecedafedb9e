//! The VMM family under tiered spill: the program's own `cuMemCreate`
//! memory, answered with the engine's handles so that the memory behind one
//! can move (how and why: `engine/tiered/handles.rs`, whose `Handles` keeps
//! them). Plain VMM is `vmm.rs`, which hands these calls here in this mode.

use std::ffi::{c_int, c_void};

use crate::engine::Engine;
use crate::engine::accounting::exports::{keep, same_file};
use crate::engine::driver::Driver;
use crate::engine::handlers::alloc::checked;
use crate::engine::tiered::handles::Handle;
use crate::engine::tiered::{Place, TierBlock, location};
use crate::ffi::*;
use crate::log::{log_at, log_once};

const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;

impl<D: Driver> Engine<D> {
    /// `cuMemCreate` of device memory under tiered spill (module docs).
    /// `None`: not tiered (the device has no VMM), for the ordinary path.
    ///
    /// # Safety
    /// `handle` is non-null and writable.
    pub(in crate::engine) unsafe fn tiered_create(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        handle: *mut CUmemGenericAllocationHandle,
        size: u64,
        device: CUdevice,
    ) -> Option<CUresult> {
        let g = self.tiers.granularity(self.driver, device)?;
        if !size.is_multiple_of(g) {
            return Some(CUDA_ERROR_INVALID_VALUE); // as the driver answers
        }
        let _inflight = self.inflight.enter();
        let place = match self.tier_reserve("cuMemCreate", device, size) {
            Ok(place) => place,
            Err(rc) => return Some(rc),
        };
        let real_handle = if place == Place::Device {
            if let Err(rc) = self.call_with_retry(device, size, || checked(real())) {
                self.tiering().unreserve(device, size, Place::Device);
                return Some(rc);
            }
            // SAFETY: the driver succeeded and wrote the handle.
            unsafe { *handle }
        } else {
            match self.driver.vmm_create(size, location(Place::Host, device)) {
                Ok(h) => h,
                Err(_) => {
                    self.tiering().unreserve(device, size, Place::Host);
                    return Some(CUDA_ERROR_OUT_OF_MEMORY);
                }
            }
        };
        self.tiering()
            .count_made("cuMemCreate", device, size, place);
        let cell = Box::new(0u64);
        let value = std::ptr::from_ref::<u64>(&cell) as u64;
        self.handles.lock().insert(
            value,
            Handle {
                _cell: cell,
                device: device as u16,
                bytes: size,
                real: real_handle,
                place,
                refs: 1,
                maps: 0,
                block: None,
                pinned: false,
                exported: Vec::new(),
            },
        );
        // SAFETY: the caller's contract.
        unsafe { *handle = value };
        log_at!(
            Debug,
            "cuMemCreate: {size} bytes on device {device}, handle {value:#x}, on the {}",
            place.name()
        );
        Some(CUDA_SUCCESS)
    }

    /// Calls `f` with the physical handle behind program handle `h` and
    /// whether it is device memory, with its block (if it has one) pinned
    /// first when `pin`, else held still for the call. `None` when `h` is
    /// not the program's; the driver's answer for a released handle when
    /// it was released.
    fn with_physical(
        &self,
        h: u64,
        pin: bool,
        f: impl FnOnce(u64, Place) -> CUresult,
    ) -> Option<CUresult> {
        let live = self.handles.with_live(h, |x| {
            x.pinned |= pin;
            (x.block.clone(), x.real, x.place)
        })?;
        let (block, real, place) = match live {
            Ok(x) => x,
            Err(rc) => return Some(rc),
        };
        let Some(b) = block else {
            return Some(f(real, place));
        };
        if pin {
            b.pin();
            return Some(f(b.handle(), b.place()));
        }
        match b.hold() {
            Some(held) => Some(f(held.handle(), held.place())),
            // Being unmapped or freed: no move can start, so its memory is
            // final (and the handle's own while `refs` holds it).
            None => Some(f(b.handle(), b.place())),
        }
    }

    /// `cuMemMap` of a program handle: `None` when `h` is not one.
    pub(in crate::engine) fn tiered_map(
        &'static self,
        ptr: CUdeviceptr,
        size: u64,
        offset: u64,
        h: u64,
        flags: u64,
    ) -> Option<CUresult> {
        let live = self.handles.with_live(h, |x| {
            let whole = offset == 0 && size == x.bytes && x.maps == 0 && !x.pinned;
            x.maps += 1;
            (whole, x.device, x.bytes)
        })?;
        let (whole, device, bytes) = match live {
            Ok(x) => x,
            Err(rc) => return Some(rc),
        };
        let ctx = match self.driver.ctx_get_current() {
            Ok(c) if whole && c != 0 => Some(c),
            _ => None,
        };
        let mut mapped = (0, Place::Device);
        let rc = self
            .with_physical(h, ctx.is_none(), |real, place| {
                mapped = (real, place);
                self.driver.vmm_map_as(ptr, size, offset, real, flags)
            })
            .unwrap_or(CUDA_ERROR_INVALID_VALUE);
        if rc != CUDA_SUCCESS {
            self.unmapped_one(h);
            return Some(rc);
        }
        self.maps.insert(ptr, (h, size));
        if let Some(ctx) = ctx {
            let (real, place) = mapped;
            let b = self.tiers.insert(
                TierBlock::new(ptr, bytes, device, ctx, real, place, self.tiers.round_now())
                    .of_program(h),
            );
            // Another thread may have exported or mapped the handle again
            // since: it used the memory mapped here, which must stay.
            let pinned = {
                let mut m = self.handles.lock();
                m.get_mut(&h).is_none_or(|x| {
                    x.block = Some(b.clone());
                    x.pinned
                })
            };
            if pinned {
                b.pin();
            }
        }
        Some(CUDA_SUCCESS)
    }

    /// Before the program's `cuMemUnmap` of `[ptr, end)`: detaches the
    /// blocks of its handles mapped there, so no move touches them.
    pub(in crate::engine) fn tiered_unmapping(
        &self,
        ptr: u64,
        end: u64,
    ) -> Vec<std::sync::Arc<TierBlock>> {
        self.tiers
            .blocks_within(ptr, end)
            .into_iter()
            .filter(|b| b.program_handle != 0)
            .filter_map(|b| self.tiers.detach(b.ptr))
            .collect()
    }

    /// After the program's `cuMemUnmap`: the mapping at `start` of handle
    /// `h` is gone. When it was the handle's block, the block's memory
    /// (final once no move can start: [`TierBlock::stop`]) is the
    /// handle's again.
    pub(in crate::engine) fn tiered_unmapped(&self, h: u64, start: u64) {
        let block = self
            .handles
            .lock()
            .get(&h)
            .and_then(|x| x.block.clone())
            .filter(|b| b.ptr == start);
        if let Some(b) = block {
            b.stop();
            self.unblocked(h, &b, false);
        }
        self.unmapped_one(h);
    }

    /// Block `b` of handle `h` no longer moves: the handle holds its
    /// memory itself again (pinned, when `pin`, as it stays mapped).
    fn unblocked(&self, h: u64, b: &std::sync::Arc<TierBlock>, pin: bool) {
        let mut m = self.handles.lock();
        if let Some(x) = m.get_mut(&h)
            && x.block
                .as_ref()
                .is_some_and(|k| std::sync::Arc::ptr_eq(k, b))
        {
            x.real = b.handle();
            x.place = b.place();
            x.block = None;
            x.pinned |= pin;
        }
    }

    /// One mapping of handle `h` fewer (unmapped, or a map that failed).
    fn unmapped_one(&self, h: u64) {
        let _ = self.change_handle(h, |x| {
            x.maps = x.maps.saturating_sub(1);
            CUDA_SUCCESS
        });
    }

    /// Applies `change` to handle `h`, then lets the handle go if nothing
    /// references or maps it: `None` when `h` is not one, else what
    /// `change` answered.
    fn change_handle(
        &self,
        h: u64,
        change: impl FnOnce(&mut Handle) -> CUresult,
    ) -> Option<CUresult> {
        let (rc, gone) = {
            let mut m = self.handles.lock();
            let x = m.get_mut(&h)?;
            let rc = change(x);
            let gone = if x.refs == 0 && x.maps == 0 {
                m.remove(&h)
            } else {
                None
            };
            (rc, gone)
        };
        if let Some(x) = gone {
            self.handle_gone(&x);
        }
        Some(rc)
    }

    /// A handle released and unmapped everywhere: its memory and bytes go.
    fn handle_gone(&self, x: &Handle) {
        let _ = self.driver.vmm_release(x.real);
        self.tiering().give_back_bytes(x.device, x.bytes, x.place);
    }

    /// `cuMemRelease` of a program handle: `None` when `h` is not one.
    pub(in crate::engine) fn tiered_release(&self, h: u64) -> Option<CUresult> {
        self.change_handle(h, |x| {
            if x.refs == 0 {
                return CUDA_ERROR_INVALID_VALUE; // released already
            }
            x.refs -= 1;
            CUDA_SUCCESS
        })
    }

    /// `cuMemRetainAllocationHandle` of an address a program handle is
    /// mapped at: that handle, with one more reference. `None` otherwise.
    pub(in crate::engine) fn tiered_retain(&self, addr: u64) -> Option<u64> {
        let h = self
            .maps
            .iter()
            .find(|e| (*e.key()..e.key().saturating_add(e.value().1)).contains(&addr))
            .map(|e| e.value().0)?;
        // Released but still mapped counts too: the driver's handles do.
        self.handles.lock().get_mut(&h)?.refs += 1;
        Some(h)
    }

    /// `cuMemExportToShareableHandle` of a program handle: pins it (an
    /// importer maps the memory exported, which a move would leave
    /// behind). `None` when `h` is not one.
    ///
    /// # Safety
    /// `shareable` as the driver function requires for `kind`.
    pub(in crate::engine) unsafe fn tiered_export(
        &self,
        shareable: *mut c_void,
        h: u64,
        kind: c_int,
        flags: u64,
    ) -> Option<CUresult> {
        let rc = self.with_physical(h, true, |real, _| {
            // SAFETY: the caller's contract.
            unsafe { self.driver.vmm_export(shareable, real, kind, flags) }
        })?;
        if rc != CUDA_SUCCESS {
            log_once!(
                Warn,
                "cuMemExportToShareableHandle: memory that tiered spill (VRAMCAP_SPILL=tiered) placed in host memory past the cap, or moved, is made without the handle types the program asked for, so the driver will not export it ({rc}); leave tiered spill off for programs that share GPU memory between processes"
            );
        } else if kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && !shareable.is_null() {
            // SAFETY: for this handle type the driver wrote an int.
            let fd = unsafe { *shareable.cast::<c_int>() };
            if let Some(kept) = keep(fd)
                && let Some(x) = self.handles.lock().get_mut(&h)
            {
                x.exported.push(kept);
            }
        }
        Some(rc)
    }

    /// An import of a descriptor open on the file description this process
    /// exported a program handle as (the descriptor itself, a copy of it,
    /// or one that went to another process and came back): the driver's
    /// new handle is given back, and the program gets its own handle with
    /// one more reference. False otherwise, and when the kernel cannot
    /// compare descriptors (`kcmp`): the driver's handle is the program's
    /// then, naming the same memory, which the export pinned.
    ///
    /// # Safety
    /// `handle` is non-null and writable.
    pub(in crate::engine) unsafe fn tiered_import(
        &self,
        handle: *mut CUmemGenericAllocationHandle,
        fd: c_int,
    ) -> bool {
        let original = {
            let mut m = self.handles.lock();
            let Some((&h, x)) = m.iter_mut().find(|(_, x)| {
                (x.refs > 0 || x.maps > 0)
                    && x.exported.iter().any(|k| same_file(fd, k) == Some(true))
            }) else {
                return false;
            };
            x.refs += 1;
            h
        };
        // SAFETY: the caller's contract; the driver wrote its handle there.
        let fresh = unsafe { std::mem::replace(&mut *handle, original) };
        let _ = self.driver.vmm_release(fresh);
        log_at!(
            Debug,
            "cuMemImportFromShareableHandle: descriptor {fd} is this process's export of handle {original:#x}, which it answers"
        );
        true
    }

    /// `cuMemGetAllocationPropertiesFromHandle`.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_get_allocation_properties_from_handle(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        prop: *mut CUmemAllocationPropFull,
        h: CUmemGenericAllocationHandle,
    ) -> CUresult {
        if !self.tiers.on() {
            return real();
        }
        let Some(device) = self.handles.lock().get(&h).map(|x| x.device) else {
            return real();
        };
        let rc = self
            .with_physical(h, false, |physical, _| {
                // SAFETY: the caller's contract.
                unsafe { self.driver.vmm_properties(prop, physical) }
            })
            .unwrap_or(CUDA_ERROR_INVALID_VALUE);
        if rc == CUDA_SUCCESS && !prop.is_null() {
            // SAFETY: written by the driver on success.
            unsafe {
                (*prop).location = location(Place::Device, CUdevice::from(device));
            }
        }
        rc
    }

    /// `cuMemSetAccess`: under tiered spill, the program's blocks in the
    /// range may move from now on, and a move grants the same access.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_set_access(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        ptr: CUdeviceptr,
        size: usize,
        desc: *const CUmemAccessDesc,
        count: usize,
    ) -> CUresult {
        if !self.tiers.on() {
            return real();
        }
        // Through the gate, until the access is kept: a block the program
        // grants access to again may be in the middle of a move, its
        // address unmapped, and a move must grant what the program did.
        let _open = self.tiers.enter();
        let rc = real();
        if rc != CUDA_SUCCESS || desc.is_null() || count == 0 {
            return rc;
        }
        // SAFETY: the driver read `count` descriptors there and succeeded.
        let access = unsafe { std::slice::from_raw_parts(desc, count) };
        let end = ptr.saturating_add(size as u64);
        for b in self.tiers.blocks_overlapping(ptr, end) {
            if b.program_handle == 0 {
                continue;
            }
            // Access for another device (its work is not waited for before
            // a move) or for part of the page (a move grants what it keeps
            // over the whole page): the page stays where it is.
            let own = location(Place::Device, CUdevice::from(b.device));
            if b.ptr >= ptr
                && b.ptr.saturating_add(b.bytes) <= end
                && access.iter().all(|d| d.location == own)
            {
                b.granted(access);
            } else {
                b.pin();
            }
        }
        rc
    }

    /// A context went away: its blocks of program handles stop moving;
    /// their memory stays mapped (it belongs to no context).
    pub(in crate::engine) fn tiered_forget_ctx(&self, ctx: usize) {
        for start in self.tiers.mapped_in(ctx) {
            if let Some(b) = self.tiers.detach(start) {
                self.unblocked(b.program_handle, &b, true);
            }
        }
    }
}
