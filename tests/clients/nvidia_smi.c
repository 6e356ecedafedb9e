/*
 * nvidia_smi.c - the tests' nvidia-smi (OUTDIR/bin/nvidia-smi, first on
 * the PATH of every test process): answers the one query the shim makes
 * when it resumes a parked process (crates/shim/src/boundary/park.rs),
 *
 *   nvidia-smi --query-gpu=uuid,memory.free --format=csv,noheader,nounits
 *
 * with one line per device, "UUID, FREE_MIB", from the NVML stand-in as a
 * process of its own sees it (other processes and STANDIN_FOREIGN_FILE
 * count; this one holds nothing). Any other arguments: exit 2 with a line.
 * STANDIN_SMI_FAIL=1: exit 1 at once, as an nvidia-smi that cannot reach
 * the driver does.
 */
#include "nvml_subset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 3 || strcmp(argv[1], "--query-gpu=uuid,memory.free") != 0 ||
        strcmp(argv[2], "--format=csv,noheader,nounits") != 0) {
        fprintf(stderr, "stand-in nvidia-smi: only --query-gpu=uuid,memory.free "
                        "--format=csv,noheader,nounits\n");
        return 2;
    }
    const char *fail = getenv("STANDIN_SMI_FAIL");
    if (fail != NULL && strcmp(fail, "1") == 0) {
        fprintf(stderr, "stand-in nvidia-smi: failing as asked (STANDIN_SMI_FAIL=1)\n");
        return 1;
    }
    unsigned n = 0;
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetCount_v2(&n) != NVML_SUCCESS) {
        fprintf(stderr, "stand-in nvidia-smi: NVML failed\n");
        return 1;
    }
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t dev;
        char uuid[96];
        nvmlMemory_t mem;
        if (nvmlDeviceGetHandleByIndex_v2(i, &dev) != NVML_SUCCESS ||
            nvmlDeviceGetUUID(dev, uuid, sizeof uuid) != NVML_SUCCESS ||
            nvmlDeviceGetMemoryInfo(dev, &mem) != NVML_SUCCESS) {
            fprintf(stderr, "stand-in nvidia-smi: NVML failed on device %u\n", i);
            return 1;
        }
        printf("%s, %llu\n", uuid, (unsigned long long)(mem.free >> 20));
    }
    nvmlShutdown();
    return 0;
}
