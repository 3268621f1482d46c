"""A fixed sample of keras-hub's backbones that no other test builds, each configured from
its own class (its documented example over its defaults) and made small by the registry's
one rule over argument names (``bench/keras_registry.py``), called on the JAX backend:
nothing unsupported, validated against JAX. ``python bench/keras_registry.py`` runs every
backbone (docs/jax.md, "keras-hub's backbones")."""

import importlib.util
import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
pytest.importorskip("keras_hub")
if keras.backend.backend() != "jax":
    pytest.skip("keras runs another backend here", allow_module_level=True)

_spec = importlib.util.spec_from_file_location(
    "keras_registry", os.path.join(os.path.dirname(__file__), "..", "bench", "keras_registry.py"))
kr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kr)

# text encoders and decoders, a mixture of experts (top_k), Fourier mixing (fft, complex
# numbers), a vision transformer with a distillation token (tile), a convolutional network
SAMPLE = ["BertBackbone", "GPT2Backbone", "MixtralBackbone", "FNetBackbone", "DeiTBackbone",
          "ResNetBackbone"]


def test_the_shrinker_is_one_rule_over_argument_names():
    small, changed = kr.shrink_kwargs({
        "vocabulary_size": 32000, "num_layers": 6, "num_query_heads": 32,
        "num_key_value_heads": 8, "hidden_dim": 4096, "intermediate_dim": 14336,
        "num_experts": 8, "top_k": 2, "image_shape": (224, 224, 3),
        "stackwise_num_blocks": [3, 4, 6, 3], "stackwise_num_filters": [64, 128, 256, 512],
        "layer_types": ["sliding", "sliding", "full"] * 2, "dropout": 0.1})
    # 32 query heads over 8 key/value heads: groups of 4 kept, so 4 over 1
    assert (small["num_query_heads"], small["num_key_value_heads"]) == (4, 1)
    assert (small["hidden_dim"], small["intermediate_dim"], small["vocabulary_size"]) == \
        (64, 128, 4096)
    assert (small["num_experts"], small["top_k"]) == (4, 2)
    assert small["image_shape"] == (64, 64, 3)
    assert small["stackwise_num_blocks"] == [2, 2, 2, 2]
    assert small["stackwise_num_filters"] == [64, 128, 256, 256]
    assert small["dropout"] == 0.1 and "dropout" not in changed
    # a list per layer keeps one layer of each kind; the layer count follows it
    assert small["layer_types"] == ["sliding", "full"] and small["num_layers"] == 2
    assert changed["vocabulary_size"] == (32000, 4096)


def test_a_documented_example_is_read_not_run():
    spec = kr.configure(kr._class("BertBackbone"))
    # BertBackbone's docstring: "Randomly initialized BERT encoder with a custom config"
    assert spec.kwargs["vocabulary_size"] == 30552 and spec.kwargs["max_sequence_length"] == 128


@pytest.mark.parametrize("name", SAMPLE)
def test_a_keras_hub_backbone_analyzes_and_validates(name):
    rec = kr.one(name)
    assert rec["status"] == "analyzed", rec
    assert rec["unsupported"] == []
    assert rec["validation"] == "passed", rec
