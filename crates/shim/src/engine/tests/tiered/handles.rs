//! Tiered spill of the program's own `cuMemCreate` memory against the
//! fake driver: the handles the engine answers, their maps, moves,
//! exports and imports.

use super::*;

/// Device 0, read and write: what the program grants its pages.
const RW0: CUmemAccessDesc = CUmemAccessDesc {
    location: CUmemLocation {
        kind: CU_MEM_LOCATION_TYPE_DEVICE,
        id: 0,
    },
    flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
};

/// The program's `cuMemCreate` of `bytes` on device 0 through the engine.
fn create(e: &'static Engine<Fake>, bytes: u64) -> Result<u64, CUresult> {
    let prop = CUmemAllocationProp {
        kind: CU_MEM_ALLOCATION_TYPE_PINNED,
        handle_types: 1,
        location: crate::engine::tiered::location(crate::engine::tiered::Place::Device, 0),
    };
    let mut h = 0u64;
    let out: *mut u64 = &mut h;
    let real = || match e.driver.vmm_create(bytes, prop.location) {
        Ok(x) => {
            // SAFETY: `out` points at `h`, alive for the call.
            unsafe { *out = x };
            CUDA_SUCCESS
        }
        Err(rc) => rc,
    };
    // SAFETY: valid pointers to live locals.
    let rc = unsafe { e.mem_create(real, out, bytes as usize, &prop, 0) };
    if rc == CUDA_SUCCESS { Ok(h) } else { Err(rc) }
}

/// Maps handle `h` whole at a fresh address (the driver's own `cuMemMap`
/// would refuse the program's handle: the engine must translate it), and
/// grants `access` when there is any.
fn map(e: &'static Engine<Fake>, h: u64, bytes: u64, access: &[CUmemAccessDesc]) -> u64 {
    let ptr = e.driver.vmm_reserve(bytes).unwrap();
    let rc = e.mem_map(|| CUDA_ERROR_INVALID_VALUE, ptr, bytes as usize, 0, h, 0);
    assert_eq!(rc, CUDA_SUCCESS);
    if !access.is_empty() {
        // SAFETY: `access` is a live slice of that many descriptors.
        let rc = unsafe {
            e.mem_set_access(
                || CUDA_SUCCESS,
                ptr,
                bytes as usize,
                access.as_ptr(),
                access.len(),
            )
        };
        assert_eq!(rc, CUDA_SUCCESS);
    }
    ptr
}

fn unmap(e: &'static Engine<Fake>, ptr: u64, bytes: u64) -> CUresult {
    e.mem_unmap(|| e.driver.vmm_unmap(ptr, bytes), ptr, bytes as usize)
}

fn release(e: &'static Engine<Fake>, h: u64) -> CUresult {
    e.mem_release(|| CUDA_ERROR_INVALID_VALUE, h)
}

