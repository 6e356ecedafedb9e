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

#define MIB (1ULL << 20)

static struct {
    unsigned int devices;
    unsigned long long total_bytes;
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
    for (unsigned int i = 0; i < MAX_DEVICES; i++)
        g_devices[i].index = i;
}

static bool initialized(void)
{
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
 * Bytes the CUDA stand-in has accounted on device dev: looked up each time,
 * so it does not matter whether libcuda.so.1 was loaded before or after this
 * library, or with RTLD_LOCAL. 0 when it is not loaded.
 */
static unsigned long long cuda_used(int dev)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
    void *sym = dlsym(h != NULL ? h : RTLD_DEFAULT, "vramcap_standin_used");
    unsigned long long used = 0;
    if (sym != NULL) {
        size_t (*fn)(int);
        memcpy(&fn, &sym, sizeof sym);
        used = fn(dev);
    }
    if (h != NULL)
        dlclose(h);
    return used > g_cfg.total_bytes ? g_cfg.total_bytes : used;
}

/*
 * Both entry points share this (rather than one calling the other), so that
 * a preloaded library exporting one of them can not interpose on the other.
 */
static nvmlReturn_t init_ref(void)
{
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

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    int dev = device_index(device);
    if (dev < 0 || index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)dev;
    return NVML_SUCCESS;
}

/* GPU-5ca1ab1e-0000-4000-8000-00000000000N, as cuDeviceGetUuid gives it. */
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid,
                               unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    int dev = device_index(device);
    if (dev < 0 || uuid == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    char text[NVML_DEVICE_UUID_BUFFER_SIZE];
    int n = snprintf(text, sizeof text,
                     "GPU-5ca1ab1e-0000-4000-8000-%012x", (unsigned int)dev);
    if (n < 0 || (unsigned int)n >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, text, (size_t)n + 1);
    return NVML_SUCCESS;
}

/* "vramcap stand-in N", as cuDeviceGetName gives it. */
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name,
                               unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    int dev = device_index(device);
    if (dev < 0 || name == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    char text[64];
    int n = snprintf(text, sizeof text, "vramcap stand-in %d", dev);
    if (n < 0 || (unsigned int)n >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(name, text, (size_t)n + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    int dev = device_index(device);
    if (dev < 0 || memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
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
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    int dev = device_index(device);
    if (dev < 0 || memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used = cuda_used(dev);
    memory->total = g_cfg.total_bytes;
    memory->reserved = 0;
    memory->used = used;
    memory->free = g_cfg.total_bytes - used;
    return NVML_SUCCESS;
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
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument version mismatch";
    default:
        return "Unknown Error";
    }
}
