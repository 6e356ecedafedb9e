/*
 * checkpoint_subset.h - the CUDA driver's checkpoint calls (cuda.h, CUDA
 * 12.8+/13.0, "Checkpointing"), with the real ABI: every args struct is 64
 * bytes of which most is reserved and must be zero; args may be NULL.
 */
#ifndef VRAMCAP_CHECKPOINT_SUBSET_H
#define VRAMCAP_CHECKPOINT_SUBSET_H

#include "cuda_subset.h"

typedef enum CUprocessState_enum {
    CU_PROCESS_STATE_RUNNING = 0,
    CU_PROCESS_STATE_LOCKED = 1,
    CU_PROCESS_STATE_CHECKPOINTED = 2,
    CU_PROCESS_STATE_FAILED = 3,
} CUprocessState;

typedef struct CUcheckpointLockArgs_st {
    unsigned int timeoutMs; /* 0: no timeout */
    unsigned int reserved0;
    cuuint64_t reserved1[7];
} CUcheckpointLockArgs;

typedef struct CUcheckpointCheckpointArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointCheckpointArgs;

typedef struct CUcheckpointGpuPair_st {
    CUuuid oldUuid;
    CUuuid newUuid;
} CUcheckpointGpuPair;

typedef struct CUcheckpointRestoreArgs_st {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    char reserved[52 - sizeof(CUcheckpointGpuPair *)];
    cuuint64_t reserved1;
} CUcheckpointRestoreArgs;

typedef struct CUcheckpointUnlockArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointUnlockArgs;

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args);
CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args);
CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args);
CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args);
CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state);
CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid);

/*
 * Test inspection: "state" (a CUprocessState), "checkpoints", "restores",
 * "restore_failures" (restores answered 2: the process is stuck from then
 * on), "parked" (bytes moved off the devices now); 0 for other names.
 */
unsigned long vramcap_standin_checkpoint(const char *what);
/* NVML's calls wait here while the process is checkpointed (nvml_standin.c). */
void vramcap_standin_checkpoint_wait(void);

#endif
