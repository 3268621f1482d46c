"""Hand-written mixture-of-experts dispatches whose sizes follow the routing.

Three ways real code sends tokens to experts, each with data-dependent sizes that
tracing alone cannot follow (KernelBench file convention; ``DISPATCH`` picks one):

* ``where``: a loop over the experts hit, ``torch.where`` on a one-hot routing mask,
  ``if top.numel() == 0: continue`` and ``index_add_`` (Mixtral's eager code);
* ``sort``: tokens sorted by expert, per-expert counts from ``bincount().tolist()``,
  slices of the sorted tokens, results scattered back (DeepSeek-V3's reference code);
* ``mask``: top-1 routing (``argmax``), a boolean mask per expert selecting rows and
  assigning them back (Switch Transformer's code).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

T, D, FF, E, K = 24, 8, 12, 4, 2
DISPATCH = "where"


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(D, FF, bias=False)
        self.w2 = nn.Linear(FF, D, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)))


class Model(nn.Module):
    def __init__(self, dispatch=None):
        super().__init__()
        self.dispatch = dispatch or DISPATCH
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(E))

    def forward(self, x):
        probs = F.softmax(self.gate(x), dim=-1)
        if self.dispatch == "mask":
            return self._mask(x, probs)
        w, sel = torch.topk(probs, K, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        return self._where(x, w, sel) if self.dispatch == "where" else self._sort(x, w, sel)

    def _where(self, x, w, sel):
        out = torch.zeros_like(x)
        mask = F.one_hot(sel, num_classes=E).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            slot, top = torch.where(mask[e].squeeze(0))
            if top.numel() == 0:
                continue
            out.index_add_(0, top, self.experts[e](x[top]) * w[top, slot, None])
        return out

    def _sort(self, x, w, sel):
        flat = sel.view(-1)
        order = flat.argsort()
        counts = torch.bincount(flat, minlength=E).tolist()
        tokens = x[order // K]
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            outs.append(self.experts[e](tokens[start:start + n]))
            start += n
        done = torch.cat(outs, dim=0)
        back = torch.empty_like(done)
        back[order] = done
        return (back.view(x.shape[0], K, D) * w.unsqueeze(-1)).sum(dim=1)

    def _mask(self, x, probs):
        top = torch.argmax(probs, dim=-1)
        out = x.clone()
        for e, expert in enumerate(self.experts):
            chosen = top == e
            out[chosen] = expert(x[chosen])
        return out * probs.max(dim=-1, keepdim=True).values


def get_inputs():
    return [torch.randn(T, D)]


def get_init_inputs():
    return []
