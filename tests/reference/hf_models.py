"""Small causal language models written the way Hugging Face Transformers writes them.

What: LlamaForCausalLM (with grouped-query attention), GPT2LMHeadModel, OPTForCausalLM and
GPTNeoXForCausalLM, built from a dict with the keys of the family's HF config.json, plus
peft-style LoRA and per-layer activation checkpointing. No `transformers` package is needed.

Why: memsim's generator rebuilds, from a config.json, the exact sequence of tensor
allocations and frees that a Hugging Face training step makes. Its output is checked against
traces recorded from real PyTorch running these models (record_reference.py). For that check
to mean anything, these models must make the same tensors in the same order as the HF code:
the same ops, dtypes, views, transposes, `.contiguous()` calls and Python variable lifetimes.

How: each forward follows the current HF code (transformers v5 main, as read for
/work/shared/HF_MODELS.md §2-§3; GPT-NeoX from the v4.56-era file with the v5 position-id
path) statement by statement:
  * the model-level machinery: `use_cache` taken from the config unless checkpointing in
    training (§2.1), the DynamicCache whose first `update` copies K and V with `cat` (§2.2),
    position ids `arange(s) + past` (§2.3), `create_causal_mask` for eager attention with
    packed-sequence detection (§2.4), the Llama-style rotary embedding (§2.5);
  * the families' layers (§3.1 Llama, §3.2 GPT-2, §3.3 OPT, §3.5 GPT-NeoX), attention always
    the family's `eager_attention_forward` (torch 1.13 has no public SDPA);
  * the loss exactly as `ForCausalLMLoss` / `fixed_cross_entropy` (§2.11): `logits.float()`,
    labels padded with -100 and shifted, cross entropy with mean reduction;
  * `GradientCheckpointingLayer.__call__`: `torch.utils.checkpoint.checkpoint` over the whole
    decoder layer, `use_reentrant=False` (§2.13, AUTOGRAD_MEMORY.md §10.1);
  * LoRA as peft's `lora.Linear.forward` (AUTOGRAD_MEMORY.md §10.2): frozen base layer,
    `lora_B(lora_A(dropout(x))) * scaling` added to its output, `nn.Identity` dropout for p=0.
Weights are initialised as HF does (normal with `initializer_range`, zero biases, ones for
norms); their values do not change the allocations.

Differences from HF that do not change what is allocated: no `PreTrainedModel` machinery
(loading, hooks, output capturing), outputs are a small dataclass, config attributes are
resolved once at construction.
"""

import math
from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn


# --------------------------------------------------------------------------------------------
# Configuration

class Config:
    """A config.json dict with the family's defaults filled in, read as attributes."""

    def __init__(self, values, defaults, aliases=None):
        merged = dict(defaults)
        for key, value in values.items():
            merged[(aliases or {}).get(key, key)] = value
        self.__dict__.update(merged)
        self._attn_implementation = merged.get("_attn_implementation", "eager")
        if self._attn_implementation != "eager":
            raise ValueError("only eager attention is modelled (torch 1.13 has no public SDPA)")

    def get(self, key, default=None):
        return self.__dict__.get(key, default)


LLAMA_DEFAULTS = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=None, head_dim=None, hidden_act="silu",
    max_position_embeddings=2048, initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True,
    pad_token_id=None, tie_word_embeddings=False, rope_theta=10000.0, attention_bias=False,
    attention_dropout=0.0, mlp_bias=False,
)
GPT2_DEFAULTS = dict(
    vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
    activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
    layer_norm_epsilon=1e-5, initializer_range=0.02, scale_attn_weights=True, use_cache=True,
    scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False, pad_token_id=None,
    tie_word_embeddings=True,
)
GPT2_ALIASES = dict(hidden_size="n_embd", max_position_embeddings="n_positions",
                    num_attention_heads="n_head", num_hidden_layers="n_layer")
OPT_DEFAULTS = dict(
    vocab_size=50272, hidden_size=768, num_hidden_layers=12, ffn_dim=3072,
    max_position_embeddings=2048, do_layer_norm_before=True, _remove_final_layer_norm=False,
    word_embed_proj_dim=None, dropout=0.1, attention_dropout=0.0, num_attention_heads=12,
    activation_function="relu", layerdrop=0.0, init_std=0.02, use_cache=True, pad_token_id=1,
    enable_bias=True, layer_norm_elementwise_affine=True, tie_word_embeddings=True,
)
NEOX_DEFAULTS = dict(
    vocab_size=50432, hidden_size=6144, num_hidden_layers=44, num_attention_heads=64,
    intermediate_size=24576, hidden_act="gelu", rotary_pct=0.25, rotary_emb_base=10000,
    attention_dropout=0.0, hidden_dropout=0.0, max_position_embeddings=2048,
    initializer_range=0.02, layer_norm_eps=1e-5, use_cache=True, tie_word_embeddings=False,
    use_parallel_residual=True, attention_bias=True,
)


# --------------------------------------------------------------------------------------------
# Activations (activations.py ACT2FN)

