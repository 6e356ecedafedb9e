/*
 * nvml_standin.c - a stand-in NVML (installed as libnvidia-ml.so.1) for the
 * vramcap integration tests, which run on machines without a GPU.
 *
 * It reports the devices of the stand-in CUDA driver (cuda_standin.c): the
 * same STANDIN_DEVICES and STANDIN_TOTAL_MIB (read the same way, once, when
 * the library is loaded; the CUDA stand-in warns about bad values, this one
 * is silent), the same UUIDs and names, and as "used" the bytes the CUDA
 * stand-in has accounted on the device when it is loaded in the process
 * (found through its vramcap_standin_used export), 0 otherwise. Like the
 * real NVML it sees the whole device, not what a shim in the process makes
 * of it, and the whole machine: STANDIN_NVML_DEVICES (default
 * STANDIN_DEVICES, at most 8) is how many GPUs it lists, so that it can
 * list GPUs the CUDA side does not see (as under CUDA_VISIBLE_DEVICES).
 *
 * nvmlInit / nvmlInit_v2 and nvmlShutdown are reference counted; every
 * other call needs the library initialized (NVML_ERROR_UNINITIALIZED).
 * Init and every call that checks it wait while this process's CUDA
 * stand-in is checkpointed (parking; checkpoint_standin.c).
 *
 * Per-process figures (nvmlDeviceGetComputeRunningProcesses_v2/_v3): this
 * process on every device where the CUDA stand-in has a live context
 * (vramcap_standin_contexts), using everything the stand-in counts there
 * (vramcap_standin_used), with the PID getpid() or STANDIN_NVML_PID (as a
 * container's NVML shows host PIDs); then STANDIN_NVML_OTHERS (0..64,
 * default 0) other processes, PIDs 4000000 + i, of 100 MiB each, on every
 * device. Those others also count in the devices' memory info, and so do
 * the MiB in the file STANDIN_FOREIGN_FILE names (read at each call: what
 * parking's tests make other processes hold; the CUDA stand-in's restore
 * needs room beside them).
 *
 * A GPU can be lost while a process runs: STANDIN_NVML_LOST_FILE names a
 * file read at every nvmlDeviceGetHandleByUUID and nvmlDeviceGetMemoryInfo
 * call; the devices whose indices it lists (decimal, separated by anything
 * else) answer NVML_ERROR_GPU_IS_LOST, as a GPU fallen off the bus does.
 *
 * Xid events: STANDIN_NVML_XID_FILE names a file of lines "DEVICE XID"
 * (decimal). An event set (nvmlEventSetCreate; one per process is enough)
 * that a device registered for nvmlEventTypeXidCriticalError delivers, at
 * each nvmlEventSetWait_v2, the next line not yet delivered for a
 * registered device; with none it waits up to the timeout (checking the
 * file every 10 ms) and answers NVML_ERROR_TIMEOUT.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include "nvml_subset.h"
#include "standin_env.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ULL << 20)
#define OTHER_PID_BASE 4000000u       /* STANDIN_NVML_OTHERS' PIDs */
#define OTHER_BYTES (100 * MIB)       /* what each of them uses */
#define NO_INSTANCE 0xFFFFFFFFu       /* instance ids without MIG */

static struct {
    unsigned int devices;
    unsigned long long total_bytes;
    long pid;                         /* STANDIN_NVML_PID; -1: getpid() */
    unsigned int others;              /* STANDIN_NVML_OTHERS */
} g_cfg;

/* Device handles point at these; index is the device ordinal. */
struct nvmlDevice_st {
    unsigned int index;
};
static struct nvmlDevice_st g_devices[MAX_DEVICES];

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long g_init_refs; /* nvmlInit calls not yet shut down */

