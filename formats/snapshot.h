/* Internal: PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) → memsim trace.
 *
 * One rank per device that has a trace (rank = device index). The recorded allocator
 * settings become the header's alloc_conf; each rank's final reserved and allocated bytes
 * become its `final_*` fields. A trace that begins mid-run (the ring buffer overflowed) gets
 * INIT_SEGMENT / INIT_BLOCK events rebuilt from the snapshot's segments and the trace.
 */
#ifndef MEMSIM_FORMATS_SNAPSHOT_H
#define MEMSIM_FORMATS_SNAPSHOT_H

#include <memsim/trace.h>
#include "formats/pickle.h"

/* Returns a new trace or NULL with error set (naming the file and the record). */
MemsimTrace *memsim_snapshot_load(const char *path, GError **error);
MemsimTrace *memsim_snapshot_from_pickle(MemsimPyDoc *doc, const char *name, GError **error);
/* TRUE when the bytes look like a pickle (protocol 2 or later). */
gboolean memsim_snapshot_sniff(const guint8 *data, gsize len);

#endif
