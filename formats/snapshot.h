/* Internal: PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) → memsim trace.
 *
 * One rank per device that has a trace (rank = device index). The recorded allocator
 * settings become the header's alloc_conf; each rank's final reserved and allocated bytes
 * become its `final_*` fields. A trace that begins mid-run (the ring buffer overflowed) gets
 * INIT_SEGMENT / INIT_BLOCK events rebuilt from the snapshot's segments and the trace.
 */
#ifndef MEMSIM_FORMATS_SNAPSHOT_H
#define MEMSIM_FORMATS_SNAPSHOT_H

#include <memsim/formats.h>
#include <memsim/trace.h>
#include "formats/pickle.h"

typedef struct {
    /* (optional) Bytes read from the file so far (compressed bytes for a compressed
     * file), updated as the reader goes, for a progress display; not owned. */
    guint64 *bytes_read;
} MemsimSnapshotReadOptions;

/* The streaming reader (snapshot_stream.c): a plain, zstd or gzip pickle (told by its first
 * bytes). Returns a new trace or NULL with error set (naming the file, the byte or the
 * record). `opt` may be NULL. */
MemsimTrace *memsim_snapshot_read(const char *path, const MemsimSnapshotReadOptions *opt,
                                  GError **error);
/* The same as a reader (format MEMSIM_FORMAT_SNAPSHOT): the trace entries stay coded as
 * parsed (about 5 bytes each: snapshot_stream.c's encode) and each rank's events are made
 * from them chunk by chunk as the reader is read, so that a replay never holds them all. */
MemsimTraceReader *memsim_snapshot_reader(const char *path, const MemsimSnapshotReadOptions *opt,
                                          GError **error);
/* The whole trace of such a reader that has not been read from (each rank's events made at
 * once); the reader is left empty. NULL when `r` is not one. */
MemsimTrace *memsim_snapshot_reader_take(MemsimTraceReader *r);
/* The same on an uncompressed pickle in memory; `name` names it in messages. */
MemsimTrace *memsim_snapshot_read_bytes(const guint8 *data, gsize len, const char *name,
                                        GError **error);
/* TRUE when the bytes start a zstd frame or a gzip member (a compressed snapshot). */
gboolean memsim_snapshot_sniff_compressed(const guint8 *data, gsize len);

/* TRUE when the file is a snapshot pickle: plain, or zstd / gzip with a pickle inside. */
gboolean memsim_snapshot_sniff_path(const char *path);

/* memsim_snapshot_read() with no options. */
MemsimTrace *memsim_snapshot_load(const char *path, GError **error);

/* The odd facts a snapshot reader reads anyway (snapshot_odd.c): noted as they are met, one
 * warning line per kind (its count, where the first one is and what it says) and each
 * device's count of inconsistencies (device < 0: not an inconsistency of a device's
 * recording) go into the trace's header at the end. */
typedef struct {
    GArray *odd;
    GHashTable *by_kind; /* kind → index in odd */
    GHashTable *per_dev; /* device → inconsistencies (uint64_t *) */
} MemsimSnapOdd;

void memsim_snap_odd_init(MemsimSnapOdd *o);
void memsim_snap_odd_note(MemsimSnapOdd *o, int64_t device, const char *kind, const char *where,
                          const char *msg);
/* The header's warnings (each naming `file`) and the ranks' n_inconsistent. */
void memsim_snap_odd_finish(const MemsimSnapOdd *o, MemsimTrace *t, const char *file);
void memsim_snap_odd_clear(MemsimSnapOdd *o);

/* The reference reader: the whole object tree (pickle.c), then the trace. The tests compare
 * the streaming reader against it. */
MemsimTrace *memsim_snapshot_load_tree(const char *path, GError **error);
MemsimTrace *memsim_snapshot_from_pickle(MemsimPyDoc *doc, const char *name, GError **error);
/* TRUE when the bytes look like a pickle (protocol 2 or later). */
gboolean memsim_snapshot_sniff(const guint8 *data, gsize len);

#endif