/// The program's own `cuMemCreate` memory (PyTorch's expandable
/// segments): past the cap a handle is host memory; a page mapped whole
/// moves once the program has granted access to it, with that access
/// granted again; its handle keeps naming it (retain, properties); its
/// bytes come back with its last release and unmap.
#[test]
fn the_programs_pages_move_once_granted_access_and_keep_their_handles() {
    let e = tiered("64MiB");
    const RO0: CUmemAccessDesc = CUmemAccessDesc {
        flags: 1, // read only
        ..RW0
    };
    let hs: Vec<u64> = (0..3).map(|_| create(e, 32 * MIB).unwrap()).collect();
    assert_eq!(placed(e), (64 * MIB, 32 * MIB, 64 * MIB));
    assert!(
        hs.iter()
            .all(|h| !e.driver.vmm.lock().unwrap().contains_key(h))
    );
    let p0 = map(e, hs[0], 32 * MIB, &[RW0]);
    let p1 = map(e, hs[1], 32 * MIB, &[RW0]);
    let p2 = map(e, hs[2], 32 * MIB, &[]);
    for _ in 0..50 {
        launch(e, &[p2, p1]);
    }
    // No access granted to the hot page yet: it cannot be copied, so it stays.
    rounds(e, MIN_ROUNDS as usize + 1);
    assert_eq!(e.driver.copies.load(Ordering::SeqCst), 0);
    // Granted twice (a later grant replaces the one for its location).
    for grant in [RO0, RW0] {
        // SAFETY: a live descriptor.
        let rc = unsafe { e.mem_set_access(|| CUDA_SUCCESS, p2, (32 * MIB) as usize, &grant, 1) };
        assert_eq!(rc, CUDA_SUCCESS);
    }
    for _ in 0..50 {
        launch(e, &[p2, p1]);
    }
    rounds(e, 1);
    assert_eq!(moves(e), (1, 1));
    assert_eq!(placed(e), (64 * MIB, 32 * MIB, 64 * MIB));
    assert!(e.driver.peak.load(Ordering::SeqCst) <= 64 * MIB);
    // Each page moved is granted its access again, as it was last granted.
    let mut granted = e.driver.access.lock().unwrap().clone();
    granted.sort_by_key(|(p, _)| *p);
    assert_eq!(granted, [(p0, vec![RW0]), (p2, vec![RW0])]);
    // The program's handles still name the memory, wherever it went.
    let mut h = 0u64;
    // SAFETY: a live out-parameter.
    let rc = unsafe {
        e.mem_retain_allocation_handle(
            || CUDA_ERROR_INVALID_VALUE,
            &mut h,
            (p0 + 4096) as *mut c_void,
        )
    };
    assert_eq!((rc, h), (CUDA_SUCCESS, hs[0]));
    assert_eq!(release(e, hs[0]), CUDA_SUCCESS);
    // p0's memory is on the host now; the properties name the device.
    assert_eq!(
        properties(e, hs[0]),
        (
            CUDA_SUCCESS,
            crate::engine::tiered::location(crate::engine::tiered::Place::Device, 0)
        )
    );
    // Unmapped, then released: the bytes come back where they are now.
    for (p, h) in [p0, p1, p2].into_iter().zip(&hs) {
        assert_eq!(unmap(e, p, 32 * MIB), CUDA_SUCCESS);
        assert_eq!(release(e, *h), CUDA_SUCCESS);
    }
    assert_eq!(placed(e), (0, 0, 0));
    assert!(e.driver.vmm.lock().unwrap().is_empty());
    assert!(e.driver.maps.lock().unwrap().is_empty());
    // Gone: a second release is the driver's answer for an unknown handle.
    assert_eq!(release(e, hs[2]), CUDA_ERROR_INVALID_VALUE);
}