class NewGELUActivation(nn.Module):
    """GPT-2's "gelu_new": the tanh approximation written out in Python (8 allocations)."""

    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(
            math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class GELUActivation(nn.Module):
    def forward(self, input):
        return F.gelu(input)


class PytorchGELUTanh(nn.Module):
    def forward(self, input):
        return F.gelu(input, approximate="tanh")


ACT2FN = {
    "gelu": GELUActivation,
    "gelu_new": NewGELUActivation,
    "gelu_pytorch_tanh": PytorchGELUTanh,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
}


def make_activation(name):
    return ACT2FN[name]()


# --------------------------------------------------------------------------------------------
# Shared machinery: cache, masks, loss, checkpointing

class DynamicLayer:
    """cache_utils.DynamicLayer: empty 1-D tensors at first use, then `cat` along the sequence.
    In training the only update copies K and V into new contiguous tensors (HF_MODELS.md §2.2)."""

    def __init__(self):
        self.is_initialized = False
        self.keys = self.values = None

    def lazy_initialization(self, key_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = torch.tensor([], dtype=self.dtype, device=self.device)
        self.values = torch.tensor([], dtype=self.dtype, device=self.device)
        self.is_initialized = True

    def update(self, key_states, value_states):
        if not self.is_initialized:
            self.lazy_initialization(key_states)
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys, self.values

    def get_seq_length(self):
        if not self.is_initialized or self.keys.numel() == 0:
            return 0
        return self.keys.shape[-2]


class DynamicCache:
    def __init__(self, num_layers):
        self.layers = [DynamicLayer() for _ in range(num_layers)]

    def update(self, key_states, value_states, layer_idx):
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx=0):
        return self.layers[layer_idx].get_seq_length()

    def get_mask_sizes(self, query_length, layer_idx):
        return self.get_seq_length(layer_idx) + query_length, 0


def causal_mask_function(batch_idx, head_idx, q_idx, kv_idx):
    return kv_idx <= q_idx


def padding_mask_function(padding_mask):
    def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
        return padding_mask[batch_idx, kv_idx]
    return inner_mask


def and_masks(*mask_functions):
    def and_mask(batch_idx, head_idx, q_idx, kv_idx):
        result = q_idx.new_ones((), dtype=torch.bool)
        for mask in mask_functions:
            result = result & mask(batch_idx, head_idx, q_idx, kv_idx).to(result.device)
        return result
    return and_mask


def packed_sequence_mask_function(packed_sequence_mask):
    def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
        return packed_sequence_mask[batch_idx, q_idx] == packed_sequence_mask[batch_idx, kv_idx]
    return inner_mask


def find_packed_sequence_indices(position_ids):
    first_dummy_value = position_ids[:, :1] - 1
    position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
    packed_sequence_mask = (position_diff != 1).cumsum(-1)
    if (packed_sequence_mask[:, -1] == 0).all():
        return None
    return packed_sequence_mask


def sdpa_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
              mask_function=causal_mask_function, attention_mask=None, device="cpu"):
    """masking_utils.sdpa_mask as eager_mask calls it: no causal skip, no torch<2.5 fix-up,
    index-broadcasting (non-vmap) expansion. Returns a bool (b, 1, q, kv) mask (a view)."""
    padding_mask = attention_mask
    if padding_mask is not None and kv_length + kv_offset - padding_mask.shape[-1] > 0:
        padding_mask = F.pad(padding_mask, (0, kv_length + kv_offset - padding_mask.shape[-1]))
    if padding_mask is not None:
        mask_function = and_masks(mask_function, padding_mask_function(padding_mask))
    batch_arange = torch.arange(batch_size, device=device)
    head_arange = torch.arange(1, device=device)
    q_arange = torch.arange(q_length, device=device) + q_offset
    kv_arange = torch.arange(kv_length, device=device) + kv_offset
    attention_mask = mask_function(batch_arange[:, None, None, None], head_arange[None, :, None, None],
                                   q_arange[None, None, :, None], kv_arange[None, None, None, :])
    return attention_mask.expand(batch_size, -1, q_length, kv_length)


def eager_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
               attention_mask, dtype, device):
    mask = sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                     attention_mask, device)
    min_dtype = torch.finfo(dtype).min
    return torch.where(mask, torch.tensor(0.0, device=mask.device, dtype=dtype), min_dtype)


