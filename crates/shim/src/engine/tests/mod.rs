//! Unit tests of the engine against a fake driver: the reservation under
//! the cap (threads included), the cache's synchronisation tickets, VMM
//! reference counts, settling to the size the driver chose, spill and the
//! memory-info formula, the check that every key of the limit names a GPU,
//! and the rule that a group only makes a member's cap stricter. Each test
//! makes its own engine (statistics off: the page lives in private memory;
//! group tests use a directory of their own for the group file).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use vramcap_core::settings::Settings;

use crate::engine::Engine;
use crate::engine::accounting::capped_info;
use crate::engine::driver::{Driver, Flavour};
use crate::ffi::*;

mod frees;
mod held;
mod limits;
mod tiered;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const CTX: usize = 0x1000;

/// One device of 16 GiB (or `machine.visible` of them) with one context,
/// current on every thread, on device 0.
#[derive(Default)]
struct Fake {
    machine: Machine,
    /// `exit_process` calls, by status.
    exits: Mutex<Vec<c_int>>,
    device_counts: AtomicUsize,
    nvml_inits: AtomicUsize,
    nvml_shutdowns: AtomicUsize,
    next_ptr: AtomicU64,
    /// Bytes the fake driver has handed out and not had back.
    live: AtomicU64,
    /// The most `live` ever was.
    peak: AtomicU64,
    syncs: AtomicUsize,
    /// Events recorded on the legacy stream, and events waited for.
    legacy_records: AtomicUsize,
    event_syncs: AtomicUsize,
    /// What `cuCtxGetId` answers for the one context (a test changes it
    /// to play a new context at the same address), and events created.
    ctx_id: AtomicU64,
    events_created: AtomicUsize,
    last_recorded: AtomicUsize,
    frees: AtomicUsize,
    /// Stream captures the fake reports (by stream handle), and on the legacy stream.
    capturing: Mutex<HashMap<usize, c_int>>,
    sizes: Mutex<HashMap<u64, u64>>,
    /// The one pool's (reserved, used, release threshold) bytes.
    pool: Mutex<(u64, u64, u64)>,
    /// What NVML shows for this process beyond `live` and the pool (`None`: NVML lists nobody).
    context: Option<u64>,
    /// In a container: NVML lists this process under another PID, beside
    /// `others` (PID, bytes).
    container: bool,
    others: Vec<(u32, u64)>,
    /// NVML has no figure for the process (`NVML_VALUE_NOT_AVAILABLE`).
    not_available: bool,
    /// VMM physical allocations by handle: (bytes, on the host); device
    /// ones count in `live`. Mappings: address -> handle. Copies made.
    vmm: Mutex<HashMap<u64, (u64, bool)>>,
    maps: Mutex<HashMap<u64, u64>>,
    /// Each `cuMemSetAccess` the engine made itself: (address, descriptors).
    access: Mutex<Vec<(u64, Vec<CUmemAccessDesc>)>>,
    copies: AtomicUsize,
    /// The kernel nodes of graphs, by graph handle, and the walks of them.
    graphs: Mutex<HashMap<usize, Vec<KernelNode>>>,
    graph_walks: AtomicUsize,
}

/// A fake graph's kernel node: its function and one 8-byte word per parameter.
type KernelNode = (usize, Vec<u64>);

/// The fake's one memory pool.
const POOL: usize = 0x2000;

