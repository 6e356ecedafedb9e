/*
 * checkpoint_standin.c - the stand-in driver's checkpoint calls, included
 * at the end of cuda_standin.c (it uses that file's state: g_lock, g_dev,
 * g_cfg). What it models, as measured on the H200 (r580; see
 * ../../docs/design/parking.md):
 *
 * - Only the calling process's own PID (another PID: 801, the stand-in
 *   cannot reach other processes).
 * - Lock: from then on every other thread's driver call (each entry point
 *   that checks cuInit, through initialized()) waits until Unlock; the
 *   locking thread's calls go on.
 * - Checkpoint (locked only): refused with 801 while the process holds
 *   managed memory (it stays locked); otherwise each device's used bytes
 *   move to "parked" and the device shows 0 used (allocations, their
 *   addresses and handles stay valid).
 * - Restore (checkpointed only) needs the parked bytes free on each
 *   device: free is the device's total minus what other processes hold,
 *   STANDIN_FOREIGN_FILE (a file holding a number of MiB, read at each
 *   restore; the NVML stand-in reports the same in its memory info).
 *   Without room it answers 2 (out of memory) and from then on the process
 *   is stuck: every checkpoint call answers 304, GetState FAILED, and every
 *   other driver call CUDA_ERROR_NOT_INITIALIZED.
 * - Unlock (locked, not checkpointed) lets the waiting calls go on.
 * - NVML: the NVML stand-in's calls in this process wait while it is
 *   checkpointed (vramcap_standin_checkpoint_wait), any thread's, the
 *   locking one's too: on the H200 (r580) the shim's own NVML query after
 *   its checkpoint waited for good (docs/design/gpu-history.md, 2026-12-04).
 * - GetRestoreThreadId answers the PID (the stand-in has no restore thread).
 * - STANDIN_CHECKPOINT_FAIL=lock, =checkpoint or =unlock, or several joined
 *   by commas (read at each call): that call answers 999 (CUDA_ERROR_UNKNOWN)
 *   and changes nothing, as a driver error would (after a failed checkpoint
 *   the process stays locked; after a failed unlock too).
 * - STANDIN_CHECKPOINT_HOLD=PATH (read at each Lock): Lock first writes
 *   "standin: lock held" to stderr, then reads one byte from PATH (a FIFO
 *   the test holds open) before it locks: a test holds a park in its
 *   first step, with the shim's gate closed, for as long as it likes.
 */
#include "checkpoint_subset.h"

#include <fcntl.h>
#include <unistd.h>

#define CUDA_ERROR_NOT_SUPPORTED_ 801
#define CUDA_ERROR_ILLEGAL_STATE_ 401
#define CUDA_ERROR_OS_CALL_FAILED_ 304

static pthread_mutex_t ck_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ck_cv = PTHREAD_COND_INITIALIZER;
static atomic_bool ck_locked;     /* between Lock and Unlock */
static atomic_bool ck_stuck;      /* a restore failed */
static pthread_t ck_owner;        /* the locking thread */
static CUprocessState ck_state;   /* under ck_mu */
static size_t ck_parked[MAX_DEVICES]; /* under g_lock */
static atomic_ulong ck_checkpoints, ck_restores, ck_restore_failures;

/* Other threads' driver calls wait here while the process is locked; false
 * when the process is stuck. */
static bool checkpoint_gate(void)
{
    if (atomic_load(&ck_stuck))
        return false;
    if (!atomic_load(&ck_locked))
        return true;
    pthread_mutex_lock(&ck_mu);
    while (atomic_load(&ck_locked) && !atomic_load(&ck_stuck) &&
           !pthread_equal(ck_owner, pthread_self()))
        pthread_cond_wait(&ck_cv, &ck_mu);
    pthread_mutex_unlock(&ck_mu);
    return !atomic_load(&ck_stuck);
}

/* Whether STANDIN_CHECKPOINT_FAIL (one call, or several joined by commas)
 * names this call. */
static bool ck_fails(const char *call)
{
    const char *f = getenv("STANDIN_CHECKPOINT_FAIL");
    size_t n = strlen(call);
    while (f != NULL && *f != '\0') {
        const char *end = strchr(f, ',');
        size_t len = end != NULL ? (size_t)(end - f) : strlen(f);
        if (len == n && strncmp(f, call, n) == 0)
            return true;
        f = end != NULL ? end + 1 : NULL;
    }
    return false;
}

/* The common checks: own PID, not stuck, in state `want`; on success
 * ck_mu is held. */
static CUresult ck_begin(int pid, CUprocessState want)
{
    config();
    if (pid != (int)getpid())
        return CUDA_ERROR_NOT_SUPPORTED_;

    if (atomic_load(&ck_stuck))
        return CUDA_ERROR_OS_CALL_FAILED_;
    pthread_mutex_lock(&ck_mu);
    if (ck_state != want) {
        pthread_mutex_unlock(&ck_mu);
        return CUDA_ERROR_ILLEGAL_STATE_;
    }
    return CUDA_SUCCESS;
}

