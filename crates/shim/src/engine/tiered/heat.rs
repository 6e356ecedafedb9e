//! Heat from launches: the parameter layouts of launched functions, the
//! decoding of a launch's parameters into the words that name tiered
//! blocks, and what a matrix product's use weighs.

#[allow(unused_imports)]
use super::*;

/// What the engine knows of a launched function: its parameters' (offset,
/// size), `None` when the driver would not say; and what one use by it
/// weighs.
pub(super) struct Kernel {
    pub(super) params: Option<Box<[(u32, u32)]>>,
    pub(super) weight: u32,
}

pub(super) type Layout = Arc<Kernel>;

/// What a use by a matrix product or convolution weighs against one by
/// any other kernel. Such kernels read their operands many times over
/// (once per tile), so an operand in host memory costs them many trips
/// over the link, where an element-wise kernel reads it once.
pub const PRODUCT_WEIGHT: u32 = 32;

/// Whether a kernel's (mangled) name is that of a matrix product or a
/// convolution, by the words cuBLAS, CUTLASS, cuDNN and Triton put there.
pub fn is_product(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "gemm",
        "gemv",
        "xmma",
        "cutlass",
        "convolve",
        "convolution",
        "fprop",
        "dgrad",
        "wgrad",
        "matmul",
        "_mm_",
    ]
    .iter()
    .any(|w| n.contains(w))
}

impl Tiers {
    /// The parameter layout of `func`, asked of the driver once.
    pub(super) fn layout<D: Driver>(&self, driver: &D, func: usize) -> Layout {
        if let Some(l) = read!(self.layouts).get(&func) {
            return l.clone();
        }
        let mut params = Vec::new();
        while params.len() < 4096 {
            match driver.param_info(func, params.len()) {
                Ok((off, size)) => params.push((off as u32, size as u32)),
                Err(_) => break,
            }
        }
        let weight = match driver.func_name(func) {
            Some(n) if is_product(&n) => PRODUCT_WEIGHT,
            _ => 1,
        };
        let l: Layout = Arc::new(Kernel {
            params: (!params.is_empty()).then(|| params.into()),
            weight,
        });
        if l.params.is_none() {
            log_once!(
                Info,
                "tiered spill: the driver gives no parameter layout for some kernels (cuFuncGetParamInfo); their launches do not count as uses"
            );
        }
        let mut layouts = write!(self.layouts);
        if layouts.len() >= MAX_LAYOUTS {
            layouts.clear();
        }
        layouts.insert(func, l.clone());
        l
    }

