//! Handlers for graphs: instantiation (sizing a graph's memory nodes),
//! upload and launch (charging graph memory as it grows, `accounting/held.rs`),
//! updates and destruction, and the graph memory trim. Under tiered spill
//! they also read executable graphs' uses (`tiered/graph_heat.rs`).

use std::ffi::{c_char, c_int, c_void};

use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Counting;

use crate::engine::Engine;
use crate::engine::driver::{Driver, Flavour};
use crate::ffi::*;
use crate::log::log_once;

/// What graph memory grows by at least (32 MiB for a 1-byte node,
/// measured on the H200, driver 580), and what each allocation node is
/// rounded up to when a graph is sized.
const GRAPH_GRANULE: u64 = 32 << 20;
const GRAPH_NODE_ROUND: u64 = 2 << 20;

impl<D: Driver> Engine<D> {
    /// `cuDeviceGraphMemTrim`: the device's graph charge follows.
    pub fn graph_mem_trim(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        dev: CUdevice,
    ) -> CUresult {
        let rc = real();
        if rc == CUDA_SUCCESS
            && self
                .accounting
                .slot(dev)
                .is_some_and(|s| s.budget.limit().is_some())
        {
            self.accounting.graphs_refresh(dev);
        }
        rc
    }

    /// The graph memory an upload or launch of `exec` on `device` may add:
    /// the bytes of its allocation nodes (when its instantiation was seen)
    /// or what it added at its last launch, whichever is more, less the
    /// device's graph reserve that is free now, rounded up to what graph
    /// memory grows by. `reserved` is the device's graph reserve.
    fn graph_expect(&self, device: CUdevice, exec: u64, reserved: u64) -> u64 {
        let need = self
            .graph_size
            .get(&exec)
            .map_or(0, |g| *g)
            .max(self.graph_growth.get(&exec).map_or(0, |g| *g));
        if need == 0 {
            return 0;
        }
        let spare = self
            .driver
            .graph_mem_attribute(device, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
            .map_or(0, |used| reserved.saturating_sub(used));
        need.saturating_sub(spare)
            .checked_next_multiple_of(GRAPH_GRANULE)
            .unwrap_or(u64::MAX)
    }

    /// Reserves `expect` bytes on `device` for a graph's upload or launch,
    /// trimming the device's graph memory once when they do not fit; the
    /// refusal (counted and said) when they still do not. The caller gives
    /// the reservation back after the call, when the graph's real reserve
    /// is read.
    fn graph_admit(
        &'static self,
        what: &'static str,
        device: CUdevice,
        expect: u64,
    ) -> Result<Option<&'static DeviceSlot>, CUresult> {
        if expect == 0 {
            return Ok(None);
        }
        match self.try_reserve_evicting(device, expect) {
            Ok((slot, _)) => return Ok(Some(slot)),
            Err(_) if !self.accounting.capture_in_progress() => {
                let _ = self.driver.graph_mem_trim(device);
                self.accounting.graphs_refresh(device);
            }
            Err(_) => {}
        }
        match self.try_reserve_evicting(device, expect) {
            Ok((slot, _)) => Ok(Some(slot)),
            Err(why) => {
                if let (Some(s), Some(r)) = (self.accounting.slot(device), why) {
                    DeviceSlot::add(&s.refusals, 1);
                    self.accounting.refused(what, device, expect, r);
                }
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        }
    }

    /// After an upload or launch of `exec` (admitted with `held` reserved):
    /// the device's graph charge moves to its graph reserve, the
    /// reservation folded into the move, and the growth is remembered for
    /// the next launch.
    fn graph_settle(
        &self,
        device: CUdevice,
        exec: u64,
        before: u64,
        held: Option<(&DeviceSlot, u64)>,
        rc: CUresult,
    ) {
        let reserved = held.map_or(0, |(_, bytes)| bytes);
        if let Some(after) = self.accounting.graphs_settle(device, reserved)
            && rc == CUDA_SUCCESS
            && after > before
        {
            self.graph_growth.insert(exec, after - before);
        }
    }

    /// `cuGraphLaunch[_ptsz]`: under tiered spill the uses of the graph's
    /// kernels; then as an upload.
    pub fn graph_launch(
        &'static self,
        flavour: Flavour,
        real: impl FnMut() -> CUresult,
        exec: CUgraphExec,
        stream: CUstream,
    ) -> CUresult {
        if self.tiers.placing() && !exec.is_null() {
            self.tiers.note_graph(exec as u64);
        }
        self.graph_upload(flavour, real, exec, stream)
    }

    /// `cuGraphUpload[_ptsz]`, and what a launch does besides: graph memory
    /// (`held.rs`). What the graph may add is reserved first, and the call
    /// refused with out-of-memory when it does not fit; after it the
    /// device's graph charge follows its graph reserve.
    pub fn graph_upload(
        &'static self,
        flavour: Flavour,
        mut real: impl FnMut() -> CUresult,
        exec: CUgraphExec,
        stream: CUstream,
    ) -> CUresult {
        // Tiered spill moves no block while a graph is being launched.
        let _open = self.tiers.enter();
        if self.settings.counting != Counting::Held || exec.is_null() {
            return real();
        }
        let Some((_, device)) = self.stream_target(stream as usize, flavour) else {
            return real();
        };
        if self.limit_of(device).is_none() {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        let Some(before) = self.accounting.graphs_refresh(device) else {
            return real();
        };
        let key = exec as u64;
        let expect = self.graph_expect(device, key, before);
        let what =
            ["cuGraphLaunch", "cuGraphLaunch_ptsz"][usize::from(flavour == Flavour::PerThread)];
        let _inflight = self.inflight.enter();
        let held = match self.graph_admit(what, device, expect) {
            Ok(h) => h.map(|s| (s, expect)),
            Err(rc) => return rc,
        };
        let rc = real();
        self.graph_settle(device, key, before, held, rc);
        rc
    }

    /// Notes the allocation nodes' bytes of the graph `exec` was made from,
    /// and under tiered spill what its kernel nodes use.
    fn graph_instantiated(&self, rc: CUresult, exec: *mut CUgraphExec, graph: CUgraph) {
        self.graph_sized(rc, exec, graph);
        self.graph_walked(rc, exec, graph);
    }

    /// Under tiered spill, what the kernel nodes of the graph `exec` was
    /// made from use (`engine/tiered/`).
    fn graph_walked(&self, rc: CUresult, exec: *mut CUgraphExec, graph: CUgraph) {
        if rc != CUDA_SUCCESS || !self.tiers.placing() {
            return;
        }
        // SAFETY: on success the driver wrote the handle.
        if let Some(&exec) = unsafe { exec.as_ref() } {
            self.graph_updated(rc, exec, graph);
        }
    }

    /// Notes the allocation nodes' bytes of the graph `exec` was made from.
    fn graph_sized(&self, rc: CUresult, exec: *mut CUgraphExec, graph: CUgraph) {
        if rc != CUDA_SUCCESS || self.settings.counting != Counting::Held {
            return;
        }
        // SAFETY: on success the driver wrote the handle.
        let Some(exec) = (unsafe { exec.as_ref() }).map(|e| *e as u64) else {
            return;
        };
        self.graph_growth.remove(&exec);
        match self
            .driver
            .graph_alloc_bytes(graph as usize, GRAPH_NODE_ROUND)
        {
            Some(b) if b > 0 => {
                self.graph_size.insert(exec, b);
            }
            _ => {
                self.graph_size.remove(&exec);
            }
        }
    }

    /// `cuGraphInstantiate` (10.0) and `cuGraphInstantiate_v2` (11.0).
    pub fn graph_instantiate_logged(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        exec: *mut CUgraphExec,
        graph: CUgraph,
        _err_node: *mut CUgraphNode,
        _log: *mut c_char,
        _log_size: usize,
    ) -> CUresult {
        let rc = real();
        self.graph_instantiated(rc, exec, graph);
        rc
    }

    /// `cuGraphInstantiateWithFlags` (what `cuGraphInstantiate` is from CUDA 12).
    pub fn graph_instantiate_with_flags(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        exec: *mut CUgraphExec,
        graph: CUgraph,
        _flags: u64,
    ) -> CUresult {
        let rc = real();
        self.graph_instantiated(rc, exec, graph);
        rc
    }

    /// `cuGraphInstantiateWithParams[_ptsz]`: with the upload flag the
    /// graph's memory is reserved as it is instantiated, so it is admitted
    /// first, as a launch is.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn graph_instantiate_with_params(
        &'static self,
        flavour: Flavour,
        mut real: impl FnMut() -> CUresult,
        exec: *mut CUgraphExec,
        graph: CUgraph,
        params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    ) -> CUresult {
        // SAFETY: null or the caller's parameters.
        let upload = unsafe { params.as_ref() }
            .filter(|p| p.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0)
            .map(|p| p.upload_stream);
        let target = match upload {
            Some(stream) if self.settings.counting == Counting::Held => {
                self.stream_target(stream as usize, flavour)
            }
            _ => None,
        };
        let Some((_, device)) = target else {
            let rc = real();
            self.graph_instantiated(rc, exec, graph);
            return rc;
        };
        if self.limit_of(device).is_none() {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        let Some(before) = self.accounting.graphs_refresh(device) else {
            let rc = real();
            self.graph_instantiated(rc, exec, graph);
            return rc;
        };
        let need = self
            .driver
            .graph_alloc_bytes(graph as usize, GRAPH_NODE_ROUND)
            .unwrap_or(0);
        let spare = self
            .driver
            .graph_mem_attribute(device, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
            .map_or(0, |used| before.saturating_sub(used));
        let expect = need
            .saturating_sub(spare)
            .checked_next_multiple_of(GRAPH_GRANULE)
            .unwrap_or(u64::MAX);
        let what = [
            "cuGraphInstantiateWithParams",
            "cuGraphInstantiateWithParams_ptsz",
        ][usize::from(flavour == Flavour::PerThread)];
        let inflight = self.inflight.enter();
        let held = match self.graph_admit(what, device, expect) {
            Ok(h) => h.map(|s| (s, expect)),
            Err(rc) => {
                // SAFETY: non-null (it named the upload stream) and writable.
                if let Some(p) = unsafe { params.as_mut() } {
                    p.result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
                }
                return rc;
            }
        };
        let rc = real();
        self.graph_sized(rc, exec, graph);
        // SAFETY: on success the driver wrote the handle.
        let key = unsafe { exec.as_ref() }.map_or(0, |e| *e as u64);
        self.graph_settle(device, key, before, held, rc);
        // The walk of its kernels need not hold back a cap change.
        drop(inflight);
        self.graph_walked(rc, exec, graph);
        rc
    }

    /// `cuGraphExecUpdate` (CUDA 10.2): under tiered spill the updated
    /// graph's uses are read again from the graph it now follows.
    pub fn graph_exec_update(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        exec: CUgraphExec,
        graph: CUgraph,
        _err_node: *mut CUgraphNode,
        _result: *mut c_int,
    ) -> CUresult {
        let rc = real();
        self.graph_updated(rc, exec, graph);
        rc
    }

    /// `cuGraphExecUpdate_v2` (CUDA 12.0): as [`Engine::graph_exec_update`].
    pub fn graph_exec_update_v2(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        exec: CUgraphExec,
        graph: CUgraph,
        _info: *mut c_void,
    ) -> CUresult {
        let rc = real();
        self.graph_updated(rc, exec, graph);
        rc
    }

    /// Under tiered spill, what the kernel nodes of `graph`, which `exec`
    /// now follows, use (`engine/tiered/`).
    fn graph_updated(&self, rc: CUresult, exec: CUgraphExec, graph: CUgraph) {
        if rc == CUDA_SUCCESS && self.tiers.placing() && !exec.is_null() {
            self.tiers
                .graph_instantiated(self.driver, exec as u64, graph as usize);
        }
    }

    /// `cuGraphExecKernelNodeSetParams[_v2]`: a kernel node of the
    /// executable graph changed in place. Under tiered spill its launches
    /// count no uses from then on (which node's uses to replace is not
    /// kept), rather than the old parameters' uses.
    pub fn graph_exec_node_set(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        exec: CUgraphExec,
        _node: CUgraphNode,
        _params: *const c_void,
    ) -> CUresult {
        let rc = real();
        if rc == CUDA_SUCCESS
            && self.tiers.placing()
            && self.tiers.take_graph(exec as u64).is_some()
        {
            log_once!(
                Info,
                "tiered spill: a kernel node of an executable graph was changed in place (cuGraphExecKernelNodeSetParams or cuGraphExecNodeSetParams); that graph's launches count no uses from then on"
            );
        }
        rc
    }

    /// `cuGraphExecNodeSetParams` (CUDA 12.2), any kind of node: for a
    /// kernel node as [`Engine::graph_exec_node_set`].
    ///
    /// # Safety
    /// The driver function's contract (`params` null or a whole
    /// `CUgraphNodeParams`, whose first field is the node's type).
    pub unsafe fn graph_exec_node_set_any(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        exec: CUgraphExec,
        node: CUgraphNode,
        params: *mut c_void,
    ) -> CUresult {
        // SAFETY: null or the caller's parameters, which begin with the type.
        let kind = unsafe { params.cast::<c_int>().as_ref() }.copied();
        if kind != Some(CU_GRAPH_NODE_TYPE_KERNEL) {
            return real();
        }
        self.graph_exec_node_set(real, exec, node, params)
    }

    /// `cuGraphExecDestroy`: what is known of the graph goes (its
    /// allocations not yet freed stay graph memory, as the driver keeps
    /// them).
    pub fn graph_exec_destroy(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        exec: CUgraphExec,
    ) -> CUresult {
        // Taken before the call: once it returns, the handle may come back
        // for another thread's new graph.
        let uses = self
            .tiers
            .placing()
            .then(|| self.tiers.take_graph(exec as u64))
            .flatten();
        let rc = real();
        if rc == CUDA_SUCCESS {
            self.graph_size.remove(&(exec as u64));
            self.graph_growth.remove(&(exec as u64));
        } else if let Some(u) = uses {
            self.tiers.put_graph(exec as u64, u);
        }
        rc
    }
}
