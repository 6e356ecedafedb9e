//! Membership of a `VRAMCAP_GROUP`: one budget per GPU shared with the
//! group's other processes (layout, protocol and its proof in
//! `vramcap_core::group`).
//!
//! - Joining happens on the first CUDA call that needs a cap: the group file
//!   `group-NAME.grp` in the statistics directory is opened, or created
//!   complete under a private name and linked into place (so 64 processes
//!   starting together see either no file or a whole one), and a member
//!   slot is claimed with its liveness lock held. A file of another layout
//!   version is refused with one line that names it and says what to do.
//!   No syscall is made on the allocation path after that.
//! - Reservations go to the group after the process's own budget (see
//!   `accounting::reserve_on`): an announcement in this member's ledger, a
//!   scan of the members' ledgers, a commit. A refusal because the group is
//!   full first reclaims members whose processes died, then retries once;
//!   one because another member's announcement was in the way is retried
//!   (yielding), reclaiming the dead after a few tries, for at most
//!   [`CONTENDED_FOR`], then refused. The background thread also reclaims
//!   dead members every half second. Reclaiming is one compare-and-swap per
//!   dead slot: nothing a dead process left is ever waited on. Joining
//!   allocates (paths, the limit text); the allocation path does not.
//! - At normal exit [`Membership::leave`] frees the slot, which gives every
//!   byte back at once; it first waits for this process's own group calls
//!   in flight (a few atomics each; threads may still run during exit), and
//!   nothing goes through the group after it.
//! - If the group cannot be joined (unusable directory, corrupt or
//!   other-layout file, all 1024 slots taken), the process refuses its
//!   allocations rather than run without the group's limit, and says why
//!   once.
//! - A child after fork joins as a member of its own (its new engine has a
//!   new [`Membership`]; the old one's descriptor is closed first, see
//!   [`Membership::forget_after_fork`]).

use std::ffi::CString;
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use vramcap_core::MAX_DEVICES;
use vramcap_core::group::{self, GROUP_HEADER_SIZE, GROUP_PAGE_SIZE, GroupPage, Refusal, Seat};
use vramcap_core::limit::{LimitSpec, parse_limit};
use vramcap_core::liveness::{ofd_lock, ofd_locked, start_time};
use vramcap_core::page::get_text;
use vramcap_core::settings::default_stats_dir;

use vramcap_core::settings::Settings;

use crate::engine::accounting::page::{
    create_private, cstring, errno_text, map_shared, now_unix_ns, prepare_dir,
};
use crate::ffi::CUdevice;
use crate::log::{log_at, log_once};

const UNTRIED: u8 = 0;
const JOINING: u8 = 1;
const JOINED: u8 = 2;
const FAILED: u8 = 3;
/// After `leave` at exit: the member's bytes went back; nothing more is
/// reserved or released through the group (the slot may be someone else's).
const LEFT: u8 = 4;

/// How long a reservation is retried while other members' announcements are
/// in the way before it is refused (they normally clear in microseconds; a
/// dead member's is reclaimed after [`RECLAIM_AFTER`] tries).
pub const CONTENDED_FOR: Duration = Duration::from_millis(20);
const RECLAIM_AFTER: u32 = 16;
/// How long leaving waits for this process's group calls in flight.
const LEAVE_WAIT: Duration = Duration::from_millis(100);

/// This process's membership of its `VRAMCAP_GROUP`, if it has one.
pub struct Membership {
    settings: &'static Settings,
    page: AtomicPtr<GroupPage>,
    state: AtomicU8,
    member: AtomicUsize,
    /// The owner word the slot was joined with (see `group::Seat`).
    owner: AtomicU64,
    /// This process's group calls in flight (`leave` waits for them).
    busy: AtomicUsize,
    /// The group file's descriptor, holding this member's liveness lock (-1: none).
    fd: AtomicI32,
    /// CUDA ordinal → group device entry + 1 (0: not attached yet).
    devices: [AtomicU8; MAX_DEVICES],
    /// The group's limit, once read; `None` when its recorded text does not
    /// parse (the member then refuses rather than run without it).
    spec: OnceLock<Option<LimitSpec>>,
    last_tick_ms: AtomicUsize,
}

