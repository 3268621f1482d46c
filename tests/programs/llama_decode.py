"""One decode step of a Llama-style block against a static KV cache, in KernelBench's file
convention (written for these tests): RMSNorm, grouped-query attention with rotary
embeddings, the new key/value rows written into the cache buffers at position ``pos``
(slice assignment), attention over rows 0..pos, SwiGLU MLP."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch, dim, heads, kv_heads, head_dim, ffn, ctx, pos = 2, 64, 4, 2, 16, 128, 32, 20


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


def rotate(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Model(nn.Module):
    def __init__(self, dim, heads, kv_heads, head_dim, ffn, ctx, pos):
        super().__init__()
        self.h, self.kv, self.hd, self.pos = heads, kv_heads, head_dim, pos
        self.n1, self.n2 = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, heads * head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, dim, bias=False)
        self.gate = nn.Linear(dim, ffn, bias=False)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)
        self.register_buffer("k_cache", torch.zeros(batch, kv_heads, ctx, head_dim))
        self.register_buffer("v_cache", torch.zeros(batch, kv_heads, ctx, head_dim))
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        ang = torch.outer(torch.arange(ctx).float(), inv)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos())
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin())

    def forward(self, x):
        b, t, _ = x.shape
        p = self.pos
        h = self.n1(x)
        q = self.q(h).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        cos, sin = self.cos[p:p + t], self.sin[p:p + t]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        self.k_cache[:, :, p:p + t] = k
        self.v_cache[:, :, p:p + t] = v
        g = self.h // self.kv
        keys = self.k_cache[:, :, :p + t].unsqueeze(2).expand(b, self.kv, g, p + t, self.hd)
        vals = self.v_cache[:, :, :p + t].unsqueeze(2).expand(b, self.kv, g, p + t, self.hd)
        keys = keys.reshape(b, self.h, p + t, self.hd)
        vals = vals.reshape(b, self.h, p + t, self.hd)
        a = F.scaled_dot_product_attention(q, keys, vals)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, self.h * self.hd))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def get_inputs():
    return [torch.randn(batch, 1, dim)]


def get_init_inputs():
    return [dim, heads, kv_heads, head_dim, ffn, ctx, pos]
