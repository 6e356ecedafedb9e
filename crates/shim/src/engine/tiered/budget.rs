//! Where a tiered block's bytes are counted: the device's budget under the
//! cap, or the host memory's budget (the spill limit), with the page's
//! counters; made, undone and given back here only.

use std::sync::atomic::Ordering;

use vramcap_core::page::DeviceSlot;

use super::{Place, Tiering};
use crate::engine::accounting::records::Record;
use crate::engine::driver::Driver;
use crate::ffi::CUdevice;
use crate::log::log_once;

impl<D: Driver> Tiering<'_, D> {
    /// Counts a tiered allocation of `size` just made on the device or the
    /// host.
    pub fn count_made(&self, what: &str, device: CUdevice, size: u64, place: Place) {
        let Some(s) = self.accounting.slot(device) else {
            return;
        };
        DeviceSlot::add(&s.allocs, 1);
        if place == Place::Host {
            DeviceSlot::add(&s.spilled, size);
            DeviceSlot::add(&s.spill_allocs, 1);
            s.mark_active();
            log_once!(
                Info,
                "{what}: the cap of device {device} is reached; new blocks go to host memory and the most-used move onto the GPU (VRAMCAP_SPILL=tiered)"
            );
        }
    }

    /// Undoes `Engine::tier_reserve` (`engine/pipeline/tiered.rs`) for an allocation that was not made.
    pub fn unreserve(&self, device: CUdevice, size: u64, place: Place) {
        match place {
            Place::Host => self.host.give_back(size),
            Place::Device => {
                if let Some(s) = self.accounting.slot(device) {
                    self.accounting.release_on(s, device, size);
                }
            }
        }
    }

    /// Settles the bytes of a tiered block that is gone.
    pub fn give_back(&self, r: &Record, place: Place) {
        self.give_back_bytes(r.device, r.bytes, place);
    }

    /// Settles `bytes` of a tiered allocation of `device` that is gone,
    /// from the device's budget or the spill.
    pub fn give_back_bytes(&self, device: u16, bytes: u64, place: Place) {
        if place == Place::Device {
            self.accounting.give_back(device, bytes);
        } else {
            self.host.give_back(bytes);
            if let Some(s) = self.accounting.slot(CUdevice::from(device)) {
                s.spilled.fetch_sub(bytes, Ordering::Relaxed);
                DeviceSlot::add(&s.frees, 1);
            }
        }
    }
}
