//! The machine's GPUs as NVML lists them, so that `vramcap run`/`env` (and
//! `vramcap doctor` without a usable GPU) can refuse a `VRAMCAP_LIMIT` key
//! that names no GPU before anything starts, without initialising CUDA.
//!
//! The shim makes the full check at the first CUDA call that needs a cap
//! (`crates/shim/src/engine/accounting.rs`); this one refuses only what the
//! shim would certainly refuse, and says nothing when it cannot be sure:
//! - a UUID key is checked against every GPU NVML lists (the machine);
//! - an index key against the devices the process will see: all of NVML's
//!   without `CUDA_VISIBLE_DEVICES`, else the variable's entries, when each
//!   is an index or a UUID prefix of exactly one GPU and no GPU is named
//!   twice (otherwise CUDA's reading of it is not certain, and index keys
//!   are left to the shim);
//! - nothing is checked without NVML, without GPUs, or when a GPU is in MIG
//!   mode (CUDA then sees MIG devices, which NVML lists elsewhere).
//!
//! Both print the one line of `vramcap_core::limit::UnmatchedKeys`.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use vramcap_core::limit::{Gpu, LimitSpec};

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_NOT_SUPPORTED: c_int = 3;

/// An initialised NVML, shut down and closed on drop.
struct Nvml {
    handle: *mut c_void,
}

/// The function `name` of the library `handle`, typed as `F`.
///
/// # Safety
/// `handle` is a live `dlopen` handle and `F` the C signature of `name`.
unsafe fn sym<F: Copy>(handle: *mut c_void, name: &CStr) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    // SAFETY: a valid handle and name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    // SAFETY: F is a function pointer type of pointer size (asserted) and
    // the caller guarantees it is the function's signature.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl Nvml {
    fn open() -> Option<Nvml> {
        // SAFETY: a NUL-terminated name and flags.
        let handle = unsafe {
            libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        if handle.is_null() {
            return None;
        }
        type Init = unsafe extern "C" fn() -> c_int;
        // SAFETY: a live handle; nvmlInit_v2(void) in nvml.h.
        let init = unsafe { sym::<Init>(handle, c"nvmlInit_v2") };
        // SAFETY: no arguments.
        if init.is_some_and(|f| unsafe { f() } == NVML_SUCCESS) {
            Some(Nvml { handle })
        } else {
            // SAFETY: our handle; nothing of the library is used after this.
            unsafe { libc::dlclose(handle) };
            None
        }
    }

    /// The library's function `name`, typed as `F`.
    ///
    /// # Safety
    /// `F` must be the C signature of that NVML function.
    unsafe fn func<F: Copy>(&self, name: &CStr) -> Option<F> {
        // SAFETY: our live handle; the caller keeps the signature.
        unsafe { sym(self.handle, name) }
    }

    /// Every GPU NVML lists, one by one: its UUID, name and MIG mode, or
    /// why it cannot be told (no handle, no UUID); `None` when NVML cannot
    /// even count them.
    fn entries(&self) -> Option<Vec<Result<Entry, String>>> {
        type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
        type Handle = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
        type Text = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int;
        type Mig = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut c_uint) -> c_int;
        // SAFETY: each type is the nvml.h signature of the function named.
        let (count, handle, uuid, name, mig) = unsafe {
            (
                self.func::<Count>(c"nvmlDeviceGetCount_v2")?,
                self.func::<Handle>(c"nvmlDeviceGetHandleByIndex_v2")?,
                self.func::<Text>(c"nvmlDeviceGetUUID")?,
                self.func::<Text>(c"nvmlDeviceGetName"),
                self.func::<Mig>(c"nvmlDeviceGetMigMode"),
            )
        };
        let mut n: c_uint = 0;
        // SAFETY: a valid out-pointer.
        if unsafe { count(&mut n) } != NVML_SUCCESS {
            return None;
        }
        let mut out = Vec::new();
        for i in 0..n {
            let mut dev: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            if unsafe { handle(i, &mut dev) } != NVML_SUCCESS {
                out.push(Err(format!("GPU {i}: NVML gives no handle for it")));
                continue;
            }
            let Some(u) = device_text(uuid, dev) else {
                out.push(Err(format!("GPU {i}: NVML gives no UUID for it")));
                continue;
            };
            let mig = match mig {
                None => MigMode::Off,
                Some(f) => {
                    let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
                    // SAFETY: a device handle and valid out-pointers.
                    match unsafe { f(dev, &mut current, &mut pending) } {
                        NVML_SUCCESS if current == 0 => MigMode::Off,
                        NVML_SUCCESS => MigMode::On,
                        NVML_ERROR_NOT_SUPPORTED => MigMode::Off,
                        _ => MigMode::Unknown,
                    }
                }
            };
            out.push(Ok(Entry {
                uuid: u,
                name: name.and_then(|f| device_text(f, dev)),
                mig,
            }));
        }
        Some(out)
    }

    /// Every GPU: (UUID, name), or `None` when NVML cannot say for sure
    /// (a call failed, or a GPU is in MIG mode).
    fn gpus(&self) -> Option<Vec<(String, Option<String>)>> {
        self.entries()?
            .into_iter()
            .map(|e| {
                e.ok()
                    .filter(|e| e.mig == MigMode::Off)
                    .map(|e| (e.uuid, e.name))
            })
            .collect()
    }
}