def create_causal_mask(config, inputs_embeds, attention_mask, past_key_values, position_ids=None):
    """masking_utils.create_causal_mask + _preprocess_mask_arguments, eager backend: a float
    (b, 1, s, s) mask is materialised on every forward (HF_MODELS.md §2.4)."""
    if attention_mask is not None and attention_mask.ndim == 2:
        attention_mask = attention_mask.to(device=inputs_embeds.device, dtype=torch.bool)
    q_length = inputs_embeds.shape[1]
    if past_key_values is not None:
        q_offset = past_key_values.get_seq_length()
        kv_length, kv_offset = past_key_values.get_mask_sizes(q_length, 0)
    else:
        q_offset = 0
        if attention_mask is None:
            kv_length, kv_offset = q_length, 0
        else:
            kv_length, kv_offset = attention_mask.shape[-1], 0
    packed_sequence_mask = None
    if position_ids is not None and attention_mask is None and past_key_values is None:
        batch_size = inputs_embeds.shape[0]
        if batch_size != position_ids.shape[0]:
            position_ids = position_ids.expand(batch_size, -1)
        packed_sequence_mask = find_packed_sequence_indices(position_ids)
    mask_factory_function = causal_mask_function
    if packed_sequence_mask is not None:
        mask_factory_function = and_masks(mask_factory_function,
                                          packed_sequence_mask_function(packed_sequence_mask))
    return eager_mask(inputs_embeds.shape[0], q_length, kv_length, q_offset, kv_offset,
                      mask_factory_function, attention_mask, inputs_embeds.dtype,
                      inputs_embeds.device)


def fixed_cross_entropy(source, target, num_items_in_batch=None, ignore_index=-100):
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(source, target, ignore_index=ignore_index, reduction=reduction)
    if reduction == "sum":
        loss = loss / num_items_in_batch
    return loss


def ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100):
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    shift_labels = shift_labels.to(logits.device)
    return fixed_cross_entropy(logits, shift_labels, num_items_in_batch, ignore_index)


# --------------------------------------------------------------------------------------------
# Op-level selective activation checkpointing, written by hand for torch 1.13
#
# torch 1.13 has no create_selective_checkpoint_contexts (torch/utils/checkpoint.py, 2.4+).
# This is its semantics on top of 1.13's own non-reentrant checkpoint
# (_checkpoint_without_reentrant, whose holders and recomputation are unchanged): the region's
# function runs under a TorchDispatchMode that sees the aten ops below autograd, as
# _CachingTorchDispatchMode / _CachedTorchDispatchMode do. The policy is torchtitan's
# SelectiveAC (torchtitan/distributed/activation_checkpoint.py, _wrap_block's wrapped_policy,
# a fresh mm count per call): the outputs of the ops in SAC_SAVE_OPS are MUST_SAVE, except
# every second aten.mm of the pass; the rest PREFER_RECOMPUTE. A saved op's output is kept
# detached from the first forward and handed back, without running the op, by the
# recomputation.

import weakref  # noqa: E402

from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode_temporarily  # noqa: E402

aten = torch.ops.aten
# torchtitan's default save set (torch._functorch.partitioners get_default_op_list
# compute_intensive_ops plus SDPA and topk) as far as these models reach it on the CPU
SAC_SAVE_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.topk.default}


class _SacMode(TorchDispatchMode):
    def __init__(self, state, recompute):
        super().__init__()
        self.state = state
        self.recompute = recompute

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        st = self.state
        key = "recompute_mm_count" if self.recompute else "forward_mm_count"
        if func is aten.mm.default:
            st[key] += 1
        save = func in SAC_SAVE_OPS and not (func is aten.mm.default and st[key] % 2 == 0)
        if not save:
            return func(*args, **kwargs)
        if self.recompute:
            return st["kept"].pop(0)
        out = func(*args, **kwargs)
        st["kept"].append(tuple(t.detach() for t in out) if isinstance(out, tuple)
                          else out.detach())
        return out


def sac_checkpoint(function, *args):
    """torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False,
    context_fn=lambda: create_selective_checkpoint_contexts(policy)) on torch 1.13.

    The holders, the recomputation at the first unpack and the storage of what it saves are
    1.13's _checkpoint_without_reentrant line for line on the CPU (the CPU RNG state stashed
    at the forward, a 5056-byte tensor held by the region, and restored for the
    recomputation); only the recomputation's own detach runs outside the dispatch mode,
    because a 1.13 dispatch mode unwraps the 0-d wrapped-number tensors mul(x, scalar)
    saves."""
    state = {"forward_mm_count": 0, "recompute_mm_count": 0, "kept": []}
    fwd_cpu_state = torch.get_rng_state()

    class Holder:
        pass

    storage = weakref.WeakKeyDictionary()
    weak_holder_list = []

    def pack(x):
        res = Holder()
        weak_holder_list.append(weakref.ref(res))
        return res

    def unpack(x):
        unpack_counter = 0
        if len(storage) == 0:
            def inner_pack(inner):
                nonlocal unpack_counter
                unpack_counter += 1
                if weak_holder_list[unpack_counter - 1]() is None:
                    return
                with _pop_mode_temporarily():
                    storage[weak_holder_list[unpack_counter - 1]()] = inner.detach()

            def inner_unpack(packed):
                raise RuntimeError("unpacking a tensor never exposed")

            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(fwd_cpu_state)
                with torch.enable_grad(), \
                        torch.autograd.graph.saved_tensors_hooks(inner_pack, inner_unpack), \
                        _SacMode(state, recompute=True):
                    function(*args)
        return storage[x]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), _SacMode(state, recompute=False):
        output = function(*args)
    return output