/* STANDIN_CHECKPOINT_HOLD: waits for one byte from the named FIFO. */
static void ck_hold(void)
{
    const char *path = getenv("STANDIN_CHECKPOINT_HOLD");
    if (path == NULL || *path == '\0')
        return;
    static const char said[] = "standin: lock held\n";
    if (write(2, said, sizeof said - 1) < 0) {
        /* nothing to do: the test then misses the line and fails */
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    char byte;
    while (read(fd, &byte, 1) < 0 && errno == EINTR) {
    }
    close(fd);
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    (void)args;
    if (ck_fails("lock"))
        return 999;
    ck_hold();
    CUresult rc = ck_begin(pid, CU_PROCESS_STATE_RUNNING);
    if (rc != CUDA_SUCCESS)
        return rc;
    ck_state = CU_PROCESS_STATE_LOCKED;
    ck_owner = pthread_self();
    atomic_store(&ck_locked, true);
    pthread_mutex_unlock(&ck_mu);
    return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    (void)args;
    if (ck_fails("checkpoint"))
        return 999;
    CUresult rc = ck_begin(pid, CU_PROCESS_STATE_LOCKED);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&g_lock);
    bool managed = false;
    for (int d = 0; d < g_cfg.devices && !managed; d++)
        for (size_t i = 0; i < g_dev[d].nblocks && !managed; i++)
            managed = g_dev[d].blocks[i].live && g_dev[d].blocks[i].managed;
    if (!managed) {
        for (int d = 0; d < g_cfg.devices; d++) {
            ck_parked[d] = g_dev[d].used;
            g_dev[d].used = 0;
        }
        ck_state = CU_PROCESS_STATE_CHECKPOINTED;
        atomic_fetch_add(&ck_checkpoints, 1);
    }
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&ck_mu);
    return managed ? CUDA_ERROR_NOT_SUPPORTED_ : CUDA_SUCCESS;
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    (void)args;
    CUresult rc = ck_begin(pid, CU_PROCESS_STATE_CHECKPOINTED);
    if (rc != CUDA_SUCCESS)
        return rc;
    size_t foreign = (size_t)standin_foreign_bytes();
    pthread_mutex_lock(&g_lock);
    bool room = true;
    for (int d = 0; d < g_cfg.devices; d++) {
        size_t held = g_dev[d].used + foreign;
        size_t free = held >= g_cfg.total_bytes ? 0 : g_cfg.total_bytes - held;
        room = room && ck_parked[d] <= free;
    }
    if (room) {
        for (int d = 0; d < g_cfg.devices; d++) {
            g_dev[d].used += ck_parked[d];
            ck_parked[d] = 0;
        }
        ck_state = CU_PROCESS_STATE_LOCKED;
        atomic_fetch_add(&ck_restores, 1);
        pthread_cond_broadcast(&ck_cv); /* NVML's waiters */
    } else {
        /* As measured: 2 now, and the process stuck for good. */
        ck_state = CU_PROCESS_STATE_FAILED;
        atomic_fetch_add(&ck_restore_failures, 1);
        atomic_store(&ck_stuck, true);
        pthread_cond_broadcast(&ck_cv);
    }
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&ck_mu);
    return room ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    (void)args;
    if (ck_fails("unlock"))
        return 999; /* the process stays locked */
    CUresult rc = ck_begin(pid, CU_PROCESS_STATE_LOCKED);
    if (rc != CUDA_SUCCESS)
        return rc;
    ck_state = CU_PROCESS_STATE_RUNNING;
    atomic_store(&ck_locked, false);
    pthread_cond_broadcast(&ck_cv);
    pthread_mutex_unlock(&ck_mu);
    return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    config();
    if (pid != (int)getpid())
        return CUDA_ERROR_NOT_SUPPORTED_;
    CHECK(state != NULL, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&ck_mu);
    *state = ck_state;
    pthread_mutex_unlock(&ck_mu);
    return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    config();
    if (pid != (int)getpid())
        return CUDA_ERROR_NOT_SUPPORTED_;
    CHECK(tid != NULL, CUDA_ERROR_INVALID_VALUE);
    *tid = pid;
    return CUDA_SUCCESS;
}

void vramcap_standin_checkpoint_wait(void)
{
    pthread_mutex_lock(&ck_mu);
    while (ck_state == CU_PROCESS_STATE_CHECKPOINTED && !atomic_load(&ck_stuck))
        pthread_cond_wait(&ck_cv, &ck_mu);
    pthread_mutex_unlock(&ck_mu);
}

unsigned long vramcap_standin_checkpoint(const char *what)
{
    config();
    if (what == NULL)
        return 0;
    if (strcmp(what, "state") == 0) {
        pthread_mutex_lock(&ck_mu);
        unsigned long s = (unsigned long)ck_state;
        pthread_mutex_unlock(&ck_mu);
        return s;
    }
    if (strcmp(what, "checkpoints") == 0)
        return atomic_load(&ck_checkpoints);
    if (strcmp(what, "restores") == 0)
        return atomic_load(&ck_restores);
    if (strcmp(what, "restore_failures") == 0)
        return atomic_load(&ck_restore_failures);
    if (strcmp(what, "parked") == 0) {
        unsigned long n = 0;
        pthread_mutex_lock(&g_lock);
        for (int d = 0; d < g_cfg.devices; d++)
            n += ck_parked[d];
        pthread_mutex_unlock(&g_lock);
        return n;
    }
    return 0;
}