/// Whether a GPU is in MIG mode (`Unknown`: NVML would not say).
#[derive(Clone, Copy, PartialEq, Eq)]
enum MigMode {
    Off,
    On,
    Unknown,
}

/// One GPU as NVML lists it.
struct Entry {
    uuid: String,
    name: Option<String>,
    mig: MigMode,
}

/// An NVML session for the device plugin: the GPUs with their memory, and
/// whether each is still there.
pub struct Inventory(Nvml);

/// `nvmlMemory_t`.
#[repr(C)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlEventData_t`.
#[repr(C)]
struct NvmlEventData {
    device: *mut c_void,
    event_type: u64,
    event_data: u64,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

/// `nvmlEventTypeXidCriticalError`.
const XID_CRITICAL: u64 = 0x8;

/// An NVML event set with GPUs registered for Xid errors.
pub struct XidWatch {
    set: *mut c_void,
    /// The device handles, in the order of the UUIDs registered.
    devices: Vec<*mut c_void>,
}

impl Inventory {
    /// An event set on which the GPUs `uuids` report Xid errors; `None`
    /// when NVML has no events or none of them can register (then only
    /// `memory` tells health).
    pub fn xid_watch(&self, uuids: &[String]) -> Option<XidWatch> {
        type Create = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
        type Register = unsafe extern "C" fn(*mut c_void, u64, *mut c_void) -> c_int;
        type ByUuid = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
        // SAFETY: each type is the nvml.h signature of the function named.
        let (create, register, by_uuid) = unsafe {
            (
                self.0.func::<Create>(c"nvmlEventSetCreate")?,
                self.0.func::<Register>(c"nvmlDeviceRegisterEvents")?,
                self.0.func::<ByUuid>(c"nvmlDeviceGetHandleByUUID")?,
            )
        };
        let mut set: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        if unsafe { create(&mut set) } != NVML_SUCCESS {
            return None;
        }
        let mut devices = Vec::new();
        let mut any = false;
        for u in uuids {
            let text = std::ffi::CString::new(u.as_str()).ok()?;
            let mut dev: *mut c_void = std::ptr::null_mut();
            // SAFETY: a NUL-terminated UUID and a valid out-pointer.
            if unsafe { by_uuid(text.as_ptr(), &mut dev) } != NVML_SUCCESS {
                dev = std::ptr::null_mut();
            }
            // SAFETY: a device handle from NVML and our set.
            if !dev.is_null() && unsafe { register(dev, XID_CRITICAL, set) } == NVML_SUCCESS {
                any = true;
            }
            devices.push(dev);
        }
        any.then_some(XidWatch { set, devices })
    }

