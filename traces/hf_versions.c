/* What differs between Hugging Face Transformers releases in the modelling code memsim
 * generates (traces/hf_versions.h). Each row gives the release where the behaviour changed,
 * the upstream file and the evidence for that release; traces/transformers_versions.md
 * renders the table (tests/test_hf_versions.c compares the two). A difference not in this
 * table is not modelled: every release runs the newest code for it. */
#include "traces/hf_versions.h"

#include <stdio.h>

static const HfRule rules[N_HF_RULES] = {
    [HF_SDPA_DEFAULT] = {
        .name = "sdpa-default",
        .since = 4036,
        .families = "llama",
        .before = "attn_implementation left unset means eager attention (LlamaAttention: "
                  "matmul, softmax, matmul)",
        .after = "attn_implementation left unset means sdpa when torch >= 2.1.1 "
                 "(PreTrainedModel._check_and_enable_sdpa; LlamaSdpaAttention)",
        .upstream = "src/transformers/modeling_utils.py, src/transformers/models/llama/"
                    "modeling_llama.py",
        .evidence = "PR #26572 (SDPA for Llama, merged into main for 4.36); PR #27940 "
                    "(SDPA dispatch fix, cherry-picked for the 4.36 release on 2023-12-11)",
    },
    [HF_LOGITS_NOT_UPCAST] = {
        .name = "logits-not-upcast",
        .since = 4046,
        .families = "llama",
        .before = "LlamaForCausalLM.forward: logits = self.lm_head(hidden_states[:, "
                  "-num_logits_to_keep:, :]).float(); the loss in the forward: shift_logits = "
                  "logits[..., :-1, :].contiguous(), CrossEntropyLoss on its view",
        .after = "logits in the model's dtype; loss = self.loss_function(...) "
                 "(ForCausalLMLoss: logits.float(), the labels padded and shifted)",
        .upstream = "src/transformers/models/llama/modeling_llama.py, "
                    "src/transformers/loss/loss_utils.py",
        .evidence = "4.45's code: '# TODO: remove the float() operation in v4.46'; PR #33902 "
                    "(removes it, 'given that 4.45 has been released and 4.46 is next'); "
                    "issue #35066 (4.46.1's LlamaForCausalLM without the shift)",
    },
};

const HfRule *hf_rule(guint i)
{
    return i < N_HF_RULES ? &rules[i] : NULL;
}

bool hf_since(const MemsimRun *run, HfRuleId id)
{
    g_assert(id < N_HF_RULES);
    int v = run->transformers_version ? run->transformers_version : HF_NEWEST;
    return v >= rules[id].since;
}

gboolean hf_version_parse(const char *v, int *out)
{
    /* MAJOR.MINOR or MAJOR.MINOR.PATCH (a patch release runs its minor's code) */
    int maj = -1, min = -1, patch = -1, n = 0;
    if (sscanf(v, "%d.%d%n", &maj, &min, &n) != 2 || min < 0 || min > 999)
        return FALSE;
    if (v[n] == '.') {
        int m = 0;
        if (sscanf(v + n + 1, "%d%n", &patch, &m) != 1 || patch < 0)
            return FALSE;
        n += 1 + m;
    }
    if (v[n] || !((maj == 4 && min >= 31) || maj == 5))
        return FALSE;
    *out = maj * 1000 + min;
    return TRUE;
}
