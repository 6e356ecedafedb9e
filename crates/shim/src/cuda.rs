//! The handful of CUDA driver types and codes the shim needs, spelled as in
//! `cuda.h` (CUDA 13.0). Defined here rather than taken from cudarc's
//! bindings to keep the shim's build small; the values are ABI and fixed.

#![allow(non_camel_case_types)]

use std::ffi::c_int;

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;

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