    /// A kernel launch: counts a use of every tiered block a parameter word
    /// points into.
    ///
    /// # Safety
    /// `params` and `extra` are what the program passed to a launch: null,
    /// or as the driver's launch functions require.
    pub unsafe fn note_launch<D: Driver>(
        &self,
        driver: &D,
        func: usize,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        let (lo, hi) = self.span();
        if lo >= hi || func == 0 {
            return;
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        let kernel = self.layout(driver, func);
        let mut words: [u64; 64] = [0; 64];
        let mut n = 0usize;
        let mut hits = 0u64;
        // Issue 44's record, at debug level only (it allocates per launch).
        let mut used = self.recording.load(Ordering::Relaxed).then(Vec::<u64>::new);
        // SAFETY: the caller's contract.
        unsafe {
            scan(&kernel, params, extra, lo, hi, |w| {
                words[n] = w;
                n += 1;
                if n == words.len() {
                    hits += self.note_words(&words, kernel.weight, used.as_mut());
                    n = 0;
                }
            })
        };
        if n > 0 {
            hits += self.note_words(&words[..n], kernel.weight, used.as_mut());
        }
        if hits > 0 {
            self.hits.fetch_add(hits, Ordering::Relaxed);
        }
        if let Some(mut u) = used {
            u.sort_unstable();
            u.dedup();
            let mut t = self.trace.lock().unwrap_or_else(|e| e.into_inner());
            if t.len() == TRACE_LAUNCHES {
                t.pop_front();
            }
            t.push_back(super::phases::Launched {
                kernel: func as u64,
                blocks: u.into_boxed_slice(),
            });
        }
    }

    /// Starts or stops issue 44's record (the log at debug level).
    pub fn record(&self, on: bool) {
        self.recording.store(on, Ordering::Relaxed);
    }

    /// The launches recorded, oldest first.
    pub(in crate::engine) fn recorded(&self) -> Vec<super::phases::Launched> {
        let t = self.trace.lock().unwrap_or_else(|e| e.into_inner());
        t.iter().cloned().collect()
    }

    /// The lowest start and highest end of any block ever made.
    pub(super) fn span(&self) -> (u64, u64) {
        (
            self.lo.load(Ordering::Relaxed),
            self.hi.load(Ordering::Relaxed),
        )
    }

    /// A use of `weight` of every block a word points into: how many did;
    /// their starts go to `used` when it is given.
    pub(super) fn note_words(
        &self,
        words: &[u64],
        weight: u32,
        mut used: Option<&mut Vec<u64>>,
    ) -> u64 {
        let map = read!(self.blocks);
        words
            .iter()
            .filter_map(|&w| note_in(&map, w, weight))
            .inspect(|&start| {
                if let Some(u) = used.as_deref_mut() {
                    u.push(start);
                }
            })
            .count() as u64
    }

    /// Modules or libraries were unloaded: their functions' handles may
    /// come back for other functions, so every layout is asked again.
    pub fn forget_layouts(&self) {
        write!(self.layouts).clear();
    }
}

/// A use of `weight` of the block of `map` that `w` points into, if any:
/// that block's start.
pub(super) fn note_in(map: &BTreeMap<u64, Arc<TierBlock>>, w: u64, weight: u32) -> Option<u64> {
    let b = block_at(map, w)?;
    b.note(w - b.ptr, weight);
    Some(b.ptr)
}

/// Calls `each` with every 8-byte word in `[lo, hi)` of a launch's
/// parameters: those the layout of `kernel` gives (`params`), or the
/// `extra` buffer whole; at most [`SCAN_BYTES`] of them.
///
/// # Safety
/// `params` and `extra` are a launch's: null, or as the driver's launch
/// functions require.
pub(super) unsafe fn scan(
    kernel: &Kernel,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    lo: u64,
    hi: u64,
    mut each: impl FnMut(u64),
) {
    let mut push = |w: u64| {
        if w >= lo && w < hi {
            each(w);
        }
    };
    if !params.is_null() {
        let Some(layout) = kernel.params.as_deref() else {
            return;
        };
        let mut budget = SCAN_BYTES;
        for (i, &(_, size)) in layout.iter().enumerate() {
            let size = size as usize;
            if size < 8 {
                continue;
            }
            // SAFETY: the launch passes one pointer per parameter.
            let p = unsafe { *params.add(i) } as *const u8;
            if p.is_null() {
                continue;
            }
            let take = size.min(budget);
            budget -= take;
            for k in 0..take / 8 {
                // SAFETY: parameter i holds `size` bytes at `p`.
                push(unsafe { p.add(k * 8).cast::<u64>().read_unaligned() });
            }
            if budget == 0 {
                break;
            }
        }
    } else if !extra.is_null() {
        let (mut buf, mut len) = (std::ptr::null::<u8>(), 0usize);
        let mut i = 0;
        while i < 64 {
            // SAFETY: `extra` is a key/value list ending in CU_LAUNCH_PARAM_END.
            let key = unsafe { *extra.add(i) } as usize;
            if key == CU_LAUNCH_PARAM_END {
                break;
            }
            // SAFETY: as above: every key but the end has a value.
            let value = unsafe { *extra.add(i + 1) };
            match key {
                CU_LAUNCH_PARAM_BUFFER_POINTER => buf = value as *const u8,
                CU_LAUNCH_PARAM_BUFFER_SIZE if !value.is_null() => {
                    // SAFETY: the size's value points to a size_t.
                    len = unsafe { *(value as *const usize) }
                }
                _ => {}
            }
            i += 2;
        }
        if !buf.is_null() {
            for k in 0..len.min(SCAN_BYTES) / 8 {
                // SAFETY: the buffer holds `len` bytes.
                push(unsafe { buf.add(k * 8).cast::<u64>().read_unaligned() });
            }
        }
    }
}
