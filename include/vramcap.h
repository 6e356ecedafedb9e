/*
 * vramcap.h - the C ABI of libvramcap.so: a program reads and changes its
 * own GPU memory caps while it runs.
 *
 * The library is preloaded (`vramcap run ...` or LD_PRELOAD); a program need
 * not link against it: look the functions up with dlsym(RTLD_DEFAULT, name),
 * and treat a missing symbol as "not running under vramcap".
 *
 * Devices are the indices the process sees (after CUDA_VISIBLE_DEVICES).
 * Sizes are bytes; UINT64_MAX means "no cap". Errors are negative errno
 * values; -EIO is an internal error. With VRAMCAP_DISABLE=1 every function
 * answers -ENOSYS (vramcap_version too; 0 for vramcap_get_limit). None of
 * them is async-signal-safe (vramcap_set_limit waits for allocations in
 * flight): do not call them from a signal handler.
 */
#ifndef VRAMCAP_H
#define VRAMCAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* This ABI's version (1), or -ENOSYS with VRAMCAP_DISABLE=1. */
int vramcap_version(void);

/*
 * Sets the cap of `device` (-1: every device the process uses) to `bytes`
 * (UINT64_MAX: no cap). A program may lower its cap and raise it again up
 * to the cap it was started with, never above. Lowered below what the
 * process holds, cached blocks are given back and new allocations are
 * refused (or spill) until it frees. Returns 0, -EINVAL (zero bytes, a
 * device below -1), -ENODEV (a device the process cannot use, or none used
 * yet for -1) or -EPERM (above the starting cap).
 */
int vramcap_set_limit(int device, uint64_t bytes);

/* The cap in force on `device`: UINT64_MAX for none, 0 when unknown. */
uint64_t vramcap_get_limit(int device);

/* What vramcap_memory_stats fills; fields may be added at the end. */
struct vramcap_stats {
    uint64_t size;        /* bytes of this struct the library filled */
    uint64_t limit;       /* the cap in force (UINT64_MAX: none) */
    uint64_t soft_limit;  /* the soft limit (UINT64_MAX: none) */
    uint64_t held;        /* everything the cap counts: the four below */
    uint64_t allocations; /* live allocations, cached blocks included */
    uint64_t pools;       /* stream-ordered pools' reserve */
    uint64_t graphs;      /* graph memory */
    uint64_t context;     /* the context's footprint */
    uint64_t peak;        /* the highest `held` so far */
    uint64_t cached;      /* freed blocks kept for reuse (in `allocations`) */
    uint64_t spilled;     /* bytes placed in host memory past the cap */
    uint64_t refusals;    /* allocations refused because of the cap */
    uint64_t total;       /* the device's memory, without the cap */
    uint64_t own_limit;   /* the process's own cap, before a group's makes it
                             stricter (UINT64_MAX: none) */
};

/*
 * Fills `out` (of `size` bytes, at least 8: older and newer structs both
 * work) with `device`'s figures. Returns 0, -EINVAL or -ENODEV.
 */
int vramcap_memory_stats(int device, struct vramcap_stats *out, size_t size);

/* Gives every cached block back to the driver; the bytes released. */
int64_t vramcap_empty_cache(void);

#ifdef __cplusplus
}
#endif

#endif /* VRAMCAP_H */
