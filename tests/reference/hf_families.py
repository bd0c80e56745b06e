"""Small Qwen2, Gemma-2, Phi-3, OLMo and DeepSeek-V2-style (multi-head latent attention + mixture of
experts) causal language models, written in plain PyTorch after the Transformers modeling
files, statement by statement, on the machinery of hf_models.py (cache, masks, rotary
embedding, loss). No `transformers` package is needed.

Sources (huggingface/transformers, src/transformers/models/):
  * qwen2/modeling_qwen2.py: Llama's decoder with bias on q_proj, k_proj, v_proj (not o_proj);
  * gemma2/modeling_gemma2.py: Gemma2RMSNorm (x.float() normalised, * (1 + weight.float()),
    type_as), GemmaTextScaledWordEmbedding (embedding * embed_scale.to(weight.dtype)), four
    norms per layer, eager_attention_forward with query_pre_attn_scalar scaling and score
    soft-capping (/ cap, tanh, * cap), Gemma2ForCausalLM's final logit soft-capping, the two
    masks the model builds (full and sliding) and tied embeddings;
  * phi3/modeling_phi3.py: Phi3Attention's fused qkv_proj sliced into q, k, v, Phi-3's
    apply_rotary_pos_emb (rotate q[..., :rd], then cat with q[..., rd:]), Phi3MLP's
    gate_up_proj chunked;
  * olmo/modular_olmo.py: OlmoLayerNorm (F.layer_norm of x.to(float32) without weight or
    bias, cast back) for every norm, OlmoAttention clamping q, k and v in place to
    +-clip_qkv;
  * deepseek_v3/modeling_deepseek_v3.py: DeepseekV3Attention (q_a_proj, q_a_layernorm,
    q_b_proj, kv_a_proj_with_mqa split into the compressed KV and the shared rotary key,
    kv_a_layernorm, kv_b_proj, apply_rotary_pos_emb_interleave, cat of the pass and rotary
    parts), DeepseekV3MoE with shared experts and the first layers dense.
The routed experts are held as current Transformers holds them (gate_up_proj [E, 2I, H],
down_proj [E, H, I]) and computed as the grouped_mm experts backend computes them
(integrations/moe.py: the token rows sorted by expert, one grouped GEMM for gate_up and one for
down, the routing weights' product, index_add_); torch 1.13 has no grouped_mm, so the groups,
all of one size, are a bmm. Tokens are dispatched round-robin (slot j of the T*k to expert
j mod E): the routing is uniform, which is memsim's assumption; the router's logits, softmax
and top-k are computed as in the model.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import hf_models as hm


class Qwen2ForCausalLM(hm.LlamaForCausalLM):
    """Qwen2Attention: q_proj, k_proj, v_proj with bias=True, o_proj with bias=False."""

    def __init__(self, config_dict):
        d = dict(config_dict, attention_bias=True)
        super().__init__(d)
        for layer in self.model.layers:
            a = layer.self_attn
            a.o_proj = nn.Linear(a.o_proj.in_features, a.o_proj.out_features, bias=False)
        self.post_init(self.config.initializer_range)


# --------------------------------------------------------------------------------------------
# Gemma 2

class Gemma2RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class Gemma2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act_fn = hm.make_activation(c.hidden_activation)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def gemma2_eager_attention_forward(module, query, key, value, attention_mask, scaling,
                                   softcap=None):
    key_states = hm.repeat_kv(key, module.num_key_value_groups)
    value_states = hm.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        attn_weights = attn_weights / softcap
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * softcap
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class Gemma2Attention(nn.Module):
    def __init__(self, c, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = c.head_dim
        self.num_key_value_groups = c.num_attention_heads // c.num_key_value_heads
        self.scaling = c.query_pre_attn_scalar ** -0.5
        self.softcap = c.attn_logit_softcapping
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = hm.apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states,
                                                              self.layer_idx)
        attn_output, _ = gemma2_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask, self.scaling,
            softcap=self.softcap)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)


class Gemma2DecoderLayer(hm.GradientCheckpointingLayer):
    def __init__(self, c, layer_idx):
        super().__init__()
        self.attention_type = "sliding_attention" if layer_idx % 2 == 0 else "full_attention"
        self.self_attn = Gemma2Attention(c, layer_idx)
        self.mlp = Gemma2MLP(c)
        self.input_layernorm = Gemma2RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = Gemma2RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.pre_feedforward_layernorm = Gemma2RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_feedforward_layernorm = Gemma2RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=False, position_embeddings=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, position_embeddings, attention_mask,
                                       past_key_values)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.pre_feedforward_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = self.post_feedforward_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class ScaledEmbedding(nn.Embedding):
    """GemmaTextScaledWordEmbedding."""

    def __init__(self, num, dim, padding_idx, embed_scale):
        super().__init__(num, dim, padding_idx)
        self.register_buffer("embed_scale", torch.tensor(embed_scale), persistent=False)

    def forward(self, input_ids):
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


GEMMA2_DEFAULTS = dict(
    hidden_activation="gelu_pytorch_tanh", head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0,
    query_pre_attn_scalar=256, sliding_window=4096, final_logit_softcapping=30.0,
    attn_logit_softcapping=50.0, tie_word_embeddings=True, use_cache=True,
    initializer_range=0.02, pad_token_id=0, num_key_value_heads=4,
)


class Gemma2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.embed_tokens = ScaledEmbedding(c.vocab_size, c.hidden_size, c.pad_token_id,
                                            c.hidden_size ** 0.5)
        self.layers = nn.ModuleList([Gemma2DecoderLayer(c, i) for i in range(c.num_hidden_layers)])
        self.norm = Gemma2RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.rotary_emb = hm.RotaryEmbedding(c.head_dim, c.rope_theta)
        self.gradient_checkpointing = False

    def forward(self, input_ids, use_cache):
        inputs_embeds = self.embed_tokens(input_ids)
        past_key_values = hm.DynamicCache(self.config.num_hidden_layers) if use_cache else None
        past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = torch.arange(inputs_embeds.shape[1]) + past_seen
        position_ids = position_ids.unsqueeze(0)
        # the mapping of both mask kinds (create_causal_mask and
        # create_sliding_window_causal_mask): with the window past the sequence the sliding
        # mask has the causal mask's values and shape
        causal_mask_mapping = {
            "full_attention": hm.create_causal_mask(self.config, inputs_embeds, None,
                                                    past_key_values, position_ids=position_ids),
            "sliding_attention": hm.create_causal_mask(self.config, inputs_embeds, None,
                                                       past_key_values,
                                                       position_ids=position_ids),
        }
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states,
                                  attention_mask=causal_mask_mapping[layer.attention_type],
                                  position_embeddings=position_embeddings,
                                  position_ids=position_ids, past_key_values=past_key_values,
                                  use_cache=use_cache)
        hidden_states = self.norm(hidden_states)
        return hidden_states, past_key_values


class Gemma2ForCausalLM(hm.CausalLMBase):
    def __init__(self, config_dict):
        super().__init__()
        self.config = c = hm.Config(config_dict, GEMMA2_DEFAULTS)
        self.model = Gemma2Model(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.post_init(c.initializer_range)

    def base_model(self):
        return self.model

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, labels=None, use_cache=None, logits_to_keep=0):
        use_cache = self.resolve_use_cache(use_cache)
        hidden_states, past_key_values = self.model(input_ids, use_cache)
        logits = self.lm_head(hidden_states[:, slice(-logits_to_keep, None), :])
        if self.config.final_logit_softcapping is not None:
            logits = logits / self.config.final_logit_softcapping
            logits = torch.tanh(logits)
            logits = logits * self.config.final_logit_softcapping
        loss = None
        if labels is not None:
            loss = hm.ForCausalLMLoss(logits, labels, vocab_size=self.config.vocab_size)
        return hm.CausalLMOutput(loss=loss, logits=logits, past_key_values=past_key_values)


# --------------------------------------------------------------------------------------------
# Phi-3

def phi3_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = torch.cat([(q_rot * cos) + (hm.rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (hm.rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed


class Phi3Attention(nn.Module):
    def __init__(self, c, layer_idx):
        super().__init__()
        self.config = c
        self.layer_idx = layer_idx
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.num_key_value_heads = c.num_key_value_heads
        self.num_key_value_groups = c.num_attention_heads // c.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        op_size = c.num_attention_heads * self.head_dim + 2 * (c.num_key_value_heads * self.head_dim)
        self.o_proj = nn.Linear(c.num_attention_heads * self.head_dim, c.hidden_size, bias=False)
        self.qkv_proj = nn.Linear(c.hidden_size, op_size, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        qkv = self.qkv_proj(hidden_states)
        query_pos = self.config.num_attention_heads * self.head_dim
        query_states = qkv[..., :query_pos]
        key_states = qkv[..., query_pos: query_pos + self.num_key_value_heads * self.head_dim]
        value_states = qkv[..., query_pos + self.num_key_value_heads * self.head_dim:]
        query_states = query_states.view(hidden_shape).transpose(1, 2)
        key_states = key_states.view(hidden_shape).transpose(1, 2)
        value_states = value_states.view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = phi3_apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states,
                                                              self.layer_idx)
        attn_output, _ = hm.llama_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask, scaling=self.scaling)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)


class Phi3MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_up_proj = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.activation_fn = hm.make_activation(c.hidden_act)

    def forward(self, hidden_states):
        up_states = self.gate_up_proj(hidden_states)
        gate, up_states = up_states.chunk(2, dim=-1)
        up_states = up_states * self.activation_fn(gate)
        return self.down_proj(up_states)


class Phi3DecoderLayer(hm.GradientCheckpointingLayer):
    def __init__(self, c, layer_idx):
        super().__init__()
        self.self_attn = Phi3Attention(c, layer_idx)
        self.mlp = Phi3MLP(c)
        self.input_layernorm = hm.LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = hm.LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.resid_attn_dropout = nn.Dropout(c.resid_pdrop)
        self.resid_mlp_dropout = nn.Dropout(c.resid_pdrop)

    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=False, position_embeddings=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, position_embeddings, attention_mask,
                                       past_key_values)
        hidden_states = residual + self.resid_attn_dropout(hidden_states)
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + self.resid_mlp_dropout(hidden_states)
        return hidden_states


# --------------------------------------------------------------------------------------------
# OLMo

class OlmoLayerNorm(nn.Module):
    """LayerNorm but with no learnable weight or bias."""

    def __init__(self, hidden_size):
        super().__init__()
        self.normalized_shape = (hidden_size,)

    def forward(self, hidden_states):
        orig_dtype = hidden_states.dtype
        return F.layer_norm(hidden_states.to(dtype=torch.float32), self.normalized_shape, None,
                            None, eps=1e-5).to(orig_dtype)


class OlmoAttention(hm.LlamaAttention):
    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        if self.config.clip_qkv is not None:
            query_states.clamp_(min=-self.config.clip_qkv, max=self.config.clip_qkv)
            key_states.clamp_(min=-self.config.clip_qkv, max=self.config.clip_qkv)
            value_states.clamp_(min=-self.config.clip_qkv, max=self.config.clip_qkv)
        query_states = query_states.view(hidden_shape).transpose(1, 2)
        key_states = key_states.view(hidden_shape).transpose(1, 2)
        value_states = value_states.view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = hm.apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states,
                                                              self.layer_idx)
        attn_output, attn_weights = hm.llama_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class OlmoForCausalLM(hm.LlamaForCausalLM):
    """OlmoDecoderLayer: Llama's with OlmoLayerNorm norms and OlmoAttention; OlmoModel.norm an
    OlmoLayerNorm too."""

    def __init__(self, config_dict):
        super().__init__(dict(dict(clip_qkv=None), **config_dict))
        c = self.config
        for i, layer in enumerate(self.model.layers):
            layer.self_attn = OlmoAttention(c, i)
            layer.input_layernorm = OlmoLayerNorm(c.hidden_size)
            layer.post_attention_layernorm = OlmoLayerNorm(c.hidden_size)
        self.model.norm = OlmoLayerNorm(c.hidden_size)
        self.post_init(c.initializer_range)


# --------------------------------------------------------------------------------------------
# DeepSeek-V2/V3: multi-head latent attention and the mixture of experts

def apply_rotary_pos_emb_interleave(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    b, h, s, d = q.shape
    q = q.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    b, h, s, d = k.shape
    k = k.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    q_embed = (q * cos) + (hm.rotate_half(q) * sin)
    k_embed = (k * cos) + (hm.rotate_half(k) * sin)
    return q_embed, k_embed


class DeepseekAttention(nn.Module):
    def __init__(self, c, layer_idx):
        super().__init__()
        self.config = c
        self.layer_idx = layer_idx
        self.num_heads = c.num_attention_heads
        self.num_key_value_groups = 1
        self.q_lora_rank = c.q_lora_rank
        self.qk_rope_head_dim = c.qk_rope_head_dim
        self.kv_lora_rank = c.kv_lora_rank
        self.v_head_dim = c.v_head_dim
        self.qk_nope_head_dim = c.qk_nope_head_dim
        self.qk_head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(c.hidden_size, self.num_heads * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=c.attention_bias)
            self.q_a_layernorm = hm.LlamaRMSNorm(c.q_lora_rank)
            self.q_b_proj = nn.Linear(c.q_lora_rank, self.num_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, self.kv_lora_rank + self.qk_rope_head_dim,
                                            bias=c.attention_bias)
        self.kv_a_layernorm = hm.LlamaRMSNorm(self.kv_lora_rank)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank,
                                   self.num_heads * (self.qk_nope_head_dim + self.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_head_dim, c.hidden_size,
                                bias=c.attention_bias)
        self.scaling = self.qk_head_dim ** (-0.5)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None):
        batch_size, seq_length = hidden_states.shape[:-1]
        query_shape = (batch_size, seq_length, -1, self.qk_head_dim)
        key_shape = (batch_size, seq_length, -1, self.qk_nope_head_dim + self.v_head_dim)
        if self.q_lora_rank is None:
            q_states = self.q_proj(hidden_states)
        else:
            q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q_states = q_states.view(query_shape).transpose(1, 2)
        q_pass, q_rot = torch.split(q_states, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        compressed_kv = self.kv_a_proj_with_mqa(hidden_states)
        k_pass, k_rot = torch.split(compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pass = self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(key_shape).transpose(1, 2)
        k_pass, value_states = torch.split(k_pass, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k_rot = k_rot.view(batch_size, 1, seq_length, self.qk_rope_head_dim)
        cos, sin = position_embeddings
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
        k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
        query_states = torch.cat((q_pass, q_rot), dim=-1)
        key_states = torch.cat((k_pass, k_rot), dim=-1)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states,
                                                              self.layer_idx)
        attn_output, _ = hm.llama_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask, scaling=self.scaling)
        attn_output = attn_output.reshape(batch_size, seq_length, -1).contiguous()
        return self.o_proj(attn_output)


class DeepseekMLP(nn.Module):
    def __init__(self, c, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, c.hidden_size, bias=False)
        self.act_fn = hm.make_activation(c.hidden_act)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class GroupedExperts(nn.Module):
    """The experts as one pair of parameters, computed grouped (see the module docstring)."""

    def __init__(self, c):
        super().__init__()
        self.num_experts = c.n_routed_experts
        self.gate_up_proj = nn.Parameter(
            torch.empty(c.n_routed_experts, 2 * c.moe_intermediate_size, c.hidden_size))
        self.down_proj = nn.Parameter(
            torch.empty(c.n_routed_experts, c.hidden_size, c.moe_intermediate_size))
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)
        self.act_fn = hm.make_activation(c.hidden_act)

    def forward(self, hidden_states, top_k_weights):
        num_tokens, hidden_dim = hidden_states.shape
        top_k = top_k_weights.shape[-1]
        slots = num_tokens * top_k
        per_expert = slots // self.num_experts
        # uniform routing: the slots sorted by expert, each expert getting slots / E of them
        token_idx = torch.arange(slots) // top_k
        selected = hidden_states[token_idx]
        gate_up = torch.bmm(selected.view(self.num_experts, per_expert, hidden_dim),
                            self.gate_up_proj.transpose(1, 2)).view(slots, -1)
        gate, up = gate_up.chunk(2, dim=-1)
        current = self.act_fn(gate) * up
        out = torch.bmm(current.view(self.num_experts, per_expert, -1),
                        self.down_proj.transpose(1, 2)).view(slots, hidden_dim)
        weights = top_k_weights.view(-1, 1)[torch.arange(slots)]
        out = out * weights
        final = torch.zeros(num_tokens, hidden_dim, dtype=hidden_states.dtype)
        final.index_add_(0, token_idx, out.to(hidden_states.dtype))
        return final


class DeepseekMoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.top_k = c.num_experts_per_tok
        self.norm_topk_prob = c.norm_topk_prob
        self.gate_weight = nn.Parameter(torch.empty(c.n_routed_experts, c.hidden_size))
        nn.init.normal_(self.gate_weight, std=0.02)
        self.experts = GroupedExperts(c)
        self.shared_experts = DeepseekMLP(c, c.moe_intermediate_size * c.n_shared_experts)

    def forward(self, hidden_states):
        residuals = hidden_states
        orig_shape = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_states.shape[-1])
        router_logits = F.linear(hidden_states, self.gate_weight)
        routing_weights = F.softmax(router_logits, dim=-1, dtype=torch.float)
        topk_weights, _ = torch.topk(routing_weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
        hidden_states = self.experts(hidden_states, topk_weights).view(*orig_shape)
        hidden_states = hidden_states + self.shared_experts(residuals)
        return hidden_states


class DeepseekDecoderLayer(hm.GradientCheckpointingLayer):
    def __init__(self, c, layer_idx):
        super().__init__()
        self.self_attn = DeepseekAttention(c, layer_idx)
        if layer_idx >= c.first_k_dense_replace:
            self.mlp = DeepseekMoE(c)
        else:
            self.mlp = DeepseekMLP(c, c.intermediate_size)
        self.input_layernorm = hm.LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = hm.LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=False, position_embeddings=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, position_embeddings, attention_mask,
                                       past_key_values)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


# --------------------------------------------------------------------------------------------
# Mixtral (mixtral/modeling_mixtral.py before the 3-D experts: MixtralSparseMoeBlock with one
# MixtralBlockSparseTop2MLP module per expert, run one by one on the rows routed to it)

def forced_routing(num_tokens, top_k, num_experts, imbalance):
    """selected_experts [T, k] realising the routing memsim assumes (--moe-imbalance): uniform
    at 1, T*k/E slots each and the remainder one more to the first experts; above 1 the last
    expert takes min(T, ceil(f*T*k/E)) tokens and the others share the rest evenly, the first
    ones one more. A token meets k distinct experts (each expert takes the tokens with the most
    choices still open)."""
    slots = num_tokens * top_k
    if imbalance <= 1 or num_experts == 1:
        counts = [slots // num_experts + (1 if e < slots % num_experts else 0)
                  for e in range(num_experts)]
    else:
        hot = max(-(-slots // num_experts), math.ceil(imbalance * slots / num_experts))
        hot = min(hot, num_tokens, slots)
        rest, others = slots - hot, num_experts - 1
        counts = [rest // others + (1 if e < rest % others else 0) for e in range(others)]
        counts.append(hot)
    need = [top_k] * num_tokens
    chosen = [[] for _ in range(num_tokens)]
    for e in sorted(range(num_experts), key=lambda e: -counts[e]):
        order = sorted(range(num_tokens), key=lambda t: (-need[t], t))
        for t in order[:counts[e]]:
            assert need[t] > 0
            chosen[t].append(e)
            need[t] -= 1
    assert all(n == 0 for n in need)
    return torch.tensor(chosen, dtype=torch.long)


class MixtralBlockSparseTop2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.w2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.w3 = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.act_fn = hm.make_activation(c.hidden_act)

    def forward(self, hidden_states):
        current_hidden_states = self.act_fn(self.w1(hidden_states)) * self.w3(hidden_states)
        return self.w2(current_hidden_states)


class MixtralSparseMoeBlock(nn.Module):
    def __init__(self, c, imbalance):
        super().__init__()
        self.num_experts = c.num_local_experts
        self.top_k = c.num_experts_per_tok
        self.imbalance = imbalance
        self.gate = nn.Linear(c.hidden_size, self.num_experts, bias=False)
        self.experts = nn.ModuleList([MixtralBlockSparseTop2MLP(c)
                                      for _ in range(self.num_experts)])

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        # the routing under test instead of the router's choice (same shape and dtype)
        selected_experts = forced_routing(hidden_states.shape[0], self.top_k, self.num_experts,
                                          self.imbalance)
        final_hidden_states = torch.zeros((batch_size * sequence_length, hidden_dim),
                                          dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in range(self.num_experts):
            expert_layer = self.experts[expert_idx]
            idx, top_x = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
        final_hidden_states = final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)
        return final_hidden_states


def MixtralForCausalLM(config_dict, imbalance=1.0):
    model = hm.LlamaForCausalLM(config_dict)
    for layer in model.model.layers:
        layer.mlp = MixtralSparseMoeBlock(model.config, imbalance)
    model.post_init(model.config.initializer_range)
    return model


# --------------------------------------------------------------------------------------------
# The Llama-shaped model and head the three share

PHI3_DEFAULTS = dict(hm.LLAMA_DEFAULTS, resid_pdrop=0.0, embd_pdrop=0.0)
DEEPSEEK_DEFAULTS = dict(hm.LLAMA_DEFAULTS, q_lora_rank=1536, first_k_dense_replace=0,
                         n_shared_experts=1, norm_topk_prob=False)


class DecoderModel(nn.Module):
    def __init__(self, c, layer_cls, rotary_dim):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, c.pad_token_id)
        if c.get("embd_pdrop", 0.0):
            raise ValueError("embedding dropout is not modelled here")
        self.layers = nn.ModuleList([layer_cls(c, i) for i in range(c.num_hidden_layers)])
        self.norm = hm.LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.rotary_emb = hm.RotaryEmbedding(rotary_dim, c.rope_theta)
        self.gradient_checkpointing = False

    def forward(self, input_ids, use_cache):
        inputs_embeds = self.embed_tokens(input_ids)
        past_key_values = hm.DynamicCache(self.config.num_hidden_layers) if use_cache else None
        past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = torch.arange(inputs_embeds.shape[1]) + past_seen
        position_ids = position_ids.unsqueeze(0)
        causal_mask = hm.create_causal_mask(self.config, inputs_embeds, None, past_key_values,
                                            position_ids=position_ids)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=causal_mask,
                                  position_embeddings=position_embeddings,
                                  position_ids=position_ids, past_key_values=past_key_values,
                                  use_cache=use_cache)
        hidden_states = self.norm(hidden_states)
        return hidden_states, past_key_values


class DecoderForCausalLM(hm.CausalLMBase):
    def __init__(self, config_dict, defaults, layer_cls, rotary_dim_of):
        super().__init__()
        self.config = c = hm.Config(config_dict, defaults)
        if c.num_key_value_heads is None:
            c.num_key_value_heads = c.num_attention_heads
        self.model = DecoderModel(c, layer_cls, rotary_dim_of(c))
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.post_init(c.initializer_range)

    def base_model(self):
        return self.model

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, labels=None, use_cache=None, logits_to_keep=0):
        use_cache = self.resolve_use_cache(use_cache)
        hidden_states, past_key_values = self.model(input_ids, use_cache)
        logits = self.lm_head(hidden_states[:, slice(-logits_to_keep, None), :])
        loss = None
        if labels is not None:
            loss = hm.ForCausalLMLoss(logits, labels, vocab_size=self.config.vocab_size)
        return hm.CausalLMOutput(loss=loss, logits=logits, past_key_values=past_key_values)


def Phi3ForCausalLM(config_dict):
    return DecoderForCausalLM(config_dict, PHI3_DEFAULTS, Phi3DecoderLayer,
                              lambda c: c.hidden_size // c.num_attention_heads)


def DeepseekForCausalLM(config_dict):
    return DecoderForCausalLM(config_dict, DEEPSEEK_DEFAULTS, DeepseekDecoderLayer,
                              lambda c: c.qk_rope_head_dim)


FAMILIES = {
    "qwen2": Qwen2ForCausalLM,
    "gemma2": Gemma2ForCausalLM,
    "phi3": Phi3ForCausalLM,
    "olmo": OlmoForCausalLM,
    "mixtral": MixtralForCausalLM,
    "deepseek_v2": DeepseekForCausalLM,
}


def build_model(config_dict):
    return FAMILIES[config_dict["model_type"]](config_dict)