class GradientCheckpointingLayer(nn.Module):
    """modeling_layers.GradientCheckpointingLayer: the whole layer call goes through
    torch.utils.checkpoint when checkpointing is on and the model trains; the cache is dropped."""

    gradient_checkpointing = False

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training:
            if kwargs.get("use_cache"):
                kwargs["use_cache"] = False
            for name in ("past_key_values", "layer_past"):
                if kwargs.get(name) is not None:
                    kwargs[name] = None
            if self.gradient_checkpointing == "sac-op":
                return sac_checkpoint(partial(super().__call__, **kwargs), *args)
            return torch.utils.checkpoint.checkpoint(
                partial(super().__call__, **kwargs), *args, use_reentrant=False)
        return super().__call__(*args, **kwargs)


@dataclass
class CausalLMOutput:
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    past_key_values: Optional[DynamicCache] = None


class CausalLMBase(nn.Module):
    """What the four families share from PreTrainedModel: weight init, tying, checkpointing."""

    def post_init(self, std):
        self.std = std
        self.apply(self._init_weights)
        if self.config.tie_word_embeddings:
            self.get_output_embeddings().weight = self.get_input_embeddings().weight

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=self.std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=self.std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm) and module.weight is not None:
            module.weight.data.fill_(1.0)
            module.bias.data.zero_()
        elif isinstance(module, Conv1D):
            module.weight.data.normal_(mean=0.0, std=self.std)
            module.bias.data.zero_()

    def gradient_checkpointing_enable(self, mode=True):
        """mode: True (HF's gradient checkpointing) or "sac-op" (torchtitan's op-level SAC
        around each decoder layer, as its SelectiveAC wraps each TransformerBlock)."""
        self.base_model().gradient_checkpointing = True
        for module in self.modules():
            if isinstance(module, GradientCheckpointingLayer):
                module.gradient_checkpointing = mode

    def resolve_use_cache(self, use_cache):
        """merge_with_config_defaults: config.use_cache unless checkpointing in training."""
        base = self.base_model()
        if use_cache is None:
            use_cache = self.config.use_cache
        if base.gradient_checkpointing and base.training:
            use_cache = False
        return use_cache


# --------------------------------------------------------------------------------------------
# Llama (modeling_llama.py)

class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class RotaryEmbedding(nn.Module):
    """LlamaRotaryEmbedding (default rope type); `partial_rotary_factor` < 1 for GPT-NeoX."""

    def __init__(self, head_dim, base, partial_rotary_factor=1.0, device=None):
        super().__init__()
        dim = int(head_dim * partial_rotary_factor)
        self.attention_scaling = 1.0
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(
            device=device, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(
            position_ids.shape[0], -1, 1).to(x.device)
        position_ids_expanded = position_ids[:, None, :].float()
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * self.attention_scaling
            sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(
        batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def llama_eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class LlamaAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = config.attention_dropout
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim,
                                bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim,
                                bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim,
                                bias=config.attention_bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size,
                                bias=config.attention_bias)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states,
                                                              self.layer_idx)
        attn_output, attn_weights = llama_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class LlamaMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = make_activation(config.hidden_act)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=False, position_embeddings=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states,
                                          position_embeddings=position_embeddings,
                                          attention_mask=attention_mask,
                                          past_key_values=past_key_values)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, i)
                                     for i in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
        self.rotary_emb = RotaryEmbedding(head_dim, config.rope_theta)
        self.gradient_checkpointing = False

    def forward(self, input_ids, use_cache):
        inputs_embeds = self.embed_tokens(input_ids)
        past_key_values = DynamicCache(self.config.num_hidden_layers) if use_cache else None
        past_seen_tokens = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
        position_ids = position_ids.unsqueeze(0)
        causal_mask = create_causal_mask(self.config, inputs_embeds, None, past_key_values,
                                         position_ids=position_ids)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        for decoder_layer in self.layers[: self.config.num_hidden_layers]:
            hidden_states = decoder_layer(hidden_states, attention_mask=causal_mask,
                                          position_embeddings=position_embeddings,
                                          position_ids=position_ids,
                                          past_key_values=past_key_values, use_cache=use_cache)
        hidden_states = self.norm(hidden_states)
        return hidden_states, past_key_values


class LlamaForCausalLM(CausalLMBase):
    def __init__(self, config_dict):
        super().__init__()
        self.config = config = Config(config_dict, LLAMA_DEFAULTS)
        if config.num_key_value_heads is None:
            config.num_key_value_heads = config.num_attention_heads
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init(config.initializer_range)

    def base_model(self):
        return self.model

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    # The Transformers release whose LlamaForCausalLM.forward runs: None for the newest, or
    # (4, 45) for the code before 4.46 (memsim's traces/transformers_versions.md,
    # logits-not-upcast)
    transformers_version = None

    def forward(self, input_ids, labels=None, use_cache=None, logits_to_keep=0):
        use_cache = self.resolve_use_cache(use_cache)
        hidden_states, past_key_values = self.model(input_ids, use_cache)
        if self.transformers_version is not None and self.transformers_version < (4, 46):
            # 4.45: logits = self.lm_head(hidden_states[:, -num_logits_to_keep:, :]).float(),
            # the loss computed here on a shifted contiguous copy
            logits = self.lm_head(hidden_states[:, -logits_to_keep:, :]).float()
            loss = None
            if labels is not None:
                logits = logits.float()
                shift_logits = logits[..., :-1, :].contiguous()
                shift_labels = labels[..., 1:].contiguous()
                loss_fct = nn.CrossEntropyLoss()
                shift_logits = shift_logits.view(-1, self.config.vocab_size)
                shift_labels = shift_labels.view(-1)
                shift_labels = shift_labels.to(shift_logits.device)
                loss = loss_fct(shift_logits, shift_labels)
            return CausalLMOutput(loss=loss, logits=logits, past_key_values=past_key_values)
        slice_indices = slice(-logits_to_keep, None)
        logits = self.lm_head(hidden_states[:, slice_indices, :])
        loss = None
        if labels is not None:
            loss = ForCausalLMLoss(logits, labels, vocab_size=self.config.vocab_size)
        return CausalLMOutput(loss=loss, logits=logits, past_key_values=past_key_values)