/// What the fake machine has: devices the process sees, and NVML's list of
/// every GPU (`None`: no NVML).
struct Machine {
    visible: c_int,
    nvml: Option<Vec<String>>,
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
fn fake_uuid(dev: u8) -> String {
    let b = format!("{:02x}", dev + 1);
    format!(
        "GPU-{0}{0}{0}{0}-{0}{0}-{0}{0}-{0}{0}-{0}{0}{0}{0}{0}{0}",
        b
    )
}

impl Fake {
    /// What the real allocation does: a fresh address, counted as live.
    fn alloc(&self, bytes: u64) -> u64 {
        let p = 0x7000_0000_0000 + self.next_ptr.fetch_add(bytes.max(512), Ordering::SeqCst);
        let now = self.live.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.sizes.lock().unwrap().insert(p, bytes);
        p
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
    fn device_attribute(&self, _attr: c_int, _dev: CUdevice) -> Result<c_int, CUresult> {
        Ok(1)
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
    fn mem_alloc_managed(&self, bytes: usize, _flags: c_uint) -> Result<CUdeviceptr, CUresult> {
        Ok(self.alloc(bytes as u64))
    }
    fn has_mem_advise_v2(&self) -> bool {
        true
    }
    fn mem_advise_v2(&self, _: CUdeviceptr, _: usize, _: c_int, _: CUmemLocation) -> CUresult {
        CUDA_SUCCESS
    }
    fn mem_advise(&self, _: CUdeviceptr, _: usize, _: c_int, _: CUdevice) -> CUresult {
        CUDA_SUCCESS
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
        // SAFETY: the caller's contract.
        unsafe { (*prop).location = crate::engine::tiered::location(host, 0) };
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
fn engine(vars: &[(&str, &str)]) -> &'static Engine<Fake> {
    engine_on(Machine::default(), vars)
}

/// [`engine`] over a fake with this machine.
fn engine_on(machine: Machine, vars: &[(&str, &str)]) -> &'static Engine<Fake> {
    engine_with(
        Fake {
            machine,
            ..Fake::default()
        },
        vars,
    )
}

/// [`engine`] over this fake.
fn engine_with(fake: Fake, vars: &[(&str, &str)]) -> &'static Engine<Fake> {
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

/// `cuMemAlloc_v2` through the engine, the fake playing the driver.
fn alloc(e: &'static Engine<Fake>, bytes: u64) -> Result<u64, CUresult> {
    let mut p: CUdeviceptr = 0;
    let out: *mut CUdeviceptr = &mut p;
    let real = || {
        // SAFETY: `out` points at `p`, alive for this call.
        unsafe { *out = e.driver.alloc(bytes) };
        CUDA_SUCCESS
    };
    // SAFETY: `out` is writable.
    let rc = unsafe { e.mem_alloc(real, out, bytes as usize) };
    if rc == CUDA_SUCCESS { Ok(p) } else { Err(rc) }
}

fn free(e: &'static Engine<Fake>, ptr: u64) -> CUresult {
    e.mem_free(|| e.driver.mem_free(ptr), ptr)
}

fn used(e: &'static Engine<Fake>) -> u64 {
    e.slot(0).unwrap().budget.used()
}

#[test]
fn the_cap_refuses_exactly_past_it_and_frees_give_back() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_CACHE", "off")]);
    let a = alloc(e, 768 * MIB).unwrap();
    assert_eq!(alloc(e, 257 * MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    let b = alloc(e, 256 * MIB).unwrap();
    assert_eq!(used(e), GIB);
    assert_eq!(alloc(e, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
    let s = e.slot(0).unwrap();
    assert_eq!(s.refusals.load(Ordering::Relaxed), 2);
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, b), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 0);
    assert_eq!(s.allocs.load(Ordering::Relaxed), 2);
    assert_eq!(s.frees.load(Ordering::Relaxed), 2);
}

#[test]
fn racing_threads_never_hold_more_than_the_cap() {
    let e = engine(&[("VRAMCAP_LIMIT", "100MiB"), ("VRAMCAP_CACHE", "off")]);
    let granted = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let granted = &granted;
            scope.spawn(move || {
                for i in 0..400u64 {
                    let bytes = (1 + (t * 7 + i * 13) % 9) * MIB;
                    if let Ok(p) = alloc(e, bytes) {
                        granted.fetch_add(1, Ordering::Relaxed);
                        assert_eq!(free(e, p), CUDA_SUCCESS);
                    }
                }
            });
        }
    });
    // The driver never held more than the cap at any moment; everything
    // came back; every attempt was either granted or counted as refused.
    assert!(e.driver.peak.load(Ordering::SeqCst) <= 100 * MIB);
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 0);
    assert_eq!(used(e), 0);
    let s = e.slot(0).unwrap();
    let refused = s.refusals.load(Ordering::Relaxed) as usize;
    assert_eq!(granted.load(Ordering::Relaxed) + refused, 8 * 400);
    assert!(s.budget.peak() <= 100 * MIB);
}