__attribute__((constructor)) static void nvml_standin_load(void)
{
    unsigned int cuda_devices = (unsigned int)env_long(
        "STANDIN_DEVICES", DEFAULT_DEVICES, 0, MAX_DEVICES, false);
    g_cfg.devices = (unsigned int)env_long("STANDIN_NVML_DEVICES",
                                           (long)cuda_devices, 0, MAX_DEVICES,
                                           false);
    g_cfg.total_bytes = (unsigned long long)env_long(
        "STANDIN_TOTAL_MIB", DEFAULT_TOTAL_MIB, 1, MAX_TOTAL_MIB, false) * MIB;
    g_cfg.pid = env_long("STANDIN_NVML_PID", -1, 1, 0x7fffffff, false);
    g_cfg.others = (unsigned int)env_long("STANDIN_NVML_OTHERS", 0, 0, 64,
                                          false);
    for (unsigned int i = 0; i < MAX_DEVICES; i++)
        g_devices[i].index = i;
}

static void checkpoint_wait(void);

static bool initialized(void)
{
    checkpoint_wait();
    pthread_mutex_lock(&g_lock);
    bool init = g_init_refs > 0;
    pthread_mutex_unlock(&g_lock);
    return init;
}

/* The ordinal behind a device handle, or -1 if it is not one. */
static int device_index(nvmlDevice_t device)
{
    for (unsigned int i = 0; i < g_cfg.devices; i++)
        if (device == &g_devices[i])
            return (int)i;
    return -1;
}

/*
 * An inspection export of the CUDA stand-in taking a device: looked up each
 * time, so it does not matter whether libcuda.so.1 was loaded before or
 * after this library, or with RTLD_LOCAL. NULL when it is not loaded; the
 * handle (may be NULL) must be given to dlclose_if.
 */
static void *cuda_export(const char *name, void **handle)
{
    *handle = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
    return dlsym(*handle != NULL ? *handle : RTLD_DEFAULT, name);
}

static void dlclose_if(void *h)
{
    if (h != NULL)
        dlclose(h);
}

/* While this process's CUDA stand-in is checkpointed, wait for its
 * restore, as the real NVML does (checkpoint_standin.c). */
static void checkpoint_wait(void)
{
    void *h;
    void *sym = cuda_export("vramcap_standin_checkpoint_wait", &h);
    if (sym != NULL) {
        void (*fn)(void);
        memcpy(&fn, &sym, sizeof sym);
        fn();
    }
    dlclose_if(h);
}

/* Bytes this process's CUDA stand-in has accounted on device dev. */
static unsigned long long process_used(int dev)
{
    void *h;
    void *sym = cuda_export("vramcap_standin_used", &h);
    unsigned long long used = 0;
    if (sym != NULL) {
        size_t (*fn)(int);
        memcpy(&fn, &sym, sizeof sym);
        used = fn(dev);
    }
    dlclose_if(h);
    return used;
}

/* Whether this process has a context on device dev. */
static bool process_on(int dev)
{
    void *h;
    void *sym = cuda_export("vramcap_standin_contexts", &h);
    int n = 0;
    if (sym != NULL) {
        int (*fn)(int);
        memcpy(&fn, &sym, sizeof sym);
        n = fn(dev);
    }
    dlclose_if(h);
    return n > 0;
}

/* The device's memory in use: this process's plus the other processes'. */
static unsigned long long cuda_used(int dev)
{
    unsigned long long used = process_used(dev) +
        (unsigned long long)g_cfg.others * OTHER_BYTES + standin_foreign_bytes();
    return used > g_cfg.total_bytes ? g_cfg.total_bytes : used;
}

/*
 * Both entry points share this (rather than one calling the other), so that
 * a preloaded library exporting one of them can not interpose on the other.
 */
static nvmlReturn_t init_ref(void)
{
    checkpoint_wait();
    pthread_mutex_lock(&g_lock);
    g_init_refs++;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void)
{
    return init_ref();
}

/* The pre-v2 entry point; the stand-in does not tell them apart. */
nvmlReturn_t nvmlInit(void)
{
    return init_ref();
}

nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&g_lock);
    if (g_init_refs > 0) {
        g_init_refs--;
        rc = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* The driver's version: STANDIN_NVML_DRIVER_VERSION, else "580.95.05"
 * (the H200 machine's branch); NVML_ERROR_INSUFFICIENT_SIZE when it does
 * not fit with its NUL. */
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const char *v = getenv("STANDIN_NVML_DRIVER_VERSION");
    if (v == NULL)
        v = "580.95.05";
    if (strlen(v) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(version, v, strlen(v) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (deviceCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = g_cfg.devices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                           nvmlDevice_t *device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= g_cfg.devices)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}

/*
 * The checks that open most device queries: NVML_ERROR_UNINITIALIZED before
 * nvmlInit, NVML_ERROR_INVALID_ARGUMENT for an unknown device or a NULL out;
 * else NVML_SUCCESS with *dev the device's index.
 */
static nvmlReturn_t device_arg(nvmlDevice_t device, const void *out, int *dev)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    *dev = device_index(device);
    if (*dev < 0 || out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

/* int dev, the index of device, or a return of device_arg's error. */
#define DEVICE_ARG(dev, device, out)                                   \
    int dev;                                                           \
    do {                                                               \
        nvmlReturn_t arg_rc_ = device_arg((device), (out), &dev);      \
        if (arg_rc_ != NVML_SUCCESS)                                   \
            return arg_rc_;                                            \
    } while (0)

/* text (n bytes from snprintf) with its NUL into out, when it fits length. */
static nvmlReturn_t copy_text(char *out, unsigned int length, const char *text,
                              int n)
{
    if (n < 0 || (unsigned int)n >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, (size_t)n + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEVICE_ARG(dev, device, index);
    *index = (unsigned int)dev;
    return NVML_SUCCESS;
}

/* GPU-5ca1ab1e-0000-4000-8000-00000000000N, as cuDeviceGetUuid gives it. */
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid,
                               unsigned int length)
{
    DEVICE_ARG(dev, device, uuid);
    char text[NVML_DEVICE_UUID_BUFFER_SIZE];
    int n = snprintf(text, sizeof text,
                     "GPU-5ca1ab1e-0000-4000-8000-%012x", (unsigned int)dev);
    return copy_text(uuid, length, text, n);
}

/* "vramcap stand-in N", as cuDeviceGetName gives it. */
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name,
                               unsigned int length)
{
    DEVICE_ARG(dev, device, name);
    char text[64];
    int n = snprintf(text, sizeof text, "vramcap stand-in %d", dev);
    return copy_text(name, length, text, n);
}

/* The file the environment variable name names, open to read; NULL when it
 * is unset, empty or can not be opened. */
static FILE *open_env_file(const char *name)
{
    const char *path = getenv(name);
    if (path == NULL || *path == '\0')
        return NULL;
    return fopen(path, "r");
}

/* Whether STANDIN_NVML_LOST_FILE lists device dev now (see the top). */
static bool lost(int dev)
{
    FILE *f = open_env_file("STANDIN_NVML_LOST_FILE");
    if (f == NULL)
        return false;
    char text[256];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    for (char *p = text; *p != '\0';) {
        if (*p >= '0' && *p <= '9') {
            long v = strtol(p, &p, 10);
            if (v == dev)
                return true;
        } else {
            p++;
        }
    }
    return false;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEVICE_ARG(dev, device, memory);
    if (lost(dev))
        return NVML_ERROR_GPU_IS_LOST;
    unsigned long long used = cuda_used(dev);
    memory->total = g_cfg.total_bytes;
    memory->used = used;
    memory->free = g_cfg.total_bytes - used;
    return NVML_SUCCESS;
}

/* reserved is 0: the stand-in sets nothing aside. */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                        nvmlMemory_v2_t *memory)
{
    DEVICE_ARG(dev, device, memory);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used = cuda_used(dev);
    memory->total = g_cfg.total_bytes;
    memory->reserved = 0;
    memory->used = used;
    memory->free = g_cfg.total_bytes - used;
    return NVML_SUCCESS;
}

struct nvmlEventSet_st {
    bool registered[MAX_DEVICES];
    unsigned long delivered; /* lines of the Xid file delivered so far */
};
static struct nvmlEventSet_st g_event_set;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(&g_event_set, 0, sizeof g_event_set);
    *set = &g_event_set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device,
                                      unsigned long long eventTypes,
                                      nvmlEventSet_t set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    int dev = device_index(device);
    if (dev < 0 || set != &g_event_set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & nvmlEventTypeXidCriticalError)
        set->registered[dev] = true;
    return NVML_SUCCESS;
}

/* The next undelivered Xid line for a registered device, if any. */
static bool next_xid(nvmlEventSet_t set, int *dev, unsigned long long *xid)
{
    FILE *f = open_env_file("STANDIN_NVML_XID_FILE");
    if (f == NULL)
        return false;
    char line[128];
    unsigned long n = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        int d;
        unsigned long long x;
        if (sscanf(line, "%d %llu", &d, &x) != 2)
            continue;
        if (n++ < set->delivered)
            continue;
        set->delivered = n;
        if (d >= 0 && d < MAX_DEVICES && set->registered[d]) {
            *dev = d;
            *xid = x;
            found = true;
        }
    }
    fclose(f);
    return found;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (set != &g_event_set || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int waited = 0;; waited += 10) {
        int dev;
        unsigned long long xid;
        if (next_xid(set, &dev, &xid)) {
            memset(data, 0, sizeof *data);
            data->device = &g_devices[dev];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = xid;
            return NVML_SUCCESS;
        }
        if (waited >= timeoutms)
            return NVML_ERROR_TIMEOUT;
        struct timespec t = { 0, 10 * 1000 * 1000 };
        nanosleep(&t, NULL);
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    return set == &g_event_set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_cfg.devices; i++) {
        char text[NVML_DEVICE_UUID_BUFFER_SIZE];
        snprintf(text, sizeof text, "GPU-5ca1ab1e-0000-4000-8000-%012x", i);
        if (strcmp(text, uuid) == 0) {
            if (lost((int)i))
                return NVML_ERROR_GPU_IS_LOST;
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/*
 * The processes on the device (see the top): *infoCount in, the room in
 * infos; out, how many there are. Too little room (NULL infos included):
 * NVML_ERROR_INSUFFICIENT_SIZE with the count needed, as the real NVML.
 */
static nvmlReturn_t running_processes(nvmlDevice_t device,
                                      unsigned int *infoCount,
                                      nvmlProcessInfo_t *infos)
{
    DEVICE_ARG(dev, device, infoCount);
    bool self = process_on(dev);
    unsigned int n = (self ? 1u : 0u) + g_cfg.others;
    if (*infoCount < n || (n > 0 && infos == NULL)) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int k = 0;
    if (self)
        infos[k++] = (nvmlProcessInfo_t){
            .pid = g_cfg.pid >= 0 ? (unsigned int)g_cfg.pid
                                  : (unsigned int)getpid(),
            .usedGpuMemory = process_used(dev),
            .gpuInstanceId = NO_INSTANCE, .computeInstanceId = NO_INSTANCE };
    for (unsigned int i = 0; i < g_cfg.others; i++)
        infos[k++] = (nvmlProcessInfo_t){
            .pid = OTHER_PID_BASE + i, .usedGpuMemory = OTHER_BYTES,
            .gpuInstanceId = NO_INSTANCE, .computeInstanceId = NO_INSTANCE };
    *infoCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                     unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos);
}

/* The same layout as _v3 (nvmlProcessInfo_v2_t). */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                     unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos);
}

/* Works without nvmlInit, like the real one. */
const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument version mismatch";
    default:
        return "Unknown Error";
    }
}
