/* A Megatron-LM launch: its flags read and mapped to a run (include/memsim/megatron.h). */
#include "traces/megatron.h"

int64_t mg_padded_vocab(const MgOptions *o, int tp)
{
    /* arguments.py / build_tokenizer.py: the vocabulary padded to a multiple of
     * make_vocab_size_divisible_by × tp */
    int64_t mult = (o->vocab_divisor ? o->vocab_divisor : 128) * (int64_t)tp;
    return (o->vocab + mult - 1) / mult * mult;
}
