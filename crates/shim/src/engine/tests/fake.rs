//! The fake driver the engine's unit tests run against: one device of
//! 16 GiB (or as many as the test's `Machine` names) with one context,
//! pools, graphs and VMM memory enough for the handlers, and the engine
//! builders over it.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use vramcap_core::settings::Settings;

use crate::engine::Engine;
use crate::engine::driver::{Driver, Flavour};
use crate::ffi::*;

pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;
pub(super) const CTX: usize = 0x1000;

/// One device of 16 GiB (or `machine.visible` of them) with one context,
/// current on every thread, on device 0.
#[derive(Default)]
pub(super) struct Fake {
    pub(super) machine: Machine,
    /// `exit_process` calls, by status.
    pub(super) exits: Mutex<Vec<c_int>>,
    pub(super) device_counts: AtomicUsize,
    pub(super) nvml_inits: AtomicUsize,
    pub(super) nvml_shutdowns: AtomicUsize,
    pub(super) next_ptr: AtomicU64,
    /// Bytes the fake driver has handed out and not had back.
    pub(super) live: AtomicU64,
    /// The most `live` ever was.
    pub(super) peak: AtomicU64,
    pub(super) syncs: AtomicUsize,
    /// How long the next `cuCtxSynchronize` takes, in µs: the GPU's queue
    /// draining (once; then 0).
    pub(super) sync_us: AtomicU64,
    /// Events recorded on the legacy stream, and events waited for.
    pub(super) legacy_records: AtomicUsize,
    pub(super) event_syncs: AtomicUsize,
    /// What `cuCtxGetId` answers for the one context (a test changes it
    /// to play a new context at the same address), and events created.
    pub(super) ctx_id: AtomicU64,
    pub(super) events_created: AtomicUsize,
    pub(super) last_recorded: AtomicUsize,
    pub(super) frees: AtomicUsize,
    /// Stream captures the fake reports (by stream handle), and on the legacy stream.
    pub(super) capturing: Mutex<HashMap<usize, c_int>>,
    pub(super) sizes: Mutex<HashMap<u64, u64>>,
    /// The one pool's (reserved, used, release threshold) bytes.
    pub(super) pool: Mutex<(u64, u64, u64)>,
    /// What NVML shows for this process beyond `live` and the pool (`None`: NVML lists nobody).
    pub(super) context: Option<u64>,
    /// In a container: NVML lists this process under another PID, beside
    /// `others` (PID, bytes).
    pub(super) container: bool,
    pub(super) others: Vec<(u32, u64)>,
    /// NVML has no figure for the process (`NVML_VALUE_NOT_AVAILABLE`).
    pub(super) not_available: bool,
    /// VMM physical allocations by handle: (bytes, on the host); device
    /// ones count in `live`. Mappings: address -> handle. Copies made.
    pub(super) vmm: Mutex<HashMap<u64, (u64, bool)>>,
    pub(super) maps: Mutex<HashMap<u64, u64>>,
    /// Each `cuMemSetAccess` the engine made itself: (address, descriptors).
    pub(super) access: Mutex<Vec<(u64, Vec<CUmemAccessDesc>)>>,
    pub(super) copies: AtomicUsize,
    /// The kernel nodes of graphs, by graph handle, and the walks of them.
    pub(super) graphs: Mutex<HashMap<usize, Vec<KernelNode>>>,
    pub(super) graph_walks: AtomicUsize,
    /// The driver's checkpoint calls (parking's tests).
    pub(super) ck: Ck,
}

/// The fake's checkpoint calls: off by default (a driver without them);
/// on, each step answers 0 unless it is `fail`, and is recorded; the
/// GPUs' free memory, as another process would measure it, is `free`
/// bytes on each device (`None`: not measurable).
#[derive(Default)]
pub(super) struct Ck {
    pub(super) on: bool,
    pub(super) steps: Mutex<Vec<&'static str>>,
    pub(super) fail: Mutex<Option<&'static str>>,
    pub(super) free: Mutex<Option<u64>>,
}

/// A fake graph's kernel node: its function and one 8-byte word per parameter.
pub(super) type KernelNode = (usize, Vec<u64>);

