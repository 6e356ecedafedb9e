//! Parking (issues 34 and 43; docs/design/parking.md,
//! docs/design/fast-parking.md): the process moves its own device memory
//! to host memory and releases its budget (own and group), then comes
//! back when asked or when the program calls CUDA again
//! ([`gate`](crate::process::gate)). `VRAMCAP_PARK_MOVE` says how: the
//! shim's moves (the default), then the driver's checkpoint of the rest,
//! or the driver's checkpoint alone.
//!
//! - A part: [`Park`] is its state, [`Parking`] its methods, which see
//!   that state and the accounting's foundation (`Accounting`: the driver, the
//!   settings, the page, the budgets) and nothing else of the engine; the
//!   engine hands in what it needs of the other parts (what the records
//!   hold, the cache's emptying) as [`Parking`]'s two closures
//!   (`engine/mod.rs`, [`Engine::parking`](crate::engine::Engine)).
//! - With `VRAMCAP_PARK_MOVE=shim` (the default) a park moves the
//!   process's blocks to host memory through tiered spill's moves (handed
//!   in) instead of the driver's checkpoint; the moves release and reserve their own bytes,
//!   so `Park::parked` stays 0 and the page's `parked` words say what
//!   moved (`steps.rs`, `move_and_release`, `move_back`). With
//!   `shim+checkpoint` the driver's checkpoint then takes the rest:
//!   `Park::parked` holds the rest's bytes, the page's words the sum; a
//!   resume restores the rest first, then moves the blocks back
//!   (`move_then_checkpoint`, `reserve_and_restore`).
//! - Everything happens on the background thread ([`Parking::park_round`],
//!   each tick): the page's requests (`vramcap park`/`resume`, a group
//!   member's policy), transparent resumes asked by the gate, the activity
//!   stamp. The checkpoint calls are made by that one thread.
//! - **Invariant:** while the state is not `Running`, the ledgers (the
//!   page's `used`, the group member's ledger) hold none of the parked
//!   bytes, [`Park::parked`] holds them exactly, and no program thread is
//!   inside a hooked export ([`gate::INSIDE`] is 0 with the gate closed),
//!   so nothing else moves those ledgers.
//! - A resume reserves the parked bytes through the allocations' path
//!   (`reserve_on`; a transparent one refused by the group parks an idle
//!   member first, as an allocation does: `policy.rs`) and, before a
//!   Restore, checks the real free memory (nvidia-smi, in a child);
//!   Restore is never called without both. The shim's moves back give
//!   each block device memory before any copy. A
//!   just-resumed process counts as active (its `last_activity` is set). A failed Restore leaves the process
//!   `Failed` (the driver holds it stuck): never retried.
//! - Locks: the gate's mutex (`process/gate.rs`), taken alone, only to change the
//!   state or wait for it. See engine/mod.rs for the order.

pub(in crate::engine) mod policy;
mod steps;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use vramcap_core::mailbox::{Mailbox, take_park};
use vramcap_core::park::{Ask, Outcome, PARK_DEVICES, ParkMode, ParkMove};

use vramcap_core::settings::Settings;

use crate::engine::accounting::Refusal;
use crate::engine::accounting::page::now_unix_ns;
use crate::engine::accounting::state::Accounting;
use crate::engine::driver::Driver;
use crate::log::log_at;
use crate::process::gate;

/// Parking's own state (one per engine).
pub struct Park {
    /// The bytes parked per device, exactly what was released.
    parked: [AtomicU64; PARK_DEVICES],
    /// A transparent resume holds its reservation while it waits for room.
    reserved: AtomicBool,
    /// The "waiting for room" line was said for this parking.
    said_waiting: AtomicBool,
    /// A VMM allocation was exported as a shareable handle (another
    /// process may map it): such a process is not parked.
    vmm_exported: AtomicBool,
    /// The policy's asks repeat each tick: the last refusal said to one
    /// (`Outcome::word` + 1; 0 none), and as the asker the last member
    /// and answer said (`pid << 32 | code`; 0 none), so each is said once
    /// in a row.
    said_refusal: AtomicU64,
    said_asked: AtomicU64,
    /// When the GPUs' free memory was last found short (unix ns; 0 never)
    /// and on which device: measuring takes another process, so a waiting
    /// resume measures again only a second later.
    short_at: AtomicU64,
    short_on: AtomicU64,
    /// The bytes that GPU was short of then.
    short_need: AtomicU64,
    /// The process's blocks are parked by the shim's own moves
    /// (`VRAMCAP_PARK_MOVE=shim` or `shim+checkpoint`).
    moved: AtomicBool,
    /// The driver's checkpoint holds the process (`checkpoint`, or the
    /// rest after the moves with `shim+checkpoint`): a resume restores
    /// and unlocks first.
    locked: AtomicBool,
}

