"""nn.MultiheadAttention and nn.TransformerEncoderLayer/TransformerEncoder (PyTorch's parameter
names, initialization and semantics), written in tessera ops; the compiler fuses them."""
import copy
import math

import tessera
from tessera.nn import functional as F
from tessera.nn import init
from tessera.nn.layers import Dropout, LayerNorm, Linear, ModuleList
from tessera.nn.module import Module, Parameter


def _mask_scores(scores, mask, what):
    """PyTorch's MultiheadAttention masks: bool True means 'may not attend'; float masks add."""
    if mask is None:
        return scores
    if mask.dtype == tessera.bool:
        return scores.masked_fill(mask, float("-inf"))
    if not mask.is_floating_point():
        raise TypeError(f"MultiheadAttention: {what} must be bool or floating point, got {mask.dtype}")
    return scores + mask


class MultiheadAttention(Module):
    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if add_bias_kv or add_zero_attn or (kdim not in (None, embed_dim)) or (vdim not in (None, embed_dim)):
            raise TypeError("tessera.nn.MultiheadAttention: add_bias_kv, add_zero_attn and kdim/vdim other than "
                            "embed_dim are not supported")
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        f = {"device": device or "cpu", "dtype": dtype or tessera.float32}
        self.in_proj_weight = Parameter(tessera.empty((3 * embed_dim, embed_dim), **f))
        if bias:
            self.in_proj_bias = Parameter(tessera.zeros(3 * embed_dim, **f))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        init.xavier_uniform_(self.in_proj_weight)
        if bias:
            init.zeros_(self.out_proj.bias)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        L, N, E = query.shape
        S, H, D = key.shape[0], self.num_heads, self.head_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        q, k, v = (F.linear(x, w[i * E:(i + 1) * E], None if b is None else b[i * E:(i + 1) * E])
                   for i, x in enumerate((query, key, value)))
        q = q.reshape(L, N * H, D).transpose(0, 1)
        k = k.reshape(S, N * H, D).transpose(0, 1)
        v = v.reshape(S, N * H, D).transpose(0, 1)
        scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        if is_causal and attn_mask is None:
            attn_mask = tessera.ones(L, S, dtype=tessera.bool, device=query.device).triu(1)
        if attn_mask is not None:
            scores = _mask_scores(scores, attn_mask if attn_mask.dim() == 2 else attn_mask.reshape(N * H, L, S),
                                  "attn_mask")
        if key_padding_mask is not None:
            scores = _mask_scores(scores.reshape(N, H, L, S), key_padding_mask.reshape(N, 1, 1, S),
                                  "key_padding_mask").reshape(N * H, L, S)
        attn = scores.softmax(-1)
        if self.dropout > 0 and self.training:
            attn = F.dropout(attn, self.dropout)
        out = attn.matmul(v).transpose(0, 1).reshape(L, N, E)
        out = self.out_proj(out)
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        weights = attn.reshape(N, H, L, S)
        if average_attn_weights:
            weights = weights.mean(1)
        return out, (weights if batched else weights.squeeze(0))


def _activation_fn(activation):
    if callable(activation):
        return activation
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise RuntimeError(f"activation should be relu/gelu, not {activation}")


class TransformerEncoderLayer(Module):
    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=F.relu, layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, device=device, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, device=device, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation_fn(activation)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


class TransformerEncoder(Module):
    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return x if self.norm is None else self.norm(x)
