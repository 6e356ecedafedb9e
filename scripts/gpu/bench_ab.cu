// bench_ab: the shim's cost on cuMemAlloc_v2+cuMemFree_v2 pairs, measured
// side by side in ONE process, so that what varies between processes (and
// on this machine the 1 GiB pair alone varies by almost 2x from one process
// to the next) cancels out.
//
// Run under LD_PRELOAD=libvramcap.so. "hooked" functions are what a program
// gets from dlsym on the driver's handle (the shim's hooks); "real" ones are
// the driver's own symbols, found by reading libcuda's dynamic symbol table
// from the file and adding its load address (no API of the shim's hands them
// out). Pairs alternate hooked/real (order flipped every iteration). Without
// the shim both are the driver's own, which shows the noise floor (ratio ~1).
//
// Output: "AB size=N iters=I hooked_median_us=… real_median_us=… ratio=…
// delta_us=… hooked_lib=… real_lib=…". Exit 1 on any error.
#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef CUresult (*AllocFn)(CUdeviceptr *, size_t);
typedef CUresult (*FreeFn)(CUdeviceptr);

static std::string lib_of(void *p) {
    Dl_info i;
    if (p == NULL || dladdr(p, &i) == 0 || i.dli_fname == NULL) return "?";
    const char *s = strrchr(i.dli_fname, '/');
    return s ? s + 1 : i.dli_fname;
}

// Looks `name` up in the .dynsym of the ELF file `path` loaded at `base`.
static void *elf_symbol(const char *path, unsigned long base, const char *name) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    std::vector<unsigned char> buf;
    unsigned char tmp[1 << 16];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) buf.insert(buf.end(), tmp, tmp + n);
    fclose(f);
    if (buf.size() < sizeof(Elf64_Ehdr)) return NULL;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)buf.data();
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64) return NULL;
    if (eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > buf.size()) return NULL;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(buf.data() + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; ++i) {
        if (sh[i].sh_type != SHT_DYNSYM) continue;
        const Elf64_Shdr &strs = sh[sh[i].sh_link];
        if (sh[i].sh_offset + sh[i].sh_size > buf.size() || strs.sh_offset + strs.sh_size > buf.size()) return NULL;
        const Elf64_Sym *syms = (const Elf64_Sym *)(buf.data() + sh[i].sh_offset);
        size_t count = sh[i].sh_size / sizeof(Elf64_Sym);
        const char *str = (const char *)(buf.data() + strs.sh_offset);
        for (size_t k = 0; k < count; ++k) {
            if (syms[k].st_name < strs.sh_size && syms[k].st_value != 0 && strcmp(str + syms[k].st_name, name) == 0)
                return (void *)(base + syms[k].st_value);
        }
    }
    return NULL;
}

typedef std::chrono::steady_clock Clock;

static double pair(AllocFn a, FreeFn f, size_t size) {
    CUdeviceptr d = 0;
    Clock::time_point t0 = Clock::now();
    CUresult r = a(&d, size);
    if (r != 0) {
        printf("ERROR alloc size=%zu rc=%d\n", size, r);
        exit(1);
    }
    r = f(d);
    Clock::time_point t1 = Clock::now();
    if (r != 0) {
        printf("ERROR free size=%zu rc=%d\n", size, r);
        exit(1);
    }
    return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    if (!(scale > 0.0) || scale > 100.0) scale = 1.0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("ERROR dlopen %s\n", dlerror());
        return 1;
    }
    void *init = dlsym(h, "cuInit");
    Dl_info di;
    if (!init || dladdr(init, &di) == 0) {
        printf("ERROR no cuInit\n");
        return 1;
    }
    AllocFn hooked_alloc = (AllocFn)dlsym(h, "cuMemAlloc_v2");
    FreeFn hooked_free = (FreeFn)dlsym(h, "cuMemFree_v2");
    AllocFn real_alloc = (AllocFn)elf_symbol(di.dli_fname, (unsigned long)di.dli_fbase, "cuMemAlloc_v2");
    FreeFn real_free = (FreeFn)elf_symbol(di.dli_fname, (unsigned long)di.dli_fbase, "cuMemFree_v2");
    if (!hooked_alloc || !hooked_free || !real_alloc || !real_free) {
        printf("ERROR cannot resolve hooked=%p/%p real=%p/%p\n", (void *)hooked_alloc, (void *)hooked_free,
               (void *)real_alloc, (void *)real_free);
        return 1;
    }
    if (lib_of((void *)real_alloc) != lib_of(init)) {
        printf("ERROR real cuMemAlloc_v2 resolved into %s, not %s\n", lib_of((void *)real_alloc).c_str(),
               lib_of(init).c_str());
        return 1;
    }
    CUresult (*cuInit)(unsigned) = (CUresult(*)(unsigned))init;
    CUresult (*get)(int *, int) = (CUresult(*)(int *, int))dlsym(h, "cuDeviceGet");
    CUresult (*retain)(void **, int) = (CUresult(*)(void **, int))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(void *) = (CUresult(*)(void *))dlsym(h, "cuCtxSetCurrent");
    int dev = 0;
    void *ctx = NULL;
    if (cuInit(0) || get(&dev, 0) || retain(&ctx, dev) || set(ctx)) {
        printf("ERROR init\n");
        return 1;
    }
    const size_t sizes[4] = {4096ull, 1ull << 20, 64ull << 20, 1ull << 30};
    const int iters[4] = {3000, 3000, 400, 100};
    for (int s = 0; s < 4; ++s) {
        int n = std::max(10, (int)(iters[s] * scale));
        for (int w = 0; w < 10; ++w) {
            pair(hooked_alloc, hooked_free, sizes[s]);
            pair(real_alloc, real_free, sizes[s]);
        }
        std::vector<double> hk, rl;
        for (int i = 0; i < n; ++i) {
            if (i % 2) {
                hk.push_back(pair(hooked_alloc, hooked_free, sizes[s]));
                rl.push_back(pair(real_alloc, real_free, sizes[s]));
            } else {
                rl.push_back(pair(real_alloc, real_free, sizes[s]));
                hk.push_back(pair(hooked_alloc, hooked_free, sizes[s]));
            }
        }
        double mh = median(hk), mr = median(rl);
        printf("AB size=%zu iters=%d hooked_median_us=%.3f real_median_us=%.3f ratio=%.4f delta_us=%+.3f hooked_lib=%s real_lib=%s\n",
               sizes[s], n, mh, mr, mh / mr, mh - mr, lib_of((void *)hooked_alloc).c_str(),
               lib_of((void *)real_alloc).c_str());
    }
    printf("DONE\n");
    return 0;
}
