"""A real-model corpus: transformers vision and audio models and diffusers image models
from tiny configs (random weights, no downloads). Each analyzes with nothing unsupported
and validates against the library's own forward; ViT's count is derived by hand."""

import pytest
import torch

import solbound

pytest.importorskip("transformers")
from programs import corpus  # noqa: E402

NAMES = [n for n in corpus.MODELS]


@pytest.mark.parametrize("name", NAMES)
def test_real_model_analyzes_whole_and_validates(name):
    if name in corpus.DIFFUSERS:
        pytest.importorskip("diffusers")
    torch.manual_seed(0)
    m, inputs = corpus.MODELS[name]()
    rep = solbound.analyze(m.eval(), inputs, validate=True)
    assert rep.lowered.unsupported == [], [(u.operator, u.source) for u in rep.lowered.unsupported]
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs > 0 and rep.counts.fused.bytes > 0


def test_vit_counts_only_what_the_class_token_needs():
    """ViT-for-classification reads the CLS token of the last layer: that layer computes
    keys and values for all 17 tokens but queries, attention, projection and MLP for one."""
    torch.manual_seed(0)
    m, inputs = corpus.vit()
    rep = solbound.analyze(m.eval(), inputs)
    t, d, f, heads, hd, labels = 17, 32, 64, 4, 8, 10
    patch = 16 * (3 * 8 * 8) * d                        # the patch-embedding convolution
    norm = d                                            # one LayerNorm row: sum of squares
    full = 3 * t * d * d + 2 * heads * hd * t * t + t * d * d + 2 * t * d * f + 2 * t * norm
    last = (2 * t + 1) * d * d + 2 * heads * hd * t + d * d + 2 * d * f + t * norm + norm
    assert rep.counts.macs == patch + full + last + norm + d * labels
