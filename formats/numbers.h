/* Internal: numbers in settings strings, strictly (PYTORCH_CUDA_ALLOC_CONF, the policies'
 * settings): a decimal integer with no sign and no trailing text, below 2^64; a finite
 * floating-point number. Header-only, for formats/ and sim/alloc/. */
#ifndef MEMSIM_FORMATS_NUMBERS_H
#define MEMSIM_FORMATS_NUMBERS_H

#include <glib.h>
#include <stdint.h>

static inline gboolean num_is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

static inline gboolean num_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !g_ascii_isdigit(*s))
        return FALSE;
    uint64_t v = 0;
    for (; *s; s++) {
        if (!g_ascii_isdigit(*s) || v > (UINT64_MAX - 9) / 10)
            return FALSE;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return TRUE;
}

static inline gboolean num_parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return FALSE;
    char *end = NULL;
    double v = g_ascii_strtod(s, &end);
    if (*end || !(v == v) || v > 1e300 || v < -1e300)
        return FALSE;
    *out = v;
    return TRUE;
}

#endif
