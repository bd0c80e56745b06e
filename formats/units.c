/* Sizes as people write and read them (include/memsim/units.h): "80GiB" in, "1.50 GiB" out. */
#include <memsim/units.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

gboolean memsim_parse_size_of(const char *key, const char *text, memsim_size_t *bytes,
                              GError **error)
{
    if (memsim_parse_size(text, bytes, error))
        return TRUE;
    g_prefix_error(error, "%s: ", key);
    return FALSE;
}

gboolean memsim_parse_size(const char *text, memsim_size_t *bytes, GError **error)
{
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
        {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
        {"K", 1024.0},   {"M", 1048576.0},   {"G", 1073741824.0},   {"T", 1099511627776.0},
        {"B", 1.0},      {"", 1.0},
    };
    if (!text || !*text)
        goto bad;
    char *end = NULL;
    errno = 0;
    double v = g_ascii_strtod(text, &end);
    if (errno || end == text || !(v >= 0) || isinf(v))
        goto bad;
    while (*end == ' ')
        end++;
    for (gsize i = 0; i < G_N_ELEMENTS(units); i++) {
        if (g_ascii_strcasecmp(end, units[i].suffix) == 0 ||
            (units[i].suffix[0] && strcmp(end, units[i].suffix) == 0)) {
            double b = v * units[i].mult;
            if (b >= 18446744073709551615.0)
                goto bad;
            *bytes = (memsim_size_t)llround(b);
            return TRUE;
        }
    }
bad:
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                "'%s' is not a size (expected a number with an optional unit: 80GiB, 40GB, "
                "512MiB, 1048576)",
                text ? text : "");
    return FALSE;
}

const char *memsim_format_bytes(memsim_size_t b, char *buf, gsize len)
{
    /* PyTorch's format_size: ≤1024 → bytes, ≤1 MiB → KiB, ≤1 GiB → MiB, else GiB. */
    if (b <= 1024)
        g_snprintf(buf, len, "%" PRIu64 " bytes", b);
    else if (b <= ((memsim_size_t)1 << 20))
        g_snprintf(buf, len, "%.2f KiB", (double)b / 1024.0);
    else if (b <= ((memsim_size_t)1 << 30))
        g_snprintf(buf, len, "%.2f MiB", (double)b / 1048576.0);
    else
        g_snprintf(buf, len, "%.2f GiB", (double)b / 1073741824.0);
    return buf;
}
