//! The handful of CUDA driver and NVML types and codes the shim needs,
//! spelled as in `cuda.h` (CUDA 13.0) and `nvml.h`. Defined here rather than
//! taken from cudarc's bindings to keep the shim's build small; the values
//! are ABI and fixed.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type nvmlReturn_t = c_int;
pub type nvmlDevice_t = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUmemLocation {
    pub kind: c_int,
    pub id: c_int,
}

pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;

/// `CUmemAllocationProp` up to its location (the rest is not read).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
}

/// The whole `CUmemAllocationProp`, for the allocations the engine makes.
#[repr(C)]
pub struct CUmemAllocationPropFull {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_metadata: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;

impl CUmemAccessDesc {
    /// Read-write access for `device`.
    pub fn read_write(device: CUdevice) -> CUmemAccessDesc {
        CUmemAccessDesc {
            location: CUmemLocation {
                kind: CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        }
    }
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Default)]
pub struct CUDA_ARRAY_MEMORY_REQUIREMENTS {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `CUuuid`: 16 raw bytes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

impl CUuuid {
    /// The `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` form nvidia-smi prints.
    pub fn write_canonical(&self, out: &mut [u8; 40]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out[..4].copy_from_slice(b"GPU-");
        let mut o = 4;
        for (i, b) in self.bytes.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                out[o] = b'-';
                o += 1;
            }
            out[o] = HEX[usize::from(b >> 4)];
            out[o + 1] = HEX[usize::from(b & 15)];
            o += 2;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_text() {
        let u = super::CUuuid {
            bytes: [
                0x5c, 0xa1, 0xab, 0x1e, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1,
            ],
        };
        let mut out = [0u8; 40];
        u.write_canonical(&mut out);
        assert_eq!(&out, b"GPU-5ca1ab1e-0000-4000-8000-000000000001");
    }
}

/// A stream-ordered memory pool.
pub type CUmemoryPool = *mut c_void;
/// An instantiated graph.
pub type CUgraphExec = *mut c_void;

/// `CUmemPool_attribute` values the engine reads (all `cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;

/// `CUgraphMem_attribute` values the engine reads (all `cuuint64_t`).
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_int = 0;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// `CUmemPoolProps` up to its location (the rest is not read).
#[repr(C)]
pub struct CUmemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
}

/// `nvmlProcessInfo_t` (the v2 layout, which `_v3` of the process queries fills).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// A graph (not instantiated).
pub type CUgraph = *mut c_void;
/// A node of a graph.
pub type CUgraphNode = *mut c_void;

/// `CUgraphNodeType` values the engine looks for.
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_int = 0;
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_int = 4;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
pub const CU_GRAPH_NODE_TYPE_CONDITIONAL: c_int = 13;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1): the pool's properties (88 bytes),
/// the access descriptors, the size and the address the driver chose.
#[repr(C)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub pool_props: [u64; 11],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (CUDA 12.0): a kernel node's function
/// (or, when that is null, its `CUkernel`), launch shape and parameters;
/// v1 is the same without the last two fields.
#[repr(C)]
pub struct CUDA_KERNEL_NODE_PARAMS {
    pub func: *mut c_void,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: *mut c_void,
    pub ctx: *mut c_void,
}

const _: () = {
    assert!(std::mem::size_of::<CUDA_KERNEL_NODE_PARAMS>() == 72);
    assert!(std::mem::offset_of!(CUDA_KERNEL_NODE_PARAMS, kernel_params) == 40);
    assert!(std::mem::offset_of!(CUDA_KERNEL_NODE_PARAMS, kern) == 56);
};

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`: flags, upload stream, and two outputs.
#[repr(C)]
pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
    pub flags: u64,
    pub upload_stream: CUstream,
    pub err_node_out: CUgraphNode,
    pub result_out: c_int,
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`: the graph is uploaded as it is instantiated.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
/// `CUgraphInstantiateResult`: the instantiation failed.
pub const CUDA_GRAPH_INSTANTIATE_ERROR: c_int = 1;

/// `CU_STREAM_NON_BLOCKING` (`CUstream_flags`): a stream the legacy stream
/// does not wait for, nor it for the legacy stream.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DISABLE_TIMING` (`CUevent_flags`).
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
