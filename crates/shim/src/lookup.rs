//! Which hooked variant a `cuGetProcAddress*` request is for, when the
//! driver hands back a pointer that is none of its exported symbols (its
//! internal entry points): by base name, `cudaVersion` and stream flavour.
//! Pure logic, used by the boundary's resolver and unit-tested here.
//!
//! Requests are matched by name only up to [`NAME_MATCH_MAX_VERSION`]: a
//! later major release may give a name a new signature, and a hook written
//! for the old one must not be handed out for it. Above it the resolver
//! (`boundary/resolve.rs`) asks the driver again at this version and hands
//! out a hook only for the same function.

use std::ffi::c_int;

/// Requests above this `cudaVersion` are never matched by name and version
/// here: only by pointer, or by the same pointer at this version.
pub const NAME_MATCH_MAX_VERSION: c_int = 13999;

/// `cuGetProcAddress` flags.
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// How `cuGetProcAddress*` callers reach a hooked variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// The base name callers ask for (`cuMemAlloc` for `cuMemAlloc_v2`);
    /// empty for functions the CUDA resolver never hands out (NVML's).
    pub base: &'static str,
    /// `cudaVersion` range `[since, until)` for which the driver answers a
    /// request for `base` with this variant.
    pub since: c_int,
    pub until: c_int,
    /// For functions with a per-thread-default-stream twin: whether this is
    /// the per-thread (`_ptsz`) variant. `None`: no twin, `flags` is moot.
    pub per_thread: Option<bool>,
    /// Another base name the driver answers with this variant, from a
    /// `cudaVersion` on (CUDA 12 answers `cuGraphInstantiate` with
    /// `cuGraphInstantiateWithFlags`); empty for none.
    pub also: (&'static str, c_int),
}

impl Lookup {
    /// Answered for `base` from CUDA version `since` on.
    pub const fn cuda(base: &'static str, since: c_int) -> Lookup {
        Lookup {
            base,
            since,
            until: c_int::MAX,
            per_thread: None,
            also: ("", 0),
        }
    }

    /// Not a CUDA driver function: only `dlsym` answers it.
    pub const NVML: Lookup = Lookup {
        base: "",
        since: 0,
        until: 0,
        per_thread: None,
        also: ("", 0),
    };

    /// ... and no longer from CUDA version `until` on.
    pub const fn until(self, until: c_int) -> Lookup {
        Lookup { until, ..self }
    }

    /// ... and for `base` too, from CUDA version `since` on.
    pub const fn also(self, base: &'static str, since: c_int) -> Lookup {
        Lookup {
            also: (base, since),
            ..self
        }
    }

    /// The legacy-stream variant of a pair.
    pub const fn legacy_stream(self) -> Lookup {
        Lookup {
            per_thread: Some(false),
            ..self
        }
    }

    /// The per-thread-default-stream (`_ptsz`) variant of a pair.
    pub const fn per_thread_stream(self) -> Lookup {
        Lookup {
            per_thread: Some(true),
            ..self
        }
    }

    /// Whether a request for `name` at `cuda_version` with `flags` is
    /// answered with this variant.
    pub fn answers(&self, name: &[u8], cuda_version: c_int, flags: u64) -> bool {
        if self.base.is_empty() || cuda_version > NAME_MATCH_MAX_VERSION {
            return false;
        }
        let flavour_ok = match self.per_thread {
            None => true,
            Some(true) => flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
            // With the default flags the driver picks by how the caller was
            // built, which the shim cannot know: no substitution by name then.
            Some(false) => flags == CU_GET_PROC_ADDRESS_LEGACY_STREAM,
        };
        let by_base =
            self.base.as_bytes() == name && (self.since..self.until).contains(&cuda_version);
        let (also, from) = self.also;
        let by_also = !also.is_empty() && also.as_bytes() == name && cuda_version >= from;
        (by_base || by_also) && flavour_ok
    }
}

