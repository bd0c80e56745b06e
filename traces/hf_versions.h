/* Internal: what differs between Hugging Face Transformers releases in the modelling code of
 * the families memsim models — one table (traces/hf_versions.c), rendered in
 * traces/transformers_versions.md (tests/test_hf_versions.c holds the two equal). */
#ifndef MEMSIM_TRACES_HF_VERSIONS_H
#define MEMSIM_TRACES_HF_VERSIONS_H

#include <glib.h>
#include <memsim/gen.h>
#include <stdbool.h>

typedef enum {
    HF_SDPA_DEFAULT,     /* attn_implementation defaults to "sdpa" (before: "eager") */
    HF_LOGITS_NOT_UPCAST, /* the forward returns logits in the model's dtype; the loss is
                           * loss_function (ForCausalLMLoss), which upcasts a copy (before:
                           * logits.float() in the forward, the loss shifting a fp32 copy) */
    N_HF_RULES
} HfRuleId;

typedef struct {
    const char *name;     /* the rule's key in the table */
    int since;            /* the first release with the new behaviour: major·1000 + minor */
    const char *families; /* the model families (memsim's) it applies to */
    const char *before;   /* the code before */
    const char *after;    /* the code since */
    const char *upstream; /* the file in huggingface/transformers */
    const char *evidence; /* where the version comes from */
} HfRule;

/* The newest release memsim models (the default), as major·1000 + minor. */
#define HF_NEWEST 5000

const HfRule *hf_rule(guint i);
/* Whether rule `id`'s new behaviour applies to the run's Transformers release (the newest
 * when none was given). */
bool hf_since(const MemsimRun *run, HfRuleId id);
/* "4.45" → 4045; FALSE when it is not a release memsim models (4.31 … 5.x). */
gboolean hf_version_parse(const char *v, int *out);

#endif