    /// Waits up to `timeout_ms` for an Xid error: the index (in the UUIDs
    /// given to `xid_watch`) of the GPU and the Xid; `None` at the timeout.
    pub fn wait_xid(&self, w: &XidWatch, timeout_ms: u32) -> Option<(usize, u64)> {
        type Wait = unsafe extern "C" fn(*mut c_void, *mut NvmlEventData, c_uint) -> c_int;
        // SAFETY: the nvml.h signature of nvmlEventSetWait_v2.
        let wait = unsafe { self.0.func::<Wait>(c"nvmlEventSetWait_v2")? };
        let mut data = NvmlEventData {
            device: std::ptr::null_mut(),
            event_type: 0,
            event_data: 0,
            gpu_instance: 0,
            compute_instance: 0,
        };
        // SAFETY: our event set and a valid out-pointer.
        if unsafe { wait(w.set, &mut data, timeout_ms) } != NVML_SUCCESS
            || data.event_type & XID_CRITICAL == 0
        {
            return None;
        }
        let i = w.devices.iter().position(|&d| d == data.device)?;
        Some((i, data.event_data))
    }

    /// NVML opened and started; `None` without it.
    pub fn open() -> Option<Inventory> {
        Nvml::open().map(Inventory)
    }

    /// Every GPU NVML lists, one by one: its UUID and memory in bytes, or
    /// why it cannot be served (a call failed, MIG mode); `None` when
    /// NVML cannot even count them.
    pub fn gpus(&self) -> Option<Vec<Result<(String, u64), String>>> {
        let entries = self.0.entries()?;
        Some(
            entries
                .into_iter()
                .map(|e| {
                    let e = e?;
                    if e.mig == MigMode::On {
                        return Err(format!(
                            "{}: in MIG mode, which the plugin does not serve",
                            e.uuid
                        ));
                    }
                    match self.memory(&e.uuid) {
                        Some(total) => Ok((e.uuid, total)),
                        None => Err(format!("{}: NVML cannot read its memory", e.uuid)),
                    }
                })
                .collect(),
        )
    }

    /// The driver's version, as NVML gives it (`580.95.05`).
    pub fn driver_version(&self) -> Option<String> {
        type Version = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;
        // SAFETY: the nvml.h signature of nvmlSystemGetDriverVersion.
        let f = unsafe { self.0.func::<Version>(c"nvmlSystemGetDriverVersion")? };
        let mut buf = [0 as c_char; 96];
        // SAFETY: the buffer and its own length.
        if unsafe { f(buf.as_mut_ptr(), 96) } != NVML_SUCCESS {
            return None;
        }
        buf[95] = 0;
        // SAFETY: NUL-terminated inside the buffer (set above).
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Some(text.to_string_lossy().into_owned())
    }