/// What the engine's records hold that parking refuses (design item 4a).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    /// Managed memory is live.
    pub managed: bool,
    /// An allocation was exported over IPC.
    pub exported: bool,
}

/// Parking at work: its own state, the foundation it stands on, and what
/// the engine hands in of the other parts.
pub struct Parking<'a, D: Driver> {
    pub park: &'a Park,
    pub driver: &'a D,
    pub settings: &'a Settings,
    pub accounting: &'a Accounting<D>,
    /// What the records hold now (asked at each park request).
    pub records: &'a dyn Fn() -> Live,
    /// Empties the freed-block cache (at a park, once the gate is closed
    /// and the calls in flight are out): the bytes released.
    pub empty_cache: &'a dyn Fn() -> u64,
    /// `VRAMCAP_PARK_MOVE=shim`: moves the process's blocks to host memory
    /// (the bytes moved per device, released by the moves) and back
    /// (`Err(device)`: no room there for all of its blocks).
    pub move_out: &'a dyn Fn() -> [u64; PARK_DEVICES],
    pub move_in: &'a dyn Fn() -> Result<u64, (u16, u64, Option<Refusal>)>,
    /// Waits for every context the process has used to finish its work
    /// (bounded); false when it did not in time.
    pub sync_all: &'a dyn Fn() -> bool,
}

impl Park {
    pub fn new() -> Park {
        Park {
            parked: Default::default(),
            reserved: AtomicBool::new(false),
            said_waiting: AtomicBool::new(false),
            vmm_exported: AtomicBool::new(false),
            said_refusal: AtomicU64::new(0),
            said_asked: AtomicU64::new(0),
            short_at: AtomicU64::new(0),
            short_on: AtomicU64::new(0),
            short_need: AtomicU64::new(0),
            moved: AtomicBool::new(false),
            locked: AtomicBool::new(false),
        }
    }

    /// Notes a successful `cuMemExportToShareableHandle`.
    pub fn note_export(&self) {
        self.vmm_exported.store(true, Ordering::Relaxed);
    }
}

