/* memsim — what the library exports. Every public function of include/memsim/ is declared
 * MEMSIM_API; the library is built with hidden visibility, so nothing else is exported from
 * libmemsim.so (tests/test_symbols.c holds the two lists against each other). */
#ifndef MEMSIM_API_H
#define MEMSIM_API_H

#if defined(__GNUC__)
#define MEMSIM_API __attribute__((visibility("default")))
#else
#define MEMSIM_API
#endif

#endif
