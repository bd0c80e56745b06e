/* The syntax of the text form's event lines (formats/text.h; spec: formats/README.md): the
 * table that the writer (text_write.c) and the reader (text_read.c) both follow, so that
 * what one writes the other reads.
 */
#include "formats/text.h"

const char *const memsim_text_raw_keys[F_COUNT] = {"id",  "size",   "addr", "aux",
                                                   "cat", "stream", "flags"};

/* The table reads best one kind to a block. */
// clang-format off
#define STREAM_OPT {"stream", F_STREAM, SHOW_NONZERO, 0, 0}
#define STREAM_SHOW {"stream", F_STREAM, SHOW_ALWAYS, 0, 0}
#define STREAM_REQ {"stream", F_STREAM, REQUIRED, 0, 0}
#define SEGMENT_SYNTAX(name)                                                                   \
    {name " addr=ADDR size=BYTES [stream=S]", POS_NONE, 3, 0,                                  \
     {{"addr", F_ADDR, REQUIRED, 1, 0}, {"size", F_SIZE, REQUIRED, 0, 0}, STREAM_OPT}, {{0}}}

const KindSyntax memsim_text_syntax[MEMSIM_EV_KIND_MAX + 1] = {
    [MEMSIM_EV_ALLOC] = {"alloc t=ID size=BYTES [stream=S] [cat=CATEGORY] [addr=ADDR]",
                         POS_NONE,
                         5,
                         0,
                         {{"t", F_ID, REQUIRED, 0, 0},
                          {"size", F_SIZE, REQUIRED, 0, 0},
                          STREAM_SHOW,
                          {"cat", F_CAT, SHOW_ALWAYS, 0, 0},
                          {"addr", F_ADDR, SHOW_NONZERO, 1, MEMSIM_EVF_ADDR}},
                         {{0}}},
    [MEMSIM_EV_FREE] = {"free t=ID [stream=S]", POS_NONE, 2, 0,
                        {{"t", F_ID, REQUIRED, 0, 0}, STREAM_OPT}, {{0}}},
    [MEMSIM_EV_USE] = {"use t=ID stream=S", POS_NONE, 2, 0,
                       {{"t", F_ID, REQUIRED, 0, 0}, STREAM_REQ}, {{0}}},
    [MEMSIM_EV_OP] = {"op INDEX [stream=S]", POS_NUMBER, 1, 0, {STREAM_OPT}, {{0}}},
    [MEMSIM_EV_WAIT] = {"wait stream=S on=S", POS_NONE, 2, 0,
                        {STREAM_REQ, {"on", F_ID, REQUIRED, 0, 0}}, {{0}}},
    [MEMSIM_EV_COLLECTIVE] = {"collective KIND bytes=BYTES group=ID [peer=R] [stream=S]",
                              POS_COLLECTIVE,
                              4,
                              0,
                              {{"bytes", F_SIZE, REQUIRED, 0, 0},
                               {"group", F_ID, REQUIRED, 0, 0},
                               {"peer", F_ADDR, SHOW_NONZERO, 0, MEMSIM_EVF_PEER},
                               STREAM_SHOW},
                              {{0}}},
    [MEMSIM_EV_EMPTY_CACHE] = {"empty_cache [inferred] [stream=S]", POS_NONE, 1, 1,
                               {STREAM_OPT}, {{"inferred", F_FLAGS, MEMSIM_EVF_INFERRED}}},
    [MEMSIM_EV_MARK] = {"mark STRING-INDEX|\"TEXT\" [stream=S]", POS_MARK, 1, 0, {STREAM_OPT},
                        {{0}}},
    [MEMSIM_EV_SEG_ALLOC] = SEGMENT_SYNTAX("segment_alloc"),
    [MEMSIM_EV_SEG_FREE] = SEGMENT_SYNTAX("segment_free"),
    [MEMSIM_EV_SEG_MAP] = SEGMENT_SYNTAX("segment_map"),
    [MEMSIM_EV_SEG_UNMAP] = SEGMENT_SYNTAX("segment_unmap"),
    [MEMSIM_EV_OOM] = {"oom size=BYTES free=BYTES [stream=S]", POS_NONE, 3, 0,
                       {{"size", F_SIZE, REQUIRED, 0, 0}, {"free", F_ADDR, REQUIRED, 0, 0},
                        STREAM_OPT},
                       {{0}}},
    [MEMSIM_EV_INIT_SEGMENT] = {"init_segment addr=ADDR size=BYTES [stream=S] [small] "
                                "[expandable]",
                                POS_NONE,
                                3,
                                2,
                                {{"addr", F_ADDR, REQUIRED, 1, 0},
                                 {"size", F_SIZE, REQUIRED, 0, 0},
                                 STREAM_SHOW},
                                {{"small", F_AUX, MEMSIM_SEGF_SMALL},
                                 {"expandable", F_AUX, MEMSIM_SEGF_EXPANDABLE}}},
    [MEMSIM_EV_INIT_BLOCK] = {"init_block t=ID addr=ADDR size=BYTES block=BYTES [stream=S] "
                              "[cat=CATEGORY]",
                              POS_NONE,
                              6,
                              0,
                              {{"t", F_ID, REQUIRED, 0, 0},
                               {"addr", F_ADDR, REQUIRED, 1, 0},
                               {"size", F_SIZE, REQUIRED, 0, 0},
                               {"block", F_AUX, REQUIRED, 0, 0},
                               STREAM_SHOW,
                               {"cat", F_CAT, SHOW_ALWAYS, 0, 0}},
                              {{0}}},
    [MEMSIM_EV_REPEAT] = {"repeat events=K times=N from=ID shift=D [steps] [stream=S]",
                          POS_NONE,
                          5,
                          1,
                          {{"events", F_SIZE, REQUIRED, 0, 0},
                           {"times", F_AUX, REQUIRED, 0, 0},
                           {"from", F_ID, REQUIRED, 0, 0},
                           {"shift", F_ADDR, REQUIRED, 0, 0},
                           STREAM_OPT},
                          {{"steps", F_FLAGS, MEMSIM_EVF_STEPS}}},
};
// clang-format on