# --------------------------------------------------------------------------------------------
# GPT-2 (modeling_gpt2.py, pytorch_utils.Conv1D)

class Conv1D(nn.Module):
    """A linear layer with a transposed weight (nx, nf): `addmm(bias, x.view(-1, nx), W)`."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.nx = nx
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x


def gpt2_eager_attention_forward(module, query, key, value, attention_mask, scaling=None,
                                 dropout=0.0):
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1)
    attn_weights = attn_weights.type(value.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2)
    return attn_output, attn_weights


class GPT2Attention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.embed_dim = config.n_embd
        self.num_heads = config.n_head
        self.head_dim = self.embed_dim // self.num_heads
        self.split_size = self.embed_dim
        self.layer_idx = layer_idx
        self.scaling = 1.0
        if config.scale_attn_weights:
            self.scaling = self.head_dim ** -0.5
        if config.scale_attn_by_inverse_layer_idx:
            self.scaling /= float(layer_idx + 1)
        if config.reorder_and_upcast_attn:
            raise ValueError("reorder_and_upcast_attn is not modelled")
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states, past_key_values=None, attention_mask=None):
        query_states, key_states, value_states = self.c_attn(hidden_states).split(
            self.split_size, dim=2)
        shape_kv = (*key_states.shape[:-1], -1, self.head_dim)
        key_states = key_states.view(shape_kv).transpose(1, 2)
        value_states = value_states.view(shape_kv).transpose(1, 2)
        shape_q = (*query_states.shape[:-1], -1, self.head_dim)
        query_states = query_states.view(shape_q).transpose(1, 2)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states,
                                                              self.layer_idx)
        attn_output, attn_weights = gpt2_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask,
            dropout=self.attn_dropout.p if self.training else 0.0, scaling=self.scaling)
        attn_output = attn_output.reshape(*attn_output.shape[:-2], -1).contiguous()
        attn_output = self.c_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)
        return attn_output, attn_weights


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size, config):
        super().__init__()
        embed_dim = config.n_embd
        self.c_fc = Conv1D(intermediate_size, embed_dim)
        self.c_proj = Conv1D(embed_dim, intermediate_size)
        self.act = make_activation(config.activation_function)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPT2Block(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        hidden_size = config.n_embd
        inner_dim = config.n_inner if config.n_inner is not None else 4 * hidden_size
        self.ln_1 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(inner_dim, config)

    def forward(self, hidden_states, past_key_values=None, attention_mask=None,
                encoder_hidden_states=None, use_cache=False, position_ids=None):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output, _ = self.attn(hidden_states, past_key_values=past_key_values,
                                   attention_mask=attention_mask)
        hidden_states = attn_output + residual
        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = residual + feed_forward_hidden_states
        return hidden_states


class GPT2Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([GPT2Block(config, i) for i in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.gradient_checkpointing = False

    def forward(self, input_ids, use_cache):
        # warn_if_padding_and_no_attention_mask returns at once: pad_token_id is None.
        input_shape = input_ids.size()
        input_ids = input_ids.view(-1, input_shape[-1])
        past_key_values = DynamicCache(self.config.n_layer) if use_cache else None
        inputs_embeds = self.wte(input_ids)
        past_seen_tokens = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
        position_ids = position_ids.unsqueeze(0)
        position_embeds = self.wpe(position_ids)
        hidden_states = inputs_embeds + position_embeds.to(inputs_embeds.device)
        causal_mask = create_causal_mask(self.config, inputs_embeds, None, past_key_values,
                                         position_ids=position_ids)
        hidden_states = self.drop(hidden_states)
        output_shape = (-1,) + input_shape[1:] + (hidden_states.size(-1),)
        for block in self.h:
            hidden_states = block(
                hidden_states,
                past_key_values if not (self.gradient_checkpointing and self.training) else None,
                causal_mask,
                None,  # encoder_hidden_states, positional for gradient checkpointing
                use_cache=use_cache,
                position_ids=position_ids,
            )
        hidden_states = self.ln_f(hidden_states)
        hidden_states = hidden_states.view(output_shape)
        return hidden_states, (past_key_values if use_cache else None)


class GPT2LMHeadModel(CausalLMBase):
    def __init__(self, config_dict):
        super().__init__()
        self.config = config = Config(config_dict, GPT2_DEFAULTS, GPT2_ALIASES)
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init(config.initializer_range)

    def base_model(self):
        return self.transformer

    def get_input_embeddings(self):
        return self.transformer.wte

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, labels=None, use_cache=None, logits_to_keep=0):
        use_cache = self.resolve_use_cache(use_cache)
        hidden_states, past_key_values = self.transformer(input_ids, use_cache)
        slice_indices = slice(-logits_to_keep, None)
        logits = self.lm_head(hidden_states[:, slice_indices, :])
        loss = None
        if labels is not None:
            loss = ForCausalLMLoss(logits, labels, vocab_size=self.config.vocab_size)
        return CausalLMOutput(loss=loss, logits=logits, past_key_values=past_key_values)


# --------------------------------------------------------------------------------------------
# OPT (modeling_opt.py)

class OPTLearnedPositionalEmbedding(nn.Embedding):
    """Positions looked up at `position + 2` (fairseq's offset)."""

    def __init__(self, num_embeddings, embedding_dim):
        self.offset = 2
        super().__init__(num_embeddings + self.offset, embedding_dim)

    def forward(self, attention_mask, past_key_values_length=0, position_ids=None):
        if position_ids is None:
            position_ids = torch.cumsum(attention_mask, dim=1)
            position_ids = (position_ids * attention_mask - 1).long()
            position_ids = position_ids[:, past_key_values_length:]
        return super().forward(position_ids + self.offset)


def opt_eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0):
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class OPTAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.embed_dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.dropout = config.attention_dropout
        self.layer_idx = layer_idx
        self.head_dim = self.embed_dim // self.num_heads
        self.scaling = self.head_dim ** -0.5
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=config.enable_bias)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=config.enable_bias)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=config.enable_bias)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=config.enable_bias)

    def forward(self, hidden_states, past_key_values=None, attention_mask=None):
        bsz, tgt_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states) * self.scaling
        query_states = query_states.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        key_states = key_states.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states,
                                                              self.layer_idx)
        attn_output, attn_weights = opt_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.dropout, scaling=1.0)
        attn_output = attn_output.reshape(bsz, tgt_len, -1).contiguous()
        attn_output = self.out_proj(attn_output)
        return attn_output, attn_weights


class OPTDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.embed_dim = config.hidden_size
        self.self_attn = OPTAttention(config, layer_idx)
        self.do_layer_norm_before = config.do_layer_norm_before
        self.dropout = config.dropout
        self.activation_fn = make_activation(config.activation_function)
        self.self_attn_layer_norm = nn.LayerNorm(
            self.embed_dim, elementwise_affine=config.layer_norm_elementwise_affine)
        self.fc1 = nn.Linear(self.embed_dim, config.ffn_dim, bias=config.enable_bias)
        self.fc2 = nn.Linear(config.ffn_dim, self.embed_dim, bias=config.enable_bias)
        self.final_layer_norm = nn.LayerNorm(
            self.embed_dim, elementwise_affine=config.layer_norm_elementwise_affine)

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, use_cache=False,
                position_ids=None):
        residual = hidden_states
        if self.do_layer_norm_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states,
                                          past_key_values=past_key_values,
                                          attention_mask=attention_mask)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = residual + hidden_states
        if not self.do_layer_norm_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states_shape = hidden_states.shape
        hidden_states = hidden_states.reshape(-1, hidden_states.size(-1))
        residual = hidden_states
        if self.do_layer_norm_before:
            hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = self.fc1(hidden_states)
        hidden_states = self.activation_fn(hidden_states)
        hidden_states = self.fc2(hidden_states)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = (residual + hidden_states).view(hidden_states_shape)
        if not self.do_layer_norm_before:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states


class OPTDecoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.layerdrop = config.layerdrop
        self.embed_tokens = nn.Embedding(config.vocab_size, config.word_embed_proj_dim,
                                         config.pad_token_id)
        self.embed_positions = OPTLearnedPositionalEmbedding(config.max_position_embeddings,
                                                             config.hidden_size)
        if config.word_embed_proj_dim != config.hidden_size:
            self.project_out = nn.Linear(config.hidden_size, config.word_embed_proj_dim, bias=False)
            self.project_in = nn.Linear(config.word_embed_proj_dim, config.hidden_size, bias=False)
        else:
            self.project_out = self.project_in = None
        if config.do_layer_norm_before and not config._remove_final_layer_norm:
            self.final_layer_norm = nn.LayerNorm(
                config.hidden_size, elementwise_affine=config.layer_norm_elementwise_affine)
        else:
            self.final_layer_norm = None
        self.layers = nn.ModuleList([OPTDecoderLayer(config, i)
                                     for i in range(config.num_hidden_layers)])
        self.gradient_checkpointing = False

    def forward(self, input_ids, use_cache):
        input_ids = input_ids.view(-1, input_ids.shape[-1])
        inputs_embeds = self.embed_tokens(input_ids)
        past_key_values = DynamicCache(self.config.num_hidden_layers) if use_cache else None
        past_seen_tokens = past_key_values.get_seq_length() if past_key_values is not None else 0
        seq_length = past_seen_tokens + inputs_embeds.shape[1]
        attention_mask = torch.ones(inputs_embeds.shape[0], seq_length, device=inputs_embeds.device)
        position_ids = torch.cumsum(attention_mask, dim=1)
        position_ids = (position_ids * attention_mask - 1).long()
        position_ids = position_ids[:, past_seen_tokens:]
        causal_mask = create_causal_mask(self.config, inputs_embeds, attention_mask,
                                         past_key_values)
        pos_embeds = self.embed_positions(attention_mask, past_seen_tokens,
                                          position_ids=position_ids)
        if self.project_in is not None:
            inputs_embeds = self.project_in(inputs_embeds)
        hidden_states = inputs_embeds + pos_embeds.to(inputs_embeds.device)
        for decoder_layer in self.layers:
            if self.training:
                dropout_probability = torch.rand([])
                if dropout_probability < self.layerdrop:
                    continue
            hidden_states = decoder_layer(hidden_states, attention_mask=causal_mask,
                                          position_ids=position_ids,
                                          past_key_values=past_key_values, use_cache=use_cache)
        if self.final_layer_norm is not None:
            hidden_states = self.final_layer_norm(hidden_states)
        if self.project_out is not None:
            hidden_states = self.project_out(hidden_states)
        return hidden_states, past_key_values


class OPTModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(CausalLMBase):
    def __init__(self, config_dict):
        super().__init__()
        self.config = config = Config(config_dict, OPT_DEFAULTS)
        if config.word_embed_proj_dim is None:
            config.word_embed_proj_dim = config.hidden_size
        self.model = OPTModel(config)
        self.lm_head = nn.Linear(config.word_embed_proj_dim, config.vocab_size, bias=False)
        self.post_init(config.init_std)

    def base_model(self):
        return self.model.decoder

    def get_input_embeddings(self):
        return self.model.decoder.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, labels=None, use_cache=None, logits_to_keep=0):
        use_cache = self.resolve_use_cache(use_cache)
        hidden_states, past_key_values = self.model.decoder(input_ids, use_cache)
        slice_indices = slice(-logits_to_keep, None)
        logits = self.lm_head(hidden_states[:, slice_indices, :]).contiguous()
        loss = None
        if labels is not None:
            loss = ForCausalLMLoss(logits, labels, vocab_size=self.config.vocab_size)
        return CausalLMOutput(loss=loss, logits=logits, past_key_values=past_key_values)


# --------------------------------------------------------------------------------------------
# GPT-NeoX (modeling_gpt_neox.py)

def neox_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Rotary on the first `rotary_dim` channels only, the rest passed through and re-joined."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (rotate_half(k_rot) * sin)
    q_embed = torch.cat([q_embed, q_pass], dim=-1)
    k_embed = torch.cat([k_embed, k_pass], dim=-1)
    return q_embed, k_embed


def neox_eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0):
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class GPTNeoXAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.head_size = config.hidden_size // config.num_attention_heads
        self.attention_dropout = config.attention_dropout
        self.scaling = self.head_size ** -0.5
        self.layer_idx = layer_idx
        self.query_key_value = nn.Linear(config.hidden_size, 3 * config.hidden_size,
                                         bias=config.attention_bias)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)

    def forward(self, hidden_states, attention_mask, layer_past=None, position_embeddings=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, 3 * self.head_size)
        qkv = self.query_key_value(hidden_states).view(hidden_shape).transpose(1, 2)
        query_states, key_states, value_states = qkv.chunk(3, dim=-1)
        cos, sin = position_embeddings
        query_states, key_states = neox_apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if layer_past is not None:
            key_states, value_states = layer_past.update(key_states, value_states, self.layer_idx)
        attn_output, attn_weights = neox_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask, scaling=self.scaling,
            dropout=0.0 if not self.training else self.attention_dropout)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.dense(attn_output)
        return attn_output, attn_weights


class GPTNeoXMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.hidden_size, config.intermediate_size)
        self.dense_4h_to_h = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = make_activation(config.hidden_act)

    def forward(self, hidden_states):
        hidden_states = self.dense_h_to_4h(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.dense_4h_to_h(hidden_states)
        return hidden_states


class GPTNeoXLayer(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.use_parallel_residual = config.use_parallel_residual
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_dropout = nn.Dropout(config.hidden_dropout)
        self.post_mlp_dropout = nn.Dropout(config.hidden_dropout)
        self.attention = GPTNeoXAttention(config, layer_idx)
        self.mlp = GPTNeoXMLP(config)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, use_cache=False,
                layer_past=None, position_embeddings=None):
        attn_output, _ = self.attention(self.input_layernorm(hidden_states),
                                        attention_mask=attention_mask, layer_past=layer_past,
                                        position_embeddings=position_embeddings)
        attn_output = self.post_attention_dropout(attn_output)
        if self.use_parallel_residual:
            # x = x + attn(ln1(x)) + mlp(ln2(x))
            mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
            mlp_output = self.post_mlp_dropout(mlp_output)
            hidden_states = mlp_output + attn_output + hidden_states
        else:
            attn_output = attn_output + hidden_states
            mlp_output = self.mlp(self.post_attention_layernorm(attn_output))
            mlp_output = self.post_mlp_dropout(mlp_output)
            hidden_states = mlp_output + attn_output
        return hidden_states


class GPTNeoXModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_in = nn.Embedding(config.vocab_size, config.hidden_size)
        self.emb_dropout = nn.Dropout(config.hidden_dropout)
        self.layers = nn.ModuleList([GPTNeoXLayer(config, i)
                                     for i in range(config.num_hidden_layers)])
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        partial_rotary_factor = config.get("partial_rotary_factor", config.rotary_pct)
        rope_theta = config.get("rope_theta", config.rotary_emb_base)
        self.rotary_emb = RotaryEmbedding(config.hidden_size // config.num_attention_heads,
                                          rope_theta, partial_rotary_factor)
        self.gradient_checkpointing = False

    def forward(self, input_ids, use_cache):
        inputs_embeds = self.embed_in(input_ids)
        past_key_values = DynamicCache(self.config.num_hidden_layers) if use_cache else None
        past_seen_tokens = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
        position_ids = position_ids.unsqueeze(0)
        causal_mask = create_causal_mask(self.config, inputs_embeds, None, past_key_values,
                                         position_ids=position_ids)
        hidden_states = self.emb_dropout(inputs_embeds)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=causal_mask,
                                  position_ids=position_ids, layer_past=past_key_values,
                                  use_cache=use_cache, position_embeddings=position_embeddings)
        hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states, past_key_values


class GPTNeoXForCausalLM(CausalLMBase):
    def __init__(self, config_dict):
        super().__init__()
        self.config = config = Config(config_dict, NEOX_DEFAULTS)
        self.gpt_neox = GPTNeoXModel(config)
        self.embed_out = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init(config.initializer_range)

    def base_model(self):
        return self.gpt_neox

    def get_input_embeddings(self):
        return self.gpt_neox.embed_in

    def get_output_embeddings(self):
        return self.embed_out

    def forward(self, input_ids, labels=None, use_cache=None, logits_to_keep=0):
        use_cache = self.resolve_use_cache(use_cache)
        hidden_states, past_key_values = self.gpt_neox(input_ids, use_cache)
        slice_indices = slice(-logits_to_keep, None)
        logits = self.embed_out(hidden_states[:, slice_indices, :])
        loss = None
        if labels is not None:
            loss = ForCausalLMLoss(logits, labels, vocab_size=self.config.vocab_size)
        return CausalLMOutput(loss=loss, logits=logits, past_key_values=past_key_values)


# --------------------------------------------------------------------------------------------
# LoRA (peft tuners/lora/layer.py, Linear, one adapter, not DoRA)

class LoraLinear(nn.Module):
    def __init__(self, base_layer, r, lora_alpha, lora_dropout):
        super().__init__()
        self.base_layer = base_layer
        self.lora_dropout = nn.Dropout(lora_dropout) if lora_dropout > 0.0 else nn.Identity()
        self.lora_A = nn.Linear(base_layer.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base_layer.out_features, bias=False)
        self.scaling = lora_alpha / r
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x):
        result = self.base_layer(x)
        torch_result_dtype = result.dtype
        # _cast_input_dtype: a cast only when the dtypes differ.
        if x.dtype != self.lora_A.weight.dtype:
            x = x.to(self.lora_A.weight.dtype)
        result = result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
        result = result.to(torch_result_dtype)
        return result


def apply_lora(model, r=8, lora_alpha=16, lora_dropout=0.0, target_modules=("q_proj", "v_proj")):
    """get_peft_model: wrap every nn.Linear whose name ends with a target, freeze the rest
    (bias="none": only lora_A / lora_B train)."""
    targets = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.split(".")[-1] in target_modules:
            targets.append(name)
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoraLinear(getattr(parent, child), r, lora_alpha, lora_dropout))
    for name, param in model.named_parameters():
        param.requires_grad = "lora_" in name
    return model


# --------------------------------------------------------------------------------------------

FAMILIES = {
    "llama": LlamaForCausalLM,
    "gpt2": GPT2LMHeadModel,
    "opt": OPTForCausalLM,
    "gpt_neox": GPTNeoXForCausalLM,
}


def build_model(config_dict, gradient_checkpointing=False, lora=None, transformers_version=None):
    """Builds the model named by config_dict["model_type"]; `lora` is None or a dict with
    r, lora_alpha, lora_dropout, target_modules; `transformers_version` (Llama only) a
    (major, minor) tuple of an older release's forward."""
    model = FAMILIES[config_dict["model_type"]](config_dict)
    if transformers_version is not None:
        model.transformers_version = transformers_version
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing)
    if lora is not None:
        apply_lora(model, **lora)
    return model
