//! Parking's calls into the real libraries ([`Checkpointing`] for
//! [`RealDriver`]): the driver's `cuCheckpointProcess*` on this process's
//! own PID, with zeroed 64-byte argument structs (every field but Lock's
//! timeout is reserved and must be zero), and the GPUs' free memory from
//! `nvidia-smi`, a process of its own: measured on the H200 (r580), NVML
//! calls in a checkpointed process wait for its restore, as CUDA's do, so
//! the resume's room check asked in-process never came back.
//! The checkpoint functions are resolved from the real driver by `dlsym`
//! (never hooked); a driver without them answers `None`.

use std::ffi::c_void;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vramcap_core::exe::{is_executable, on_path};

use super::driver::RealDriver;
use super::hooks::calls as c;
use crate::engine::driver::{Checkpoint, Checkpointing};
use crate::ffi::CUresult;

impl Checkpointing for RealDriver {
    fn has_checkpoint_api(&self) -> bool {
        c::cuCheckpointProcessLock::SLOT.get().is_some()
            && c::cuCheckpointProcessCheckpoint::SLOT.get().is_some()
            && c::cuCheckpointProcessRestore::SLOT.get().is_some()
            && c::cuCheckpointProcessUnlock::SLOT.get().is_some()
    }

    fn checkpoint(&self, step: Checkpoint) -> Option<CUresult> {
        // The args structs (`CUcheckpointLockArgs` and friends) are 64
        // bytes; Lock's first 32-bit word is its timeout in milliseconds.
        let mut args = [0u64; 8];
        if let Checkpoint::Lock(ms) = step {
            args[0] = u64::from(ms);
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let a = args.as_mut_ptr().cast::<c_void>();
        let slot_there = match step {
            Checkpoint::Lock(_) => c::cuCheckpointProcessLock::SLOT.get().is_some(),
            Checkpoint::Save => c::cuCheckpointProcessCheckpoint::SLOT.get().is_some(),
            Checkpoint::Restore => c::cuCheckpointProcessRestore::SLOT.get().is_some(),
            Checkpoint::Unlock => c::cuCheckpointProcessUnlock::SLOT.get().is_some(),
        };
        if !slot_there {
            return None;
        }
        // SAFETY: the PID is this process's and `args` is a zeroed struct
        // of the size the driver reads, alive across the call.
        let rc = unsafe {
            match step {
                Checkpoint::Lock(_) => c::cuCheckpointProcessLock::call(pid, a),
                Checkpoint::Save => c::cuCheckpointProcessCheckpoint::call(pid, a),
                Checkpoint::Restore => c::cuCheckpointProcessRestore::call(pid, a),
                Checkpoint::Unlock => c::cuCheckpointProcessUnlock::call(pid, a),
            }
        };
        Some(rc)
    }

    fn current_free(&self) -> Option<u64> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two writable words, the real function's contract.
        let rc = unsafe { super::hooks::real::cuMemGetInfo_v2::call(&mut free, &mut total) };
        (rc == crate::ffi::CUDA_SUCCESS).then_some(free as u64)
    }

    fn gpu_free(&self) -> Result<Vec<(String, u64)>, String> {
        let smi =
            nvidia_smi().ok_or("no nvidia-smi on PATH, in /usr/local/nvidia/bin or /usr/bin")?;
        let shown = smi.display();
        // Without the shim, or, where it is preloaded all the same
        // (/etc/ld.so.preload), with its NVML hooks answering the driver's
        // figures: the capped picture could keep the process parked.
        let mut child = Command::new(&smi)
            .args(QUERY)
            .env_remove("LD_PRELOAD")
            .env(vramcap_core::settings::FREE_PROBE_VAR, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{shown}: {e}"))?;
        let deadline = Instant::now() + SMI_TIMEOUT;
        let read = child
            .stdout
            .take()
            .ok_or_else(|| format!("{shown}: no output pipe"))
            .and_then(|out| read_until(out, deadline).map_err(|e| format!("{shown}: {e}")));
        // Its status: waited for up to the deadline; a program that ignores
        // SIGCHLD or reaps every child itself leaves none to read (ECHILD),
        // and the output then speaks for it.
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if read.is_ok() && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "{shown} gave no answer within {}s",
                        SMI_TIMEOUT.as_secs()
                    ));
                }
                Err(_) => break None,
            }
        };
        let text = read?;
        match status {
            Some(st) if !st.success() => Err(format!("{shown} failed ({st})")),
            _ => Ok(parse_free(&text)),
        }
    }
}

/// Reads `out` to its end, or fails at `deadline`.
fn read_until(mut out: std::process::ChildStdout, deadline: Instant) -> Result<String, String> {
    let fd = out.as_raw_fd();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no answer within {}s", SMI_TIMEOUT.as_secs()));
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the pipe we own.
        let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(1000) as i32) };
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("poll: {}", std::io::Error::last_os_error()));
        }
        if r <= 0 {
            continue;
        }
        match out.read(&mut buf) {
            Ok(0) => return Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Ok(n) if bytes.len() + n > SMI_MOST => {
                return Err(format!("answered more than {} KiB", SMI_MOST >> 10));
            }
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// What the shim asks nvidia-smi (its output: "UUID, FREE_MIB" per GPU).
const QUERY: [&str; 2] = [
    "--query-gpu=uuid,memory.free",
    "--format=csv,noheader,nounits",
];

/// The most of nvidia-smi's answer read (a line per GPU is under 64
/// bytes): a program that streams more is no answer.
const SMI_MOST: usize = 64 << 10;

/// How long nvidia-smi may take (it answers in well under a second).
const SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// nvidia-smi: the first on `PATH`, else where drivers and the container
/// toolkit put it.
fn nvidia_smi() -> Option<PathBuf> {
    on_path("nvidia-smi").or_else(|| {
        ["/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi"]
            .map(PathBuf::from)
            .into_iter()
            .find(|p| is_executable(p))
    })
}

/// The query's lines as (UUID, free bytes); lines that are not "UUID, MiB"
/// are left out (a GPU missing from the answer counts as unmeasured).
fn parse_free(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let (uuid, mib) = l.split_once(',')?;
            let mib: u64 = mib.trim().parse().ok()?;
            let bytes = mib.checked_mul(1 << 20)?;
            let uuid = uuid.trim();
            uuid.starts_with("GPU-").then(|| (uuid.to_string(), bytes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_answer_is_read_per_uuid_in_bytes_and_nothing_else() {
        let text = "GPU-27481582-2742-e70a-d06f-00495aa6779c, 142511\nGPU-5ca1ab1e-0000-4000-8000-000000000001, [N/A]\n\nNo devices were found\nGPU-5ca1ab1e-0000-4000-8000-000000000002, 17592186044416\n";
        assert_eq!(
            super::parse_free(text),
            vec![(
                "GPU-27481582-2742-e70a-d06f-00495aa6779c".to_string(),
                142_511 << 20
            )]
        );
    }
}
