/*
 * standin_env.h - what cuda_standin.c and nvml_standin.c read from the
 * environment, read the same way by both: the device limits and defaults,
 * and env_long.
 */
#ifndef STANDIN_ENV_H
#define STANDIN_ENV_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_DEVICES 8                 /* STANDIN_DEVICES: 0..8 */
#define DEFAULT_DEVICES 2
#define DEFAULT_TOTAL_MIB 16384       /* STANDIN_TOTAL_MIB: 1..MAX_TOTAL_MIB */
#define MAX_TOTAL_MIB (256 * 1024)    /* keeps live memory well inside a window */

/*
 * Read an integer environment variable: def when unset or malformed, clamped
 * to [min, max] when out of range; with warn, a warning on stderr in both of
 * those cases.
 */
static inline long env_long(const char *name, long def, long min, long max,
                            bool warn)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0')
        return def;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || errno != 0) {
        if (warn)
            fprintf(stderr, "standin: ignoring %s=%s (not a number), using %ld\n",
                    name, s, def);
        return def;
    }
    if (v < min || v > max) {
        long clamped = v < min ? min : max;
        if (warn)
            fprintf(stderr, "standin: %s=%s out of range %ld..%ld, using %ld\n",
                    name, s, min, max, clamped);
        return clamped;
    }
    return v;
}

/*
 * What other processes hold on every device (parking's tests): the number
 * of MiB in the file STANDIN_FOREIGN_FILE names, read at each call; 0
 * without the variable or the file. The CUDA stand-in's restore needs room
 * beside it, and the NVML stand-in counts it as used.
 */
static inline unsigned long long standin_foreign_bytes(void)
{
    const char *path = getenv("STANDIN_FOREIGN_FILE");
    if (path == NULL)
        return 0;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    unsigned long long mib = 0;
    if (fscanf(f, "%llu", &mib) != 1)
        mib = 0;
    fclose(f);
    return mib << 20;
}

#endif
