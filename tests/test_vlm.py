"""Vision-language models (issue 42): a LLaVA built from a small config, called as its
documentation calls it, traces, counts and validates."""

import torch
from programs.hf import ImageTextLM

import solbound


def test_a_small_llava_traces_with_its_vision_feature_layer_and_validates():
    """LLaVA reads its vision tower's second-to-last hidden state, recorded by hooks
    transformers installs once on the layers present at the first call: when that call was
    the two-layer trace of a rerolled stack, the other layers never recorded and the model
    failed ("'NoneType' object is not subscriptable"). Its image features are put at its
    image tokens by ``masked_scatter`` (unsupported before: a running count and a
    gather now)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, \
        LlavaForConditionalGeneration
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                              num_attention_heads=2, image_size=28, patch_size=7)
    text = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_id=63)
    torch.manual_seed(0)
    m = LlavaForConditionalGeneration(cfg).eval()
    ids = torch.randint(0, 60, (1, 24))
    ids[0, 2:18] = 63                       # 16 image tokens: (28 / 7)^2 patches
    pixels = torch.randn(1, 3, 28, 28)

    rep = solbound.analyze(ImageTextLM(m), (ids, pixels), validate=True)
    assert not rep.to_dict()["unsupported"]
    assert rep.validation["status"] == "passed", rep.validation.get("reason")