/// With only blocking streams a reuse is ordered with an event on the
/// legacy stream (no wait); once a non-blocking stream was asked for, it
/// waits for a synchronisation. Either way once per burst.
#[test]
fn one_ordering_makes_every_block_freed_before_it_safe() {
    for nonblocking in [false, true] {
        let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
        let flags = c_uint::from(nonblocking);
        assert_eq!(
            e.stream_create(|| CUDA_SUCCESS, std::ptr::null_mut(), flags),
            CUDA_SUCCESS
        );
        let (waits, ordered) = (&e.driver.syncs, &e.driver.legacy_records);
        let (way, other) = if nonblocking {
            (waits, ordered)
        } else {
            (ordered, waits)
        };
        reuse_once_per_burst(e, way);
        assert_eq!(other.load(Ordering::SeqCst), 0);
        let s = e.slot(0).unwrap();
        let counted = if nonblocking {
            &s.cache_waits
        } else {
            &s.cache_ordered
        };
        assert_eq!(counted.load(Ordering::Relaxed), 2);
    }
}

/// A context destroyed through a call the hooks do not see, and a new one
/// at the same address (another `cuCtxGetId`): the old event's handle is
/// never recorded again; the new context gets its own.
#[test]
fn a_new_context_at_the_same_address_gets_its_own_event() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let reuse = || {
        let a = alloc(e, 8 * MIB).unwrap();
        assert_eq!(free(e, a), CUDA_SUCCESS);
        let b = alloc(e, 8 * MIB).unwrap();
        assert_eq!(b, a, "the cached block");
        assert_eq!(free(e, b), CUDA_SUCCESS);
    };
    reuse();
    assert_eq!(e.driver.last_recorded.load(Ordering::SeqCst), 0x1000);
    reuse();
    assert_eq!(e.driver.events_created.load(Ordering::SeqCst), 1);
    e.driver.ctx_id.store(7, Ordering::SeqCst);
    reuse();
    assert_eq!(e.driver.last_recorded.load(Ordering::SeqCst), 0x1001);
    assert_eq!(e.driver.events_created.load(Ordering::SeqCst), 2);
    reuse();
    assert_eq!(e.driver.events_created.load(Ordering::SeqCst), 2);
    assert_eq!(e.driver.last_recorded.load(Ordering::SeqCst), 0x1001);
}

/// A non-blocking stream asked for after an ordering waits for it first:
/// the block that ordering made safe is then handed out without another.
#[test]
fn a_late_non_blocking_stream_waits_for_the_orderings_made() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let a = alloc(e, 8 * MIB).unwrap();
    let b = alloc(e, 8 * MIB).unwrap();
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, b), CUDA_SUCCESS);
    let _c = alloc(e, 8 * MIB).unwrap();
    assert_eq!(e.driver.legacy_records.load(Ordering::SeqCst), 1);
    assert_eq!(e.driver.event_syncs.load(Ordering::SeqCst), 0);
    assert_eq!(
        e.stream_create(|| CUDA_SUCCESS, std::ptr::null_mut(), 1),
        CUDA_SUCCESS
    );
    assert_eq!(e.driver.event_syncs.load(Ordering::SeqCst), 1);
    let _d = alloc(e, 8 * MIB).unwrap();
    assert_eq!(e.driver.syncs.load(Ordering::SeqCst), 0);
    // A second non-blocking stream changes nothing more.
    assert_eq!(
        e.stream_create(|| CUDA_SUCCESS, std::ptr::null_mut(), 1),
        CUDA_SUCCESS
    );
    assert_eq!(e.driver.event_syncs.load(Ordering::SeqCst), 1);
    let s = e.slot(0).unwrap();
    assert_eq!(s.cache_waits.load(Ordering::Relaxed), 1);
    assert_eq!(s.cache_ordered.load(Ordering::Relaxed), 1);
}

fn reuse_once_per_burst(e: &'static Engine<Fake>, syncs: &AtomicUsize) {
    let a = alloc(e, 8 * MIB).unwrap();
    let b = alloc(e, 8 * MIB).unwrap();
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, b), CUDA_SUCCESS);
    // Both kept: no driver free, still counted.
    assert_eq!(e.driver.frees.load(Ordering::SeqCst), 0);
    assert_eq!(used(e), 16 * MIB);
    assert_eq!(e.slot(0).unwrap().cached.load(Ordering::Relaxed), 16 * MIB);
    // The first reuse must be made safe from work that may still use the
    // block...
    let c = alloc(e, 8 * MIB).unwrap();
    assert_eq!(syncs.load(Ordering::SeqCst), 1);
    // ...and that covers the other block too.
    let d = alloc(e, 8 * MIB).unwrap();
    assert_eq!(syncs.load(Ordering::SeqCst), 1);
    let mut got = [c, d];
    got.sort();
    let mut want = [a, b];
    want.sort();
    assert_eq!(got, want);
    // A block freed after that needs another.
    assert_eq!(free(e, c), CUDA_SUCCESS);
    assert_eq!(alloc(e, 8 * MIB).unwrap(), c);
    assert_eq!(syncs.load(Ordering::SeqCst), 2);
    let s = e.slot(0).unwrap();
    assert_eq!(s.cache_hits.load(Ordering::Relaxed), 3);
    assert_eq!(s.cached.load(Ordering::Relaxed), 0);
    assert_eq!(used(e), 16 * MIB);
}

