/* Internal: allocation sites as the text reports show them (report.c; compare.c uses it). */
#ifndef MEMSIM_SIM_SITES_H
#define MEMSIM_SIM_SITES_H

#include <memsim/sim.h>

/* "  who holds the memory WHAT:" and one line per site (bytes, blocks, the file's base name,
 * line and function, category), appended to s. Nothing when n is 0. */
void report_text_sites(GString *s, const char *what, const MemsimSite *x, uint32_t n);

#endif