/// A handle exported, or mapped a second time, stays where it is; a handle
/// released while mapped keeps its memory until the unmap.
#[test]
fn an_exported_or_twice_mapped_handle_stays_where_it_is() {
    let e = tiered("32MiB");
    let on_device = create(e, 32 * MIB).unwrap();
    let on_host = create(e, 32 * MIB).unwrap();
    let other = create(e, 32 * MIB).unwrap();
    let d = map(e, on_device, 32 * MIB, &[RW0]);
    let h = map(e, on_host, 32 * MIB, &[RW0]);
    let mut fd: c_int = -1;
    let mut export = |handle| {
        // SAFETY: a descriptor's int.
        unsafe {
            e.mem_export_to_shareable_handle(
                || CUDA_ERROR_INVALID_VALUE,
                std::ptr::from_mut(&mut fd).cast(),
                handle,
                1,
                0,
            )
        }
    };
    // Host memory made past the cap has no shareable handle; pinned anyway.
    assert_eq!(export(on_host), 801);
    // `other`, mapped whole and granted access, is a block; a second
    // mapping (here of its first half) pins it.
    let o = map(e, other, 32 * MIB, &[RW0]);
    assert!(e.tiers.contains(o));
    let half = e.driver.vmm_reserve(16 * MIB).unwrap();
    let rc = e.mem_map(
        || CUDA_ERROR_INVALID_VALUE,
        half,
        (16 * MIB) as usize,
        0,
        other,
        0,
    );
    assert_eq!(rc, CUDA_SUCCESS);
    for _ in 0..50 {
        launch(e, &[h, o]);
    }
    rounds(e, MIN_ROUNDS as usize + 1);
    assert_eq!(e.driver.copies.load(Ordering::SeqCst), 0);
    assert_eq!(export(on_device), CUDA_SUCCESS);
    // Importing that descriptor in this process answers the program's own
    // handle (one more reference); the driver's new handle is given back.
    let mut imported = 0u64;
    let out: *mut u64 = &mut imported;
    let driver_import = || {
        // SAFETY: `out` points at `imported`, alive for the call.
        unsafe {
            *out = e
                .driver
                .vmm_create(
                    2 * MIB,
                    crate::engine::tiered::location(crate::engine::tiered::Place::Device, 0),
                )
                .unwrap()
        };
        CUDA_SUCCESS
    };
    // SAFETY: a live out-parameter; the descriptor as a pointer, as the driver takes it.
    let rc = unsafe {
        e.mem_import_from_shareable_handle(driver_import, out, fd as usize as *mut c_void, 1)
    };
    assert_eq!((rc, imported), (CUDA_SUCCESS, on_device));
    assert_eq!(release(e, on_device), CUDA_SUCCESS);
    // Released while mapped: the memory stays until the unmap.
    assert_eq!(release(e, on_device), CUDA_SUCCESS);
    assert_eq!(used(e), 32 * MIB);
    assert_eq!(unmap(e, d, 32 * MIB), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
    assert_eq!(unmap(e, half, 16 * MIB), CUDA_SUCCESS);
    for (p, handle) in [(h, on_host), (o, other)] {
        assert_eq!(unmap(e, p, 32 * MIB), CUDA_SUCCESS);
        assert_eq!(release(e, handle), CUDA_SUCCESS);
    }
    assert_eq!(placed(e), (0, 0, 0));
    assert!(e.driver.vmm.lock().unwrap().is_empty());
}

/// Three pages of 32 MiB under a 64 MiB cap, mapped and granted device 0:
/// the third on the host. Launches heat the second and third, so a round
/// would demote the first and promote the third.
fn three_pages(e: &'static Engine<Fake>) -> [u64; 3] {
    let hs: Vec<u64> = (0..3).map(|_| create(e, 32 * MIB).unwrap()).collect();
    let ps = [0, 1, 2].map(|i| map(e, hs[i], 32 * MIB, &[RW0]));
    for _ in 0..50 {
        launch(e, &[ps[2], ps[1]]);
    }
    ps
}

/// A page granted to another device, or granted in part, stays where it
/// is: the other device's work is not waited for before a move, and a
/// move could only grant its access over the whole page. So does a page
/// whose range went out as a dma-buf (a network card keeps reaching the
/// memory behind it). Without those the first page is demoted (checked
/// last).
#[test]
fn pages_granted_to_another_device_in_part_or_as_a_dma_buf_stay_put() {
    let peer = CUmemAccessDesc {
        location: crate::engine::tiered::location(crate::engine::tiered::Place::Device, 1),
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    let grants: [(&[CUmemAccessDesc], u64); 3] = [
        (&[RW0, peer], 32 * MIB),
        (std::slice::from_ref(&peer), 32 * MIB),
        (&[RW0], 16 * MIB),
    ];
    for (access, bytes) in grants {
        let e = tiered("64MiB");
        let [p0, ..] = three_pages(e);
        // SAFETY: live descriptors.
        let rc = unsafe {
            e.mem_set_access(
                || CUDA_SUCCESS,
                p0,
                bytes as usize,
                access.as_ptr(),
                access.len(),
            )
        };
        assert_eq!(rc, CUDA_SUCCESS);
        rounds(e, MIN_ROUNDS as usize + 1);
        assert_eq!(moves(e), (0, 0), "granted {access:?} over {bytes} bytes");
    }
    // A dma-buf of any part of the page, from a range that starts before it.
    let e = tiered("64MiB");
    let [p0, ..] = three_pages(e);
    let rc = e.mem_get_handle_for_address_range(
        || CUDA_SUCCESS,
        std::ptr::null_mut(),
        p0 - 4096,
        8192,
        1,
        0,
    );
    assert_eq!(rc, CUDA_SUCCESS);
    rounds(e, MIN_ROUNDS as usize + 1);
    assert_eq!(moves(e), (0, 0));
    // The same pages with none of that: the first is demoted.
    let e = tiered("64MiB");
    three_pages(e);
    rounds(e, MIN_ROUNDS as usize + 1);
    assert_eq!(moves(e), (1, 1));
}

/// An import of a descriptor that only has the number an export had (the
/// export was sent away and closed, and another process's export came in
/// at that number) is the other memory: the driver's handle, untouched.
/// The exported descriptor itself, or a copy of it, is this handle.
#[test]
fn an_import_is_this_processs_handle_only_from_the_file_it_exported() {
    let e = tiered("64MiB");
    let mine = create(e, 2 * MIB).unwrap();
    let mut fd: c_int = -1;
    // SAFETY: a descriptor's int.
    let rc = unsafe {
        e.mem_export_to_shareable_handle(
            || CUDA_ERROR_INVALID_VALUE,
            std::ptr::from_mut(&mut fd).cast(),
            mine,
            1,
            0,
        )
    };
    assert_eq!(rc, CUDA_SUCCESS);
    let import = |fd: c_int| {
        const PEERS: u64 = 0xdead_0000;
        let mut imported = 0u64;
        let out: *mut u64 = &mut imported;
        let driver_import = || {
            // SAFETY: `out` points at `imported`, alive for the call.
            unsafe { *out = PEERS };
            CUDA_SUCCESS
        };
        // SAFETY: a live out-parameter; the descriptor as the driver takes it.
        let rc = unsafe {
            e.mem_import_from_shareable_handle(driver_import, out, fd as usize as *mut c_void, 1)
        };
        assert_eq!(rc, CUDA_SUCCESS);
        (imported != PEERS).then_some(imported)
    };
    // SAFETY: dup of our own descriptor.
    let copy = unsafe { libc::dup(fd) };
    assert_eq!(import(copy), Some(mine));
    assert_eq!(e.handles.lock()[&mine].exported.len(), 1);
    assert_eq!(release(e, mine), CUDA_SUCCESS);
    // The export's number now names another file (dup2 closes the export
    // and reuses its number at once: tests run side by side, opening files).
    // SAFETY: our own descriptors.
    let foreign = unsafe {
        libc::close(copy);
        let other = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        let at = libc::dup2(other, fd);
        libc::close(other);
        at
    };
    assert_eq!(foreign, fd);
    assert_eq!(import(foreign), None);
    // SAFETY: our own descriptor.
    unsafe { libc::close(foreign) };
    // In a child after fork the kept descriptors are closed (each would
    // hold the parent's memory allocated for as long as the child lives).
    e.handles.close_kept_after_fork();
    assert!(e.handles.lock()[&mine].exported.is_empty());
    assert_eq!(release(e, mine), CUDA_SUCCESS);
    assert_eq!(placed(e), (0, 0, 0));
}

/// The properties of a live handle while another thread unmaps its page
/// (its block detached, the driver's unmap not yet made) are the driver's
/// answer for the memory, which no move can change any more.
#[test]
fn a_handle_being_unmapped_still_answers_its_properties() {
    let e = tiered("64MiB");
    let h = create(e, 2 * MIB).unwrap();
    let p = map(e, h, 2 * MIB, &[RW0]);
    assert_eq!(e.tiered_unmapping(p, p + 2 * MIB).len(), 1);
    assert_eq!(
        properties(e, h),
        (
            CUDA_SUCCESS,
            crate::engine::tiered::location(crate::engine::tiered::Place::Device, 0)
        )
    );
}

/// `cuMemGetAllocationPropertiesFromHandle` of `h`: its answer and the
/// location the properties name (the host's when none was written).
fn properties(e: &'static Engine<Fake>, h: u64) -> (CUresult, CUmemLocation) {
    let mut prop = CUmemAllocationPropFull {
        kind: 0,
        handle_types: 0,
        location: crate::engine::tiered::location(crate::engine::tiered::Place::Host, 0),
        win32_metadata: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    };
    // SAFETY: a live out-parameter.
    let rc = unsafe {
        e.mem_get_allocation_properties_from_handle(|| CUDA_ERROR_INVALID_VALUE, &mut prop, h)
    };
    (rc, prop.location)
}