/// The fake's one memory pool.
pub(super) const POOL: usize = 0x2000;

/// What the fake machine has: devices the process sees, and NVML's list of
/// every GPU (`None`: no NVML).
pub(super) struct Machine {
    pub(super) visible: c_int,
    pub(super) nvml: Option<Vec<String>>,
}

impl Default for Machine {
    fn default() -> Machine {
        Machine {
            visible: 1,
            nvml: None,
        }
    }
}

/// The UUID text of the fake's device `dev` (its bytes are all `dev + 1`).
pub(super) fn fake_uuid(dev: u8) -> String {
    let b = format!("{:02x}", dev + 1);
    format!(
        "GPU-{0}{0}{0}{0}-{0}{0}-{0}{0}-{0}{0}-{0}{0}{0}{0}{0}{0}",
        b
    )
}

impl Fake {
    /// What the real allocation does: a fresh address, counted as live.
    pub(super) fn alloc(&self, bytes: u64) -> u64 {
        let p = 0x7000_0000_0000 + self.next_ptr.fetch_add(bytes.max(512), Ordering::SeqCst);
        let now = self.live.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.sizes.lock().unwrap().insert(p, bytes);
        p
    }
}

impl crate::engine::driver::Checkpointing for Fake {
    fn checkpoint(&self, step: crate::engine::driver::Checkpoint) -> Option<CUresult> {
        use crate::engine::driver::Checkpoint;
        if !self.ck.on {
            return None;
        }
        let name = match step {
            Checkpoint::Lock(_) => "lock",
            Checkpoint::Save => "save",
            Checkpoint::Restore => "restore",
            Checkpoint::Unlock => "unlock",
        };
        self.ck.steps.lock().unwrap().push(name);
        Some(match *self.ck.fail.lock().unwrap() {
            Some(f) if f == name => 999,
            _ => CUDA_SUCCESS,
        })
    }
    fn has_checkpoint_api(&self) -> bool {
        self.ck.on
    }
    fn gpu_free(&self) -> Result<Vec<(String, u64)>, String> {
        match *self.ck.free.lock().unwrap() {
            Some(f) if self.ck.on => Ok((0..self.machine.visible)
                .map(|d| (fake_uuid(d as u8), f))
                .collect()),
            _ => Err("not measurable".into()),
        }
    }
}