impl Membership {
    pub fn new(settings: &'static Settings) -> Membership {
        Membership {
            settings,
            page: AtomicPtr::new(ptr::null_mut()),
            state: AtomicU8::new(UNTRIED),
            member: AtomicUsize::new(usize::MAX),
            owner: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            fd: AtomicI32::new(-1),
            devices: [const { AtomicU8::new(0) }; MAX_DEVICES],
            spec: OnceLock::new(),
            last_tick_ms: AtomicUsize::new(0),
        }
    }

    /// Whether a group is configured at all.
    #[inline(always)]
    pub fn configured(&self) -> bool {
        self.settings.group.is_some()
    }

    /// The group page once joined; `Err(())` when a group is configured but
    /// could not be joined; `Ok(None)` without a group.
    fn joined(&self) -> Result<Option<&'static GroupPage>, ()> {
        match self.state.load(Ordering::Acquire) {
            JOINED => {
                // SAFETY: a joined page stays mapped for the life of the process.
                return Ok(Some(unsafe { &*self.page.load(Ordering::Acquire) }));
            }
            FAILED | LEFT => return Err(()),
            _ => {}
        }
        if !self.configured() {
            return Ok(None);
        }
        if self
            .state
            .compare_exchange(UNTRIED, JOINING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Another thread is joining: wait for it (a few syscalls).
            loop {
                match self.state.load(Ordering::Acquire) {
                    JOINING => std::thread::yield_now(),
                    _ => return self.joined(),
                }
            }
        }
        let started = Instant::now();
        match self.join() {
            Ok((page, seat)) => {
                self.page
                    .store(ptr::from_ref(page).cast_mut(), Ordering::Release);
                self.member.store(seat.slot, Ordering::Release);
                self.owner.store(seat.owner, Ordering::Release);
                self.state.store(JOINED, Ordering::SeqCst);
                let slot = seat.slot;
                log_at!(
                    Info,
                    "joined group {:?} as member {slot} in {} µs",
                    self.settings.group.as_deref().unwrap_or(""),
                    started.elapsed().as_micros()
                );
                Ok(Some(page))
            }
            Err(why) => {
                log_once!(
                    Error,
                    "{why}; refusing allocations rather than running without the group's limit"
                );
                self.state.store(FAILED, Ordering::Release);
                Err(())
            }
        }
    }
}

fn map(fd: i32) -> Result<&'static GroupPage, String> {
    // SAFETY: callers pass a file at least GROUP_PAGE_SIZE long.
    let Some(p) = (unsafe { map_shared(fd, GROUP_PAGE_SIZE) }) else {
        return Err(format!("cannot map the group page: {}", errno_text()));
    };
    // SAFETY: a checked group page, mapped for the life of the process.
    Ok(unsafe { &*p.cast::<GroupPage>() })
}

fn open_existing(path: &CString, uid: u32) -> Result<Option<(&'static GroupPage, i32)>, String> {
    // SAFETY: a valid path; no symbolic links followed.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOENT) {
            Ok(None)
        } else {
            Err(format!("cannot open the group page {path:?}: {e}"))
        };
    }
    // SAFETY: fd is open and owned here.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    use std::os::unix::fs::{FileExt, MetadataExt};
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot inspect the group page {path:?}: {e}"))?;
    if !meta.is_file() || meta.uid() != uid {
        return Err(format!(
            "the group page {path:?} is not a regular file of this user"
        ));
    }
    let mut head = vec![0u8; GROUP_HEADER_SIZE];
    let n = file
        .read_at(&mut head, 0)
        .map_err(|e| format!("cannot read the group page {path:?}: {e}"))?;
    head.truncate(n);
    group::check_group_header(meta.len(), &head, Some(uid)).map_err(|p| match p {
        group::GroupProblem::OtherLayout { .. } => format!("the group file {path:?}: {p}"),
        p => format!("the group page {path:?} is unusable: {p} (remove it when no member runs)"),
    })?;
    let page = map(fd)?;
    Ok(Some((page, std::os::fd::IntoRawFd::into_raw_fd(file))))
}