#[test]
fn while_a_capture_runs_the_cache_neither_synchronises_nor_keeps() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let a = alloc(e, 8 * MIB).unwrap();
    assert_eq!(free(e, a), CUDA_SUCCESS); // kept, not yet safe
    assert_eq!(
        e.begin_capture(|| CUDA_SUCCESS, std::ptr::null_mut()),
        CUDA_SUCCESS
    );
    let b = alloc(e, 8 * MIB).unwrap();
    assert_ne!(b, a, "an unsafe block is not handed out during a capture");
    assert_eq!(e.driver.syncs.load(Ordering::SeqCst), 0);
    assert_eq!(e.driver.legacy_records.load(Ordering::SeqCst), 0);
    // A free during the capture goes to the driver: keeping could evict.
    assert_eq!(free(e, b), CUDA_SUCCESS);
    assert_eq!(e.driver.frees.load(Ordering::SeqCst), 1);
    let stream = 0x77;
    assert_eq!(
        e.end_capture(
            Flavour::Legacy,
            || CUDA_SUCCESS,
            stream as CUstream,
            std::ptr::null_mut()
        ),
        CUDA_SUCCESS
    );
    assert!(!e.capturing());
    assert_eq!(alloc(e, 8 * MIB).unwrap(), a);
    assert_eq!(e.driver.legacy_records.load(Ordering::SeqCst), 1);
}

#[test]
fn a_full_cap_releases_cached_blocks_before_refusing() {
    let e = engine(&[("VRAMCAP_LIMIT", "64MiB")]);
    let a = alloc(e, 48 * MIB).unwrap();
    assert_eq!(free(e, a), CUDA_SUCCESS);
    // 48 MiB cached; 32 MiB fits only once the cache gives the block back.
    let b = alloc(e, 32 * MIB).unwrap();
    assert_ne!(b, a);
    let s = e.slot(0).unwrap();
    assert_eq!(s.evictions.load(Ordering::Relaxed), 1);
    assert_eq!(s.cached.load(Ordering::Relaxed), 0);
    assert_eq!(used(e), 32 * MIB);
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 32 * MIB);
}

#[test]
fn vmm_bytes_come_back_with_the_last_reference_or_mapping() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let prop = CUmemAllocationProp {
        kind: 1,
        handle_types: 0,
        location: CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
    };
    let mut h: CUmemGenericAllocationHandle = 0;
    let out: *mut u64 = &mut h;
    let real = || {
        // SAFETY: `out` points at `h`.
        unsafe { *out = 0xabc };
        CUDA_SUCCESS
    };
    // SAFETY: valid out-pointer and properties.
    let rc = unsafe { e.mem_create(real, out, (256 * MIB) as usize, &prop, 0) };
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(used(e), 256 * MIB);
    let mut again: u64 = 0;
    let again_out: *mut u64 = &mut again;
    let retain = || {
        // SAFETY: `again_out` points at `again`.
        unsafe { *again_out = 0xabc };
        CUDA_SUCCESS
    };
    // SAFETY: valid out-pointer.
    let rc = unsafe { e.mem_retain_allocation_handle(retain, again_out, std::ptr::null_mut()) };
    assert_eq!(rc, CUDA_SUCCESS);
    let ok = || CUDA_SUCCESS;
    assert_eq!(
        e.mem_map(ok, 0x9000_0000, (256 * MIB) as usize, 0, 0xabc, 0),
        CUDA_SUCCESS
    );
    assert_eq!(e.mem_release(ok, 0xabc), CUDA_SUCCESS);
    assert_eq!(e.mem_release(ok, 0xabc), CUDA_SUCCESS);
    // Both handles released, but the mapping still holds the memory.
    assert_eq!(used(e), 256 * MIB);
    assert_eq!(
        e.mem_unmap(ok, 0x9000_0000, (256 * MIB) as usize),
        CUDA_SUCCESS
    );
    assert_eq!(used(e), 0);
    // A handle the engine never counted changes nothing.
    assert_eq!(e.mem_release(ok, 0xdef), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
    assert_eq!(e.slot(0).unwrap().frees.load(Ordering::Relaxed), 1);
}