    /// The memory of the GPU `uuid`, asked through its UUID: `None` when
    /// NVML no longer finds it or cannot read it (a GPU fallen off the
    /// bus answers `NVML_ERROR_GPU_IS_LOST`).
    pub fn memory(&self, uuid: &str) -> Option<u64> {
        type ByUuid = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
        type Memory = unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> c_int;
        // SAFETY: each type is the nvml.h signature of the function named.
        let (by_uuid, memory) = unsafe {
            (
                self.0.func::<ByUuid>(c"nvmlDeviceGetHandleByUUID")?,
                self.0.func::<Memory>(c"nvmlDeviceGetMemoryInfo")?,
            )
        };
        let text = std::ffi::CString::new(uuid).ok()?;
        let mut dev: *mut c_void = std::ptr::null_mut();
        // SAFETY: a NUL-terminated UUID and a valid out-pointer.
        if unsafe { by_uuid(text.as_ptr(), &mut dev) } != NVML_SUCCESS {
            return None;
        }
        let mut m = NvmlMemory {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: a device handle from NVML and a valid out-pointer.
        (unsafe { memory(dev, &mut m) } == NVML_SUCCESS).then_some(m.total)
    }
}

/// A device's text from an NVML getter of the `(device, buffer, length)`
/// kind (UUID, name).
fn device_text(
    f: unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int,
    dev: *mut c_void,
) -> Option<String> {
    let mut buf = [0 as c_char; 128];
    // SAFETY: a device handle from NVML and the buffer's own length.
    if unsafe { f(dev, buf.as_mut_ptr(), 128) } != NVML_SUCCESS {
        return None;
    }
    buf[127] = 0;
    // SAFETY: NUL-terminated inside the buffer (set above).
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

impl Drop for Nvml {
    fn drop(&mut self) {
        type Shutdown = unsafe extern "C" fn() -> c_int;
        // SAFETY: nvmlShutdown(void), balancing our nvmlInit_v2; then our handle.
        unsafe {
            if let Some(f) = self.func::<Shutdown>(c"nvmlShutdown") {
                f();
            }
            libc::dlclose(self.handle);
        }
    }
}

/// Which of `machine`'s GPUs the process sees, in order, when that is
/// certain from `CUDA_VISIBLE_DEVICES` (`cvd`); `None` when it is not.
fn visible(machine: &[(String, Option<String>)], cvd: Option<&str>) -> Option<Vec<usize>> {
    let Some(cvd) = cvd else {
        return Some((0..machine.len()).collect());
    };
    let mut seen = Vec::new();
    for entry in cvd.split(',').map(str::trim) {
        let i = if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            entry.parse::<usize>().ok().filter(|&i| i < machine.len())?
        } else if entry.len() > 4
            && entry
                .get(..4)
                .is_some_and(|p| p.eq_ignore_ascii_case("gpu-"))
        {
            let e = entry.to_ascii_lowercase();
            let mut hits = machine
                .iter()
                .enumerate()
                .filter(|(_, (u, _))| u.to_ascii_lowercase().starts_with(&e));
            let (i, _) = hits.next()?;
            if hits.next().is_some() {
                return None;
            }
            i
        } else {
            return None;
        };
        if seen.contains(&i) {
            return None;
        }
        seen.push(i);
    }
    Some(seen)
}

/// Checks `spec`'s device keys (module docs): `Err` is the line to print.
pub fn check_limit_keys(spec: &LimitSpec, text: &str) -> Result<(), String> {
    if spec.entries.is_empty() {
        return Ok(());
    }
    let Some(machine) = Nvml::open().and_then(|n| n.gpus()) else {
        return Ok(());
    };
    if machine.is_empty() {
        return Ok(());
    }
    let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let order = visible(&machine, cvd.as_deref());
    let mut gpus: Vec<Gpu> = Vec::new();
    for (k, &i) in order.iter().flatten().enumerate() {
        let (uuid, name) = &machine[i];
        gpus.push(Gpu {
            index: u32::try_from(k).ok(),
            uuid: Some(uuid.clone()),
            name: name.clone(),
        });
    }
    for (i, (uuid, name)) in machine.iter().enumerate() {
        if !order.as_ref().is_some_and(|o| o.contains(&i)) {
            gpus.push(Gpu {
                index: None,
                uuid: Some(uuid.clone()),
                name: name.clone(),
            });
        }
    }
    // Index keys are judged only when the visible devices are certain.
    let count = match &order {
        Some(o) => u32::try_from(o.len()).unwrap_or(u32::MAX),
        None => u32::MAX,
    };
    spec.check_keys(text, count, &gpus)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::visible;

    #[test]
    fn visible_devices_only_when_certain() {
        let m: Vec<(String, Option<String>)> = (0..3)
            .map(|i| (format!("GPU-5ca1ab1e-0000-4000-8000-{i:012x}"), None))
            .collect();
        assert_eq!(visible(&m, None), Some(vec![0, 1, 2]));
        assert_eq!(visible(&m, Some("2,0")), Some(vec![2, 0]));
        assert_eq!(
            visible(&m, Some("GPU-5ca1ab1e-0000-4000-8000-000000000001")),
            Some(vec![1])
        );
        for unsure in ["", "0,0", "3", "GPU-5ca1", "MIG-abc", "0,x", "0,,1", "aéé"] {
            assert_eq!(visible(&m, Some(unsure)), None, "{unsure:?}");
        }
    }
}