fn create(
    dir: &std::path::Path,
    path: &CString,
    name: &str,
    uid: u32,
    limit_text: &str,
) -> Result<(), String> {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() };
    let tmp = cstring(&dir.join(format!(".group-{name}.{pid}.{}.tmp", now_unix_ns())))
        .map_err(|e| e.unwrap_or_default())?;
    // The temporary file carries a lock on its first byte from right after
    // it is made until it is gone: readers remove an unlocked one left by a
    // writer that died (`vramcap_core::group::is_temp_name`).
    let fd = create_private(&tmp);
    if fd < 0 {
        return Err(format!(
            "cannot create the group page in {dir:?}: {}",
            errno_text()
        ));
    }
    vramcap_core::liveness::ofd_lock(fd, 0, 1, true);
    let cleanup = |why: String| {
        // SAFETY: closing and removing our own temporary file.
        unsafe {
            libc::close(fd);
            libc::unlink(tmp.as_ptr());
        }
        Err(why)
    };
    // SAFETY: fd is an open regular file.
    if unsafe { libc::ftruncate(fd, GROUP_PAGE_SIZE as libc::off_t) } != 0 {
        return cleanup(format!("cannot size the group page: {}", errno_text()));
    }
    // Every byte backed now (a sparse file in a full tmpfs faults at its
    // first write; a full one fails here, cleanly).
    // SAFETY: fd is an open regular file of that size.
    let rc = unsafe { libc::posix_fallocate(fd, 0, GROUP_PAGE_SIZE as libc::off_t) };
    if rc != 0 {
        return cleanup(format!(
            "cannot allocate the group page: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    let page = match map(fd) {
        Ok(p) => p,
        Err(e) => return cleanup(e),
    };
    let p = ptr::from_ref(page).cast_mut();
    // SAFETY: nobody else can see the file yet; zero bytes are a valid page.
    let header = unsafe { &mut (*p).header };
    header.fill(uid, now_unix_ns(), name, limit_text);
    header
        .state
        .store(vramcap_core::page::STATE_READY, Ordering::Release);
    // SAFETY: unmapping what we mapped, linking a complete file into place
    // (fails with EEXIST when another process won), removing the private name.
    unsafe {
        libc::munmap(p.cast(), GROUP_PAGE_SIZE);
        let linked = libc::link(tmp.as_ptr(), path.as_ptr());
        let e = std::io::Error::last_os_error();
        libc::close(fd);
        libc::unlink(tmp.as_ptr());
        if linked != 0 && e.raw_os_error() != Some(libc::EEXIST) {
            return Err(format!("cannot publish the group page {path:?}: {e}"));
        }
    }
    Ok(())
}

impl Membership {
    fn join(&self) -> Result<(&'static GroupPage, Seat), String> {
        let s = self.settings;
        let name = s.group.as_deref().unwrap_or_default();
        // SAFETY: getuid and getpid cannot fail.
        let (uid, pid) = unsafe { (libc::getuid(), libc::getpid() as u32) };
        let (dir, is_default) = match &s.stats_dir {
            Some(d) => (d.clone(), false),
            None => (default_stats_dir(uid), true),
        };
        prepare_dir(&dir, uid, is_default)
            .map_err(|e| e.unwrap_or_else(|| "the statistics directory is unusable".into()))?;
        let path = cstring(&dir.join(group::file_name(name))).map_err(|e| e.unwrap_or_default())?;
        let (page, fd) = match open_existing(&path, uid)? {
            Some(p) => p,
            None => {
                create(&dir, &path, name, uid, &s.limit_text)?;
                open_existing(&path, uid)?
                    .ok_or_else(|| format!("the group page {path:?} vanished while joining"))?
            }
        };
        let theirs = get_text(&page.header.limit_text);
        if theirs != s.limit_text {
            log_once!(
                Warn,
                "group {name:?} has the limit {theirs:?}, set by its first member; it applies on top of this process's VRAMCAP_LIMIT={:?} (the stricter wins on each GPU)",
                s.limit_text
            );
        }
        let me = start_time(pid).unwrap_or(0);
        let lock = |i: usize| ofd_lock(fd, group::member_lock_offset(i), 1, true);
        let unlock = |i: usize| {
            ofd_lock(fd, group::member_lock_offset(i), 1, false);
        };
        let seat = match page.join(pid, me, lock, unlock) {
            Some(seat) => seat,
            None => {
                reclaim_dead(page, fd, usize::MAX);
                page.join(pid, me, lock, unlock).ok_or_else(|| {
                    format!("group {name:?} has no free member slot (1024 members)")
                })?
            }
        };
        self.fd.store(fd, Ordering::Release);
        Ok((page, seat))
    }

    /// The group's limit, which applies on top of each member's own
    /// (joining if need be). `None` when the group cannot be joined or its
    /// recorded limit does not parse: never "no cap" for a limit that
    /// cannot be read.
    pub fn spec(&self) -> Option<&LimitSpec> {
        let page = self.joined().ok().flatten()?;
        self.spec
            .get_or_init(|| {
                let text = get_text(&page.header.limit_text);
                if text.is_empty() {
                    return Some(LimitSpec::default());
                }
                let spec = parse_limit(&text);
                if let Err(e) = &spec {
                    log_once!(
                        Error,
                        "the group's recorded limit is unusable ({e}); refusing allocations rather than running without the group's limit (remove the group file when no member runs)"
                    );
                }
                spec.ok()
            })
            .as_ref()
    }

    /// Attaches CUDA device `device` (with this UUID) to the group's entry
    /// for that GPU, claiming it with `limit` if no member has yet. Returns
    /// the group's limit for it; `Ok(None)` without a group; `Err` when the
    /// group cannot be used.
    pub fn attach(
        &self,
        device: CUdevice,
        uuid: Option<[u8; 16]>,
        limit: u64,
    ) -> Result<Option<u64>, ()> {
        let Some(page) = self.joined()? else {
            return Ok(None);
        };
        let (Some(uuid), Some(slot)) = (
            uuid,
            usize::try_from(device)
                .ok()
                .and_then(|d| self.devices.get(d)),
        ) else {
            log_once!(
                Error,
                "device {device} has no UUID the group could key its budget by; refusing its allocations"
            );
            return Err(());
        };
        let Some(i) = page.device_for(uuid, || limit) else {
            log_once!(
                Error,
                "the group page has no room for another GPU; refusing allocations"
            );
            return Err(());
        };
        slot.store(i as u8 + 1, Ordering::Release);
        // device_for set the limit if nobody had: it is there.
        Ok(Some(page.devices[i].limit().unwrap_or(0)))
    }

    /// The page, this member's seat and the group entry of `device`, once
    /// joined and attached.
    fn entry(&self, device: CUdevice) -> Option<(&'static GroupPage, Seat, usize)> {
        if self.state.load(Ordering::SeqCst) != JOINED {
            return None;
        }
        let i = usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))?
            .load(Ordering::Acquire);
        if i == 0 {
            return None;
        }
        // SAFETY: joined: the page stays mapped.
        let page = unsafe { &*self.page.load(Ordering::Acquire) };
        let seat = Seat {
            slot: self.member.load(Ordering::Acquire),
            owner: self.owner.load(Ordering::Acquire),
        };
        Some((page, seat, usize::from(i - 1)))
    }

    /// Runs `f` as one of this process's group calls in flight, which
    /// [`Membership::leave`] waits for; `None` once left (or not joined).
    fn busy<T>(
        &self,
        device: CUdevice,
        f: impl FnOnce(&'static GroupPage, Seat, usize) -> T,
    ) -> Option<T> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        let out = self.entry(device).map(|(p, s, i)| f(p, s, i));
        self.busy.fetch_sub(1, Ordering::SeqCst);
        out
    }

    /// Reserves `bytes` in the group's budget for `device` (no-op without a
    /// group). `Err(used)` when the group has no room even after reclaiming
    /// dead members (or cannot be used: said once).
    #[inline(always)]
    pub fn reserve(&self, device: CUdevice, bytes: u64) -> Result<(), u64> {
        if self.configured() {
            self.reserve_as_member(device, bytes)
        } else {
            Ok(())
        }
    }

    /// [`Membership::reserve`] in a configured group.
    fn reserve_as_member(&self, device: CUdevice, bytes: u64) -> Result<(), u64> {
        // Configured but not usable: refuse (said once already).
        self.busy(device, |page, seat, i| {
            self.reserve_in(page, seat, i, bytes)
        })
        .unwrap_or(Err(0))
    }

    fn reserve_in(&self, page: &GroupPage, seat: Seat, i: usize, bytes: u64) -> Result<(), u64> {
        let fd = self.fd.load(Ordering::Acquire);
        let mut reclaimed = false;
        let mut contended: u32 = 0;
        let mut since: Option<Instant> = None;
        loop {
            match page.reserve(i, seat, bytes) {
                Ok(()) => return Ok(()),
                Err(Refusal::Full { used }) => {
                    if reclaimed || reclaim_dead(page, fd, seat.slot) == 0 {
                        return Err(used);
                    }
                    reclaimed = true;
                }
                Err(Refusal::Contended { used }) => {
                    contended += 1;
                    if contended == RECLAIM_AFTER {
                        reclaim_dead(page, fd, seat.slot);
                        reclaimed = true;
                    }
                    let t = *since.get_or_insert_with(Instant::now);
                    if contended > RECLAIM_AFTER && t.elapsed() > CONTENDED_FOR {
                        log_at!(
                            Info,
                            "group: refused {bytes} bytes after {contended} tries: other members' reservations in flight were in the way"
                        );
                        return Err(used);
                    }
                    std::thread::yield_now();
                }
                Err(Refusal::Unseated) => {
                    log_once!(
                        Error,
                        "group {:?}: this process's member slot was taken over (its lock on the group file was lost, e.g. by closing every descriptor); refusing allocations rather than running without the group's limit",
                        self.settings.group.as_deref().unwrap_or("")
                    );
                    return Err(page.used(i));
                }
            }
        }
    }

    /// Takes `bytes` on `device` back whatever the group's limit (a parked
    /// member's bytes at its resume: `GroupPage::take_back`); false when
    /// the member's seat is lost (said once by `reserve`'s path).
    pub fn take_back(&self, device: CUdevice, bytes: u64) -> bool {
        if !self.configured() {
            return true;
        }
        self.busy(device, |page, seat, i| page.take_back(i, seat, bytes))
            .unwrap_or(false)
    }

    /// Gives `bytes` on `device` back to the group (one atomic step on this
    /// member's ledger; see `vramcap_core::group`).
    #[inline(always)]
    pub fn release(&self, device: CUdevice, bytes: u64) {
        if self.configured() {
            self.release_as_member(device, bytes);
        }
    }

    /// [`Membership::release`] in a configured group.
    fn release_as_member(&self, device: CUdevice, bytes: u64) {
        self.busy(device, |page, seat, i| page.release(i, seat, bytes));
    }

    /// The group's limit on `device` now (`vramcap limit --group` may have
    /// changed it), or `None` outside a group or before it is attached.
    pub fn limit_now(&self, device: CUdevice) -> Option<u64> {
        self.entry(device)
            .and_then(|(p, _, i)| p.devices[i].limit())
    }

    /// The group's bytes held on `device`, or `None` outside a group.
    pub fn used(&self, device: CUdevice) -> Option<u64> {
        self.entry(device).map(|(p, _, i)| p.used(i))
    }

    /// Called by the background thread: reclaims dead members every half
    /// second.
    pub fn tick(&self) {
        if self.state.load(Ordering::Acquire) != JOINED {
            return;
        }
        let now = (now_unix_ns() / 1_000_000) as usize;
        if now.saturating_sub(self.last_tick_ms.load(Ordering::Relaxed))
            < Duration::from_millis(500).as_millis() as usize
        {
            return;
        }
        self.last_tick_ms.store(now, Ordering::Relaxed);
        reclaim_dead(
            // SAFETY: joined: the page stays mapped.
            unsafe { &*self.page.load(Ordering::Acquire) },
            self.fd.load(Ordering::Acquire),
            self.member.load(Ordering::Acquire),
        );
    }

    /// At normal exit: frees this member's slot, which gives all its bytes
    /// back at once, and drops its liveness lock so the slot can be reused.
    /// Group calls of this process's other threads already in flight are
    /// waited for (each is a few atomics, never a wait on another process;
    /// at most [`LEAVE_WAIT`]); later ones do nothing (their allocations are
    /// refused, their frees already counted as given back), since the slot
    /// may be someone else's.
    pub fn leave(&self) {
        if self
            .state
            .compare_exchange(JOINED, LEFT, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return;
        }
        // Bounded: a thread interrupted inside a group call by a signal
        // handler that calls exit() would never finish it. Not leaving is
        // safe: the slot is reclaimed once this process has died.
        let started = Instant::now();
        while self.busy.load(Ordering::SeqCst) != 0 {
            if started.elapsed() > LEAVE_WAIT {
                log_at!(
                    Debug,
                    "a group call is still in flight at exit; the slot is reclaimed after the process ends"
                );
                return;
            }
            std::thread::yield_now();
        }
        // SAFETY: joined: the page stays mapped.
        let page = unsafe { &*self.page.load(Ordering::Acquire) };
        let seat = Seat {
            slot: self.member.load(Ordering::Acquire),
            owner: self.owner.load(Ordering::Acquire),
        };
        if page.leave(seat) {
            let fd = self.fd.load(Ordering::Acquire);
            if fd >= 0 {
                ofd_lock(fd, group::member_lock_offset(seat.slot), 1, false);
            }
            log_at!(Debug, "left the group; member {} is free", seat.slot);
        }
    }

    /// In a child after fork: the inherited descriptor shares the parent's
    /// member lock; close it, or the parent would look alive for as long as
    /// this child runs. The membership is not used again (the child's new
    /// engine joins as a member of its own).
    pub fn forget_after_fork(&self) {
        let fd = self.fd.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            // SAFETY: closing our copy; the parent keeps its own descriptor.
            unsafe { libc::close(fd) };
        }
    }
}

/// A member lives while its lock on its slot's byte is held (the kernel
/// drops it when the process dies; PIDs would not do across containers).
/// Our own slot (`me`) is alive by definition: a lock query through our own
/// descriptor does not see the lock that descriptor holds.
fn alive(fd: i32, me: usize) -> impl Fn(usize, u32, u64) -> bool {
    move |i, _, _| i == me || ofd_locked(fd, group::member_lock_offset(i), 1)
}

/// Frees the slots of members whose processes are gone, which gives their
/// bytes back. Returns how many slots were freed.
fn reclaim_dead(page: &GroupPage, fd: i32, me: usize) -> u64 {
    let mut freed = 0;
    for i in 0..page.members.len() {
        if let Some(b) = page.reclaim_if_dead(i, alive(fd, me)) {
            log_at!(
                Info,
                "group: a dead member's {b} bytes are back in the budget"
            );
            freed += 1;
        }
    }
    freed
}