impl Driver for Fake {
    fn ctx_get_current(&self) -> Result<usize, CUresult> {
        Ok(CTX)
    }
    fn ctx_get_id(&self, _ctx: usize) -> Result<u64, CUresult> {
        Ok(self.ctx_id.load(Ordering::SeqCst))
    }
    fn ctx_get_device(&self) -> Result<CUdevice, CUresult> {
        Ok(0)
    }
    fn ctx_synchronize(&self) -> CUresult {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        // Once: the drain a test sets up is the next synchronisation's.
        let us = self.sync_us.swap(0, Ordering::SeqCst);
        if us > 0 {
            // The work a real synchronisation waits for, not a wait for
            // another thread.
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
        CUDA_SUCCESS
    }
    fn ctx_push_current(&self, _ctx: usize) -> CUresult {
        CUDA_SUCCESS
    }
    fn ctx_pop_current(&self) -> CUresult {
        CUDA_SUCCESS
    }
    fn primary_ctx_state(&self, _dev: CUdevice) -> Result<(c_uint, bool), CUresult> {
        Ok((0, true))
    }
    fn primary_ctx_retain(&self, _dev: CUdevice) -> Result<usize, CUresult> {
        Ok(CTX)
    }
    fn primary_ctx_release(&self, _dev: CUdevice) -> CUresult {
        CUDA_SUCCESS
    }
    fn device_count(&self) -> Result<c_int, CUresult> {
        self.device_counts.fetch_add(1, Ordering::SeqCst);
        Ok(self.machine.visible)
    }
    fn device_name(&self, dev: CUdevice) -> Result<String, CUresult> {
        Ok(format!("fake {dev}"))
    }
    fn device_total_mem(&self, _dev: CUdevice) -> Result<u64, CUresult> {
        Ok(16 * GIB)
    }
    fn device_uuid(&self, dev: CUdevice) -> Result<[u8; 16], CUresult> {
        if !(0..self.machine.visible).contains(&dev) {
            return Err(101); // CUDA_ERROR_INVALID_DEVICE
        }
        Ok([dev as u8 + 1; 16])
    }
    fn stream_is_capturing(&self, stream: usize, _flavour: Flavour) -> Result<c_int, CUresult> {
        Ok(*self.capturing.lock().unwrap().get(&stream).unwrap_or(&0))
    }
    fn stream_get_device(&self, _stream: usize, _flavour: Flavour) -> Result<CUdevice, CUresult> {
        Ok(0)
    }
    fn mem_free(&self, ptr: CUdeviceptr) -> CUresult {
        self.frees.fetch_add(1, Ordering::SeqCst);
        match self.sizes.lock().unwrap().remove(&ptr) {
            Some(b) => {
                self.live.fetch_sub(b, Ordering::SeqCst);
                CUDA_SUCCESS
            }
            None => 1, // CUDA_ERROR_INVALID_VALUE
        }
    }
    fn mem_host_alloc(&self, bytes: usize, _flags: c_uint) -> Result<usize, CUresult> {
        Ok(0x5000_0000 + bytes)
    }
    fn mem_host_get_device_pointer(&self, host: usize) -> Result<CUdeviceptr, CUresult> {
        Ok(host as u64 | 0x1_0000_0000_0000)
    }
    fn mem_free_host(&self, _host: usize) -> CUresult {
        CUDA_SUCCESS
    }
    fn host_register(&self, _host: usize, _bytes: u64) -> CUresult {
        CUDA_SUCCESS
    }
    fn host_unregister(&self, _host: usize) -> CUresult {
        CUDA_SUCCESS
    }
    fn event_create(&self, _flags: c_uint) -> Result<usize, CUresult> {
        Ok(0x1000 + self.events_created.fetch_add(1, Ordering::SeqCst))
    }
    fn event_record(&self, event: usize, stream: usize, _flavour: Flavour) -> CUresult {
        self.last_recorded.store(event, Ordering::SeqCst);
        if stream == 1 {
            self.legacy_records.fetch_add(1, Ordering::SeqCst);
        }
        CUDA_SUCCESS
    }
    fn event_query(&self, _event: usize) -> CUresult {
        CUDA_SUCCESS
    }
    fn param_info(&self, func: usize, index: usize) -> Result<(usize, usize), CUresult> {
        // Function handle N has N parameters of 8 bytes each.
        if index < func {
            Ok((index * 8, 8))
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
    fn vmm_granularity(&self, _: CUmemLocation) -> Result<u64, CUresult> {
        Ok(2 * MIB)
    }
    fn vmm_create(&self, bytes: u64, at: CUmemLocation) -> Result<u64, CUresult> {
        let host = at.kind == CU_MEM_LOCATION_TYPE_HOST;
        let h = 0x9000_0000 + self.next_ptr.fetch_add(512, Ordering::SeqCst);
        if !host {
            let now = self.live.fetch_add(bytes, Ordering::SeqCst) + bytes;
            self.peak.fetch_max(now, Ordering::SeqCst);
        }
        self.vmm.lock().unwrap().insert(h, (bytes, host));
        Ok(h)
    }
    fn vmm_release(&self, handle: u64) -> CUresult {
        match self.vmm.lock().unwrap().remove(&handle) {
            Some((bytes, false)) => {
                self.live.fetch_sub(bytes, Ordering::SeqCst);
                CUDA_SUCCESS
            }
            Some(_) => CUDA_SUCCESS,
            None => CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn vmm_reserve(&self, bytes: u64) -> Result<CUdeviceptr, CUresult> {
        Ok(0x7000_0000_0000 + self.next_ptr.fetch_add(bytes.max(512), Ordering::SeqCst))
    }
    fn vmm_free_address(&self, _: CUdeviceptr, _: u64) -> CUresult {
        CUDA_SUCCESS
    }
    fn vmm_map(&self, ptr: CUdeviceptr, _: u64, handle: u64, _: CUdevice) -> CUresult {
        self.maps.lock().unwrap().insert(ptr, handle);
        CUDA_SUCCESS
    }
    fn vmm_unmap(&self, ptr: CUdeviceptr, _: u64) -> CUresult {
        match self.maps.lock().unwrap().remove(&ptr) {
            Some(_) => CUDA_SUCCESS,
            None => CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn vmm_map_as(&self, ptr: CUdeviceptr, _: u64, offset: u64, handle: u64, _: u64) -> CUresult {
        if offset != 0 || !self.vmm.lock().unwrap().contains_key(&handle) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        self.maps.lock().unwrap().insert(ptr, handle);
        CUDA_SUCCESS
    }
    fn vmm_set_access(&self, ptr: CUdeviceptr, _: u64, access: &[CUmemAccessDesc]) -> CUresult {
        self.access.lock().unwrap().push((ptr, access.to_vec()));
        CUDA_SUCCESS
    }
    /// Host memory has no shareable handle; device memory's is a new
    /// descriptor.
    unsafe fn vmm_export(&self, shareable: *mut c_void, handle: u64, _: c_int, _: u64) -> CUresult {
        match self.vmm.lock().unwrap().get(&handle) {
            Some((_, false)) => {
                // A descriptor of its own, as the driver's are (all open on
                // one device file, /dev/nvidiactl; /dev/null here).
                // SAFETY: open of a literal path; the caller's contract (an
                // int for descriptors).
                unsafe {
                    *shareable.cast::<c_int>() = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
                }
                CUDA_SUCCESS
            }
            Some(_) => 801, // CUDA_ERROR_NOT_SUPPORTED
            None => CUDA_ERROR_INVALID_VALUE,
        }
    }
    unsafe fn vmm_properties(&self, prop: *mut CUmemAllocationPropFull, handle: u64) -> CUresult {
        let Some(&(_, host)) = self.vmm.lock().unwrap().get(&handle) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let place = if host {
            crate::engine::tiered::Place::Host
        } else {
            crate::engine::tiered::Place::Device
        };
        // SAFETY: the caller's contract.
        unsafe { (*prop).location = crate::engine::tiered::location(place, 0) };
        CUDA_SUCCESS
    }
    fn copy_dtod(&self, _: CUdeviceptr, _: CUdeviceptr, _: u64, _: usize) -> CUresult {
        self.copies.fetch_add(1, Ordering::SeqCst);
        CUDA_SUCCESS
    }
    fn func_name(&self, func: usize) -> Option<String> {
        // Function 7 is a matrix product.
        (func == 7).then(|| "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8".into())
    }
    fn stream_create(&self, _flags: c_uint) -> Result<usize, CUresult> {
        Ok(0x7000)
    }
    fn stream_synchronize(&self, _stream: usize) -> CUresult {
        CUDA_SUCCESS
    }
    fn event_synchronize(&self, _event: usize) -> CUresult {
        self.event_syncs.fetch_add(1, Ordering::SeqCst);
        CUDA_SUCCESS
    }
    fn event_destroy(&self, _event: usize) -> CUresult {
        CUDA_SUCCESS
    }
    fn array_destroy(&self, _array: usize, _mipmapped: bool) -> CUresult {
        CUDA_SUCCESS
    }
    fn array_size(&self, _array: usize, _dev: CUdevice, _mipmapped: bool) -> Result<u64, CUresult> {
        Err(CUDA_ERROR_NOT_FOUND)
    }
    fn device_mem_pool(&self, _dev: CUdevice) -> Result<usize, CUresult> {
        Ok(POOL)
    }
    fn mem_pool_attribute(&self, _pool: usize, attr: c_int) -> Result<u64, CUresult> {
        let p = self.pool.lock().unwrap();
        Ok(match attr {
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => p.0,
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => p.1,
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.2,
            _ => 0,
        })
    }
    fn mem_pool_trim_to(&self, _pool: usize, keep: u64) -> CUresult {
        let mut p = self.pool.lock().unwrap();
        p.0 = p.0.min(keep.max(p.1));
        CUDA_SUCCESS
    }
    fn graph_mem_attribute(&self, _dev: CUdevice, _attr: c_int) -> Result<u64, CUresult> {
        Err(CUDA_ERROR_NOT_FOUND)
    }
    fn graph_mem_trim(&self, _dev: CUdevice) -> CUresult {
        CUDA_ERROR_NOT_FOUND
    }
    fn graph_alloc_bytes(&self, _graph: usize, _round: u64) -> Option<u64> {
        None
    }
    fn graph_kernels(
        &self,
        graph: usize,
        visit: &mut dyn FnMut(usize, *mut *mut c_void, *mut *mut c_void),
    ) -> bool {
        self.graph_walks.fetch_add(1, Ordering::SeqCst);
        let Some(kernels) = self.graphs.lock().unwrap().get(&graph).cloned() else {
            return false;
        };
        for (func, mut words) in kernels {
            let mut params: Vec<*mut c_void> = words
                .iter_mut()
                .map(|w| std::ptr::from_mut(w).cast::<c_void>())
                .collect();
            visit(func, params.as_mut_ptr(), std::ptr::null_mut());
        }
        true
    }
    fn nvml_device_by_uuid(&self, _uuid: &str) -> Option<usize> {
        Some(1)
    }
    fn nvml_processes(&self, _device: usize, out: &mut [(u32, u64)]) -> Option<usize> {
        let ctx = self.context?;
        let pool = self.pool.lock().unwrap().0;
        let pid = if self.container {
            7
        } else {
            std::process::id()
        };
        out[0] = (pid, self.live.load(Ordering::SeqCst) + pool + ctx);
        if self.not_available {
            out[0].1 = u64::MAX;
        }
        for (o, p) in out[1..].iter_mut().zip(&self.others) {
            *o = *p;
        }
        Some(1 + self.others.len())
    }
    fn initial_pid_namespace(&self) -> bool {
        !self.container
    }
    fn nvml_init(&self) -> bool {
        let there = self.machine.nvml.is_some() || self.context.is_some();
        if there {
            self.nvml_inits.fetch_add(1, Ordering::SeqCst);
        }
        there
    }
    fn nvml_shutdown(&self) {
        self.nvml_shutdowns.fetch_add(1, Ordering::SeqCst);
    }
    fn nvml_device_count(&self) -> Option<u32> {
        self.machine.nvml.as_ref().map(|l| l.len() as u32)
    }
    fn nvml_device_by_index(&self, index: u32) -> Option<usize> {
        // Handles are index + 1 (never null).
        let n = self.nvml_device_count()?;
        (index < n).then_some(index as usize + 1)
    }
    fn nvml_device_name(&self, device: usize) -> Option<String> {
        self.nvml_device_uuid(device)
            .map(|_| format!("fake {}", device - 1))
    }
    fn nvml_device_uuid(&self, device: usize) -> Option<String> {
        self.machine
            .nvml
            .as_ref()?
            .get(device.checked_sub(1)?)
            .cloned()
    }
    fn nvml_device_index(&self, _device: usize) -> Option<u32> {
        None
    }
    fn exit_process(&self, status: c_int) {
        self.exits.lock().unwrap().push(status);
    }
}

/// An engine with these settings (statistics off) over a fresh fake.
pub(super) fn engine(vars: &[(&str, &str)]) -> &'static Engine<Fake> {
    engine_on(Machine::default(), vars)
}

/// [`engine`] over a fake with this machine.
pub(super) fn engine_on(machine: Machine, vars: &[(&str, &str)]) -> &'static Engine<Fake> {
    engine_with(
        Fake {
            machine,
            ..Fake::default()
        },
        vars,
    )
}

/// [`engine`] over this fake.
pub(super) fn engine_with(fake: Fake, vars: &[(&str, &str)]) -> &'static Engine<Fake> {
    let mut vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.insert("VRAMCAP_STATS".into(), "off".into());
    // The context costs nothing unless a test says otherwise.
    vars.entry("VRAMCAP_CONTEXT".into()).or_insert("0".into());
    let settings = Settings::from_lookup(|k| vars.get(k).cloned()).expect("valid test settings");
    Box::leak(Box::new(Engine::new(fake, Box::leak(Box::new(settings)))))
}
