/* What differs between Hugging Face Transformers releases in the modelling code memsim
 * generates (traces/hf_versions.h). Each row gives the release where the behaviour changed,
 * the upstream file and the evidence for that release; traces/transformers_versions.md
 * renders the table (tests/test_hf_versions.c compares the two). A difference not in this
 * table is not modelled: every release runs the newest code for it. */
#include "traces/hf_versions.h"
#include "traces/model.h"

#include <stdio.h>
#include <string.h>

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
    [HF_SDPA_DEFAULT_MISTRAL] = {
        .name = "sdpa-default-mistral",
        .since = 4037,
        .families = "mistral,mixtral",
        .before = "MistralModel / MixtralModel: eager (MistralAttention: matmul, softmax in "
                  "fp32, matmul) or flash_attention_2 when asked; no SDPA class",
        .after = "MistralSdpaAttention / MixtralSdpaAttention, the default when "
                 "attn_implementation is left unset",
        .upstream = "src/transformers/models/mistral/modeling_mistral.py, "
                    "src/transformers/models/mixtral/modeling_mixtral.py",
        .evidence = "PR #28133 ([Mixtral & Mistral] Add support for sdpa), opened 2023-12-19, "
                    "after the 4.36.0 release (2023-12-11, the first with Mixtral); Qwen2, new "
                    "in 4.37, copies MistralSdpaAttention ('Copied from ... MistralSdpaAttention "
                    "with Mistral->Qwen2')",
    },
    [HF_SDPA_DEFAULT_NEOX] = {
        .name = "sdpa-default-gpt-neox",
        .since = 4042,
        .families = "gpt_neox",
        .before = "GPTNeoXAttention._attn: eager (scores of q and k, causal where, softmax, "
                  "matmul); no SDPA class (from_pretrained(attn_implementation='sdpa') raises)",
        .after = "GPTNeoXSdpaAttention, the default when attn_implementation is left unset",
        .upstream = "src/transformers/models/gpt_neox/modeling_gpt_neox.py",
        .evidence = "PR #31031 ([GPT-NeoX] Add SDPA support); its author on EleutherAI/sparsify "
                    "issue #1 (2024-06-27): 'It has been added now in v4.42.0'; the same issue "
                    "quotes 4.41's 'GPTNeoXForCausalLM does not support ... "
                    "scaled_dot_product_attention yet'",
    },
    [HF_CAUSAL_MASK_MAX_POS] = {
        .name = "causal-mask-max-pos",
        .since = 4038,
        .until = 4039,
        .families = "llama",
        .before = "no such buffer; the mask made at the sequence's size (4.37: "
                  "_prepare_4d_causal_attention_mask_for_sdpa, None without padding, so SDPA "
                  "runs is_causal; from 4.39 as memsim's newest code)",
        .after = "LlamaModel.__init__ registers causal_mask = triu(full((P, P), True)) for "
                 "P = max_position_embeddings; _update_causal_mask makes causal_mask[None, "
                 "None].repeat(B, 1, 1, 1).to(dtype) * min_dtype, (B,1,P,P), each forward; "
                 "every attention indexes it, causal_mask[:, :, cache_position, :S] (a copy), "
                 "and passes that to SDPA as attn_mask (no flash kernel; the mask saved)",
        .upstream = "src/transformers/models/llama/modeling_llama.py",
        .evidence = "InternLM/xtuner PR #531 ('Limit transformers != 4.38', 2024-03-29, citing "
                    "v4.38.0 modeling_llama.py L921-923, the registered causal mask); issue "
                    "#29484 (4.37.2 -> 4.38.2 out of memory: 'we had to change how the causal "
                    "mask was initialized'); PR #29753 ('[BC 4.37 -> 4.38] for Llama family, "
                    "memory and speed', fixes #29484), merged 2024-03-20 for 4.39",
    },
    [HF_MODEL_MISTRAL] = {
        .name = "model-type-mistral",
        .since = 4034,
        .families = "mistral",
        .before = "no MistralConfig: AutoConfig raises KeyError: 'mistral' (memsim refuses the "
                  "run)",
        .after = "MistralForCausalLM",
        .upstream = "src/transformers/models/mistral/modeling_mistral.py",
        .evidence = "issue #26495 (2023-10-02: 'We'll be releasing v4.34.0 tomorrow. Mistral "
                    "cannot be added to v4.33 through a patch'; later 'v4.34 with Mistral "
                    "support was release[d]')",
    },
    [HF_MODEL_MIXTRAL] = {
        .name = "model-type-mixtral",
        .since = 4036,
        .families = "mixtral",
        .before = "no MixtralConfig: KeyError: 'mixtral' (memsim refuses the run)",
        .after = "MixtralForCausalLM",
        .upstream = "src/transformers/models/mixtral/modeling_mixtral.py",
        .evidence = "vllm-project/vllm PR #2046 (2023-12-12: '4.36.0 is required to support "
                    "Mixtral'); h2oai/h2o-llmstudio issue #536 (2023-12-11: the v4.36.0 release "
                    "out with it)",
    },
    [HF_MODEL_QWEN2] = {
        .name = "model-type-qwen2",
        .since = 4037,
        .families = "qwen2",
        .before = "no Qwen2Config: KeyError: 'qwen2' (memsim refuses the run)",
        .after = "Qwen2ForCausalLM",
        .upstream = "src/transformers/models/qwen2/modeling_qwen2.py",
        .evidence = "QwenLM/Qwen3 issues #30 and #247 (the Qwen maintainers: 'install "
                    "transformers>=4.37.0, or you might encounter ... KeyError: 'qwen2'')",
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

bool hf_applies(const MemsimModel *m, HfRuleId id)
{
    g_assert(id < N_HF_RULES);
    if (!m->model_type)
        return false;
    g_auto(GStrv) types = g_strsplit(rules[id].families, ",", -1);
    return g_strv_contains((const char *const *)types, m->model_type);
}

bool hf_before(const MemsimRun *run, const MemsimModel *m, HfRuleId id)
{
    return hf_applies(m, id) && !hf_since(run, id);
}

bool hf_within(const MemsimRun *run, const MemsimModel *m, HfRuleId id)
{
    int v = run->transformers_version ? run->transformers_version : HF_NEWEST;
    return hf_applies(m, id) && hf_since(run, id) && (!rules[id].until || v < rules[id].until);
}

bool hf_any_rule(const MemsimModel *m)
{
    for (guint i = 0; i < N_HF_RULES; i++)
        if (hf_applies(m, i))
            return true;
    return false;
}

bool hf_model_type_exists(const MemsimRun *run, const MemsimModel *m, int *first)
{
    const HfRuleId types[] = {HF_MODEL_MISTRAL, HF_MODEL_MIXTRAL, HF_MODEL_QWEN2};
    for (guint i = 0; i < G_N_ELEMENTS(types); i++)
        if (hf_before(run, m, types[i])) {
            *first = rules[types[i]].since;
            return false;
        }
    return true;
}

bool hf_sdpa_default(const MemsimRun *run, const MemsimModel *m)
{
    return !hf_before(run, m, HF_SDPA_DEFAULT) && !hf_before(run, m, HF_SDPA_DEFAULT_MISTRAL) &&
           !hf_before(run, m, HF_SDPA_DEFAULT_NEOX);
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