/// The index of the first of `lookups` that answers the request.
pub fn by_name<'a>(
    lookups: impl IntoIterator<Item = &'a Lookup>,
    name: &[u8],
    cuda_version: c_int,
    flags: u64,
) -> Option<usize> {
    lookups
        .into_iter()
        .position(|l| l.answers(name, cuda_version, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: [Lookup; 6] = [
        Lookup::cuda("cuGetProcAddress", 11030).until(12000),
        Lookup::cuda("cuGetProcAddress", 12000),
        Lookup::cuda("cuMemAlloc", 3020),
        Lookup::cuda("cuStreamBeginCapture", 10000)
            .until(10010)
            .legacy_stream(),
        Lookup::cuda("cuStreamBeginCapture", 10010).legacy_stream(),
        Lookup::cuda("cuStreamBeginCapture", 10010).per_thread_stream(),
    ];

    #[test]
    fn versions_pick_the_variant_of_their_range() {
        let find = |n: &str, v, f| by_name(&LIST, n.as_bytes(), v, f);
        assert_eq!(find("cuGetProcAddress", 11030, 0), Some(0));
        assert_eq!(find("cuGetProcAddress", 11999, 0), Some(0));
        assert_eq!(find("cuGetProcAddress", 12000, 0), Some(1));
        assert_eq!(find("cuGetProcAddress", 13000, 0), Some(1));
        assert_eq!(find("cuGetProcAddress", 11020, 0), None);
        assert_eq!(find("cuMemAlloc", 3020, 0), Some(2));
        assert_eq!(find("cuMemAlloc", 3010, 0), None);
        assert_eq!(find("cuMemAllocX", 12000, 0), None);
    }

    #[test]
    fn beyond_the_known_major_versions_nothing_matches_by_name() {
        let find = |v| by_name(&LIST, b"cuMemAlloc", v, 0);
        assert_eq!(find(NAME_MATCH_MAX_VERSION), Some(2));
        assert_eq!(find(NAME_MATCH_MAX_VERSION + 1), None);
        assert_eq!(find(c_int::MAX), None);
    }

    #[test]
    fn stream_twins_match_only_with_explicit_flags() {
        let find = |v, f| by_name(&LIST, b"cuStreamBeginCapture", v, f);
        // Default flags: the driver decides by how the caller was built.
        assert_eq!(find(12000, 0), None);
        assert_eq!(find(12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM), Some(4));
        assert_eq!(
            find(12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            Some(5)
        );
        assert_eq!(find(10000, CU_GET_PROC_ADDRESS_LEGACY_STREAM), Some(3));
        assert_eq!(
            find(10000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            None
        );
    }

    #[test]
    fn a_second_name_is_answered_from_its_version() {
        let l = [
            Lookup::cuda("cuGraphInstantiate", 11000).until(12000),
            Lookup::cuda("cuGraphInstantiateWithFlags", 11040).also("cuGraphInstantiate", 12000),
        ];
        let find = |n: &str, v| by_name(&l, n.as_bytes(), v, 0);
        assert_eq!(find("cuGraphInstantiate", 11080), Some(0));
        assert_eq!(find("cuGraphInstantiate", 12000), Some(1));
        assert_eq!(find("cuGraphInstantiate", 13000), Some(1));
        assert_eq!(find("cuGraphInstantiateWithFlags", 11040), Some(1));
        assert_eq!(find("cuGraphInstantiateWithFlags", 11030), None);
        assert_eq!(find("cuGraphInstantiate", NAME_MATCH_MAX_VERSION + 1), None);
    }

    #[test]
    fn nvml_functions_are_never_answered_by_the_cuda_resolver() {
        assert!(!Lookup::NVML.answers(b"", 12000, 0));
        assert!(!Lookup::NVML.answers(b"nvmlDeviceGetMemoryInfo", 12000, 0));
    }
}
