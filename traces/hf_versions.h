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
    HF_SDPA_DEFAULT_MISTRAL, /* the same for Mistral and Mixtral, one release later */
    HF_SDPA_DEFAULT_NEOX,    /* the same for GPT-NeoX */
    HF_CAUSAL_MASK_MAX_POS,  /* 4.38's Llama: a (max_pos, max_pos) causal-mask buffer, the
                              * mask built at that size each forward, indexed per layer */
    HF_MODEL_MISTRAL,        /* model_type mistral exists (before: refused, KeyError) */
    HF_MODEL_MIXTRAL,        /* model_type mixtral exists */
    HF_MODEL_QWEN2,          /* model_type qwen2 exists */
    HF_LOGITS_NOT_UPCAST, /* the forward returns logits in the model's dtype; the loss is
                           * loss_function (ForCausalLMLoss), which upcasts a copy (before:
                           * logits.float() in the forward, the loss shifting a fp32 copy) */
    N_HF_RULES
} HfRuleId;

typedef struct {
    const char *name;     /* the rule's key in the table */
    int since;            /* the first release with the new behaviour: major·1000 + minor */
    int until;            /* the first release without it again (0: none) */
    const char *families; /* the config.json model_type values it applies to, comma-separated
                           * (a model_type not listed runs the newest code) */
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
/* Whether rule `id` lists the model's model_type. */
bool hf_applies(const MemsimModel *m, HfRuleId id);
/* Whether the model runs rule `id`'s old code: the rule lists its model_type and the run's
 * release is before the rule's. */
bool hf_before(const MemsimRun *run, const MemsimModel *m, HfRuleId id);
/* Whether the model runs rule `id`'s new code: the rule lists its model_type and the run's
 * release is in [since, until). */
bool hf_within(const MemsimRun *run, const MemsimModel *m, HfRuleId id);
/* Whether any rule lists the model's model_type (else --transformers-version changes nothing
 * for it and is refused). */
bool hf_any_rule(const MemsimModel *m);
/* Whether the run's release has the model's model_type (the model-type rows); FALSE with
 * the release that first has it in *first. */
bool hf_model_type_exists(const MemsimRun *run, const MemsimModel *m, int *first);
/* Whether the run's release leaves attn_implementation unset at "sdpa" for the model (the
 * sdpa-default rows); TRUE for a model_type no such row lists. */
bool hf_sdpa_default(const MemsimRun *run, const MemsimModel *m);
/* "4.45" → 4045; FALSE when it is not a release memsim models (4.31 … 5.x). */
gboolean hf_version_parse(const char *v, int *out);

#endif