impl<D: Driver> Parking<'_, D> {
    /// The background thread's part, first in each round. True when the
    /// process is not running (parked, or stuck): the round then does no
    /// CUDA work.
    pub fn park_round(&self) -> bool {
        let settings = self.settings;
        let page = self.accounting.page().get(settings);
        let h = &page.header;
        // A call in flight (a synchronisation, a waiting allocation) is
        // activity too: such a process is not idle.
        if gate::ACTIVE.swap(false, Ordering::Relaxed) || gate::INSIDE.load(Ordering::Relaxed) > 0 {
            h.last_activity.store(now_unix_ns(), Ordering::Release);
        }
        let mailbox = Mailbox::park(h);
        if let Some(asked) = mailbox.pending() {
            let outcome = if settings.park.is_none() {
                Outcome::NotEnabled
            } else {
                // Taken: swapped to 0, so a reader that gave up waiting can
                // tell (its compare-and-swap back to 0 fails) whether it
                // withdrew its request in time (0 asks nothing).
                match take_park(h) {
                    Some(Ask::Park) => self.park_now(false),
                    Some(Ask::ParkIfIdle) if !self.idle_now() => Outcome::NotIdle,
                    Some(Ask::ParkIfIdle) => self.park_now(true),
                    Some(Ask::Resume) => self.resume_now(false),
                    // Withdrawn, or taken by the last answer (another
                    // asker's post raced it): nothing is done, and no
                    // asker may read "done".
                    None => Outcome::Withdrawn,
                }
            };
            h.park_outcome.store(outcome.word(), Ordering::Release);
            mailbox.answer(asked);
        }
        if gate::state() == gate::PARKED && gate::RESUME_WANTED.load(Ordering::SeqCst) {
            self.resume_now(true);
        }
        gate::state() != gate::RUNNING
    }

    /// Idle past its own `idle:T` now, by its own count (the policy's ask
    /// is checked here, where it cannot be stale): no program call inside
    /// the shim (an allocation waiting for room counts), none waiting at the
    /// gate, and no driver call for T (this round's stamp is written).
    fn idle_now(&self) -> bool {
        let Some(ParkMode::Idle(t)) = self.settings.park else {
            return false;
        };
        if gate::INSIDE.load(Ordering::SeqCst) > 0 || gate::WAITERS.load(Ordering::SeqCst) > 0 {
            return false;
        }
        let h = &self.accounting.page().get(self.settings).header;
        h.idle_ns(now_unix_ns()) >= t.as_nanos() as u64
    }

    /// Parks the process now (see the module docs), or says why not
    /// (`policy`: asked by a member's policy, which asks again each tick:
    /// the same refusal is said once in a row).
    fn park_now(&self, policy: bool) -> Outcome {
        match gate::state() {
            gate::RUNNING => {}
            gate::FAILED => return Outcome::Stuck(0),
            _ => return Outcome::Ok,
        }
        let outcome = match self.park_refusal() {
            Some(why) => why,
            None if self.settings.park_move == ParkMove::Shim => self.move_and_release(),
            // Measured before the lock, in this running process: a driver
            // without the checkpoint API is told as such first.
            None if !self.driver.has_checkpoint_api() => Outcome::NoCheckpointApi,
            None => match self.unmeasured() {
                Some(d) => Outcome::Unmeasured(d as u32),
                None if self.settings.park_move.moves_blocks() => self.move_then_checkpoint(),
                None => self.checkpoint_and_release(),
            },
        };
        let key = if outcome == Outcome::Ok {
            0
        } else {
            outcome.word().wrapping_add(1)
        };
        let last = self.park.said_refusal.swap(key, Ordering::Relaxed);
        if key != 0 && (last != key || !policy) {
            log_at!(Warn, "cannot park: {outcome}");
        }
        outcome
    }

    /// Resumes the process if it is parked. `transparent`: asked by a
    /// program thread at the gate (the reservation is kept while it waits
    /// for room, and it says so once); else asked by `vramcap resume`
    /// (one try: no room is the answer).
    fn resume_now(&self, transparent: bool) -> Outcome {
        match gate::state() {
            gate::PARKED => {}
            gate::FAILED => return Outcome::Stuck(0),
            _ => return Outcome::Ok,
        }
        match self.reserve_and_restore(transparent) {
            Ok(()) => Outcome::Ok,
            Err(o @ Outcome::NoRoom(d)) => {
                if transparent && !self.park.said_waiting.swap(true, Ordering::Relaxed) {
                    let since = self
                        .accounting
                        .page()
                        .get(self.settings)
                        .header
                        .parked_since
                        .load(Ordering::Relaxed);
                    let bytes = page_parked(self.accounting, self.settings, d as usize);
                    log_at!(
                        Warn,
                        "this process was parked {}s ago; waiting for {:.1} GiB on GPU {d} to resume",
                        now_unix_ns().saturating_sub(since) / 1_000_000_000,
                        bytes as f64 / (1u64 << 30) as f64
                    );
                }
                o
            }
            Err(o) => o,
        }
    }
}

/// The bytes parked on device `d` as the page says (moved by the shim, or
/// released at the driver's checkpoint).
fn page_parked<D: Driver>(
    accounting: &Accounting<D>,
    settings: &vramcap_core::settings::Settings,
    d: usize,
) -> u64 {
    accounting.page().get(settings).header.parked[d].load(Ordering::Relaxed)
}