#[test]
fn a_pitch_wider_than_the_estimate_is_settled_or_refused() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_CACHE", "off")]);
    let pitched = |width: usize, height: usize, driver_pitch: usize| {
        let (mut p, mut pitch): (CUdeviceptr, usize) = (0, 0);
        let (out, pitch_out): (*mut u64, *mut usize) = (&mut p, &mut pitch);
        let real = || {
            // SAFETY: both point at locals alive for this call.
            unsafe {
                *out = e.driver.alloc((driver_pitch * height) as u64);
                *pitch_out = driver_pitch;
            }
            CUDA_SUCCESS
        };
        // SAFETY: valid out-pointers.
        let rc = unsafe { e.mem_alloc_pitch(real, out, pitch_out, width, height, 4) };
        (rc, p, pitch)
    };
    // Estimated at 512 × 1 Mi rows = 512 MiB; the driver picks 768.
    let (rc, p, pitch) = pitched(500, 1 << 20, 768);
    assert_eq!((rc, pitch), (CUDA_SUCCESS, 768));
    assert_eq!(used(e), 768 * MIB);
    // Estimated at 256 MiB, which fits; the driver's 512 MiB does not:
    // refused, and what the driver gave is freed again.
    let (rc, _, _) = pitched(500, 1 << 19, 1024);
    assert_eq!(rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(used(e), 768 * MIB);
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 768 * MIB);
    assert_eq!(free(e, p), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
}

#[test]
fn past_the_cap_host_spill_places_and_frees_outside_the_budget() {
    let e = engine(&[
        ("VRAMCAP_LIMIT", "1GiB"),
        ("VRAMCAP_CACHE", "off"),
        ("VRAMCAP_SPILL", "host"),
    ]);
    let a = alloc(e, GIB).unwrap();
    let b = alloc(e, 256 * MIB).unwrap();
    assert_eq!(
        b & 0x1_0000_0000_0000,
        0x1_0000_0000_0000,
        "a mapped host address"
    );
    let s = e.slot(0).unwrap();
    assert_eq!(used(e), GIB);
    assert_eq!(s.spilled.load(Ordering::Relaxed), 256 * MIB);
    assert_eq!(s.spill_allocs.load(Ordering::Relaxed), 1);
    assert_eq!(s.refusals.load(Ordering::Relaxed), 0);
    assert_eq!(free(e, b), CUDA_SUCCESS);
    assert_eq!(s.spilled.load(Ordering::Relaxed), 0);
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
}

#[test]
fn memory_info_is_the_cap_picture() {
    let nocap = u64::MAX;
    // Capped: total is the cap; free is what is left under it, cached
    // blocks counted as free.
    assert_eq!(
        capped_info(140 * GIB, 139 * GIB, 4 * GIB, 0, 0),
        (4 * GIB, 4 * GIB)
    );
    assert_eq!(
        capped_info(140 * GIB, 139 * GIB, 4 * GIB, 3 * GIB, GIB),
        (4 * GIB, 2 * GIB)
    );
    // The device's own free memory still bounds it.
    assert_eq!(
        capped_info(140 * GIB, GIB / 2, 4 * GIB, 0, 0),
        (4 * GIB, GIB / 2)
    );
    // A cap larger than the device reports the device.
    assert_eq!(capped_info(2 * GIB, GIB, 4 * GIB, 5 * GIB, 0), (2 * GIB, 0));
    // No cap: the driver's figures, cached blocks counted as free.
    assert_eq!(
        capped_info(16 * GIB, 10 * GIB, nocap, 0, GIB),
        (16 * GIB, 11 * GIB)
    );
    assert_eq!(
        capped_info(16 * GIB, 16 * GIB, nocap, 0, GIB),
        (16 * GIB, 16 * GIB)
    );
}
