"""Real models nobody here wrote, built from tiny configs with random weights (no
downloads): transformers vision and audio models and diffusers' image models. Each builder
returns ``(module, inputs)``; shared by tests/test_corpus.py."""
import torch


def _t():
    import transformers
    return transformers


class Out(torch.nn.Module):
    """One tensor of a model's output (an attribute such as ``logits``, or the first)."""

    def __init__(self, m, key=None, **kw):
        super().__init__()
        self.m, self.key, self.kw = m, key, kw

    def forward(self, *xs):
        o = self.m(*xs, **self.kw)
        if self.key:
            return getattr(o, self.key)
        return o if isinstance(o, torch.Tensor) else o[0]


class Call(torch.nn.Module):
    """``fn(model, *inputs)``: a model whose forward takes keywords."""

    def __init__(self, m, fn):
        super().__init__()
        self.m, self.fn = m, fn

    def forward(self, *xs):
        return self.fn(self.m, *xs)


def vit():
    """ViT: 32x32 image, 8x8 patches (16 + CLS = 17 tokens), width 32, 2 layers, 4 heads."""
    cfg = _t().ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, image_size=32, patch_size=8, num_labels=10)
    return Out(_t().ViTForImageClassification(cfg), "logits"), (torch.randn(1, 3, 32, 32),)


def convnext():
    cfg = _t().ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=10,
                              image_size=32)
    return Out(_t().ConvNextForImageClassification(cfg), "logits"), (torch.randn(1, 3, 32, 32),)


def swin():
    cfg = _t().SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1],
                          num_heads=[2, 2], window_size=4, num_labels=10)
    return Out(_t().SwinForImageClassification(cfg), "logits"), (torch.randn(1, 3, 32, 32),)


def clip():
    text = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                vocab_size=100, max_position_embeddings=16, bos_token_id=0, eos_token_id=1)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, image_size=32, patch_size=8)
    cfg = _t().CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    model = Call(_t().CLIPModel(cfg),
                 lambda m, ids, px: m(input_ids=ids, pixel_values=px).logits_per_image)
    return model, (torch.randint(0, 100, (2, 7)), torch.randn(1, 3, 32, 32))


def wav2vec2():
    cfg = _t().Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                              conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                              num_conv_pos_embedding_groups=4, vocab_size=20)
    return Out(_t().Wav2Vec2ForCTC(cfg), "logits"), (torch.randn(1, 800),)


def detr():
    backbone = _t().ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 32, 64],
                                 depths=[1, 1, 1, 1], layer_type="basic",
                                 out_features=["stage4"])
    cfg = _t().DetrConfig(use_timm_backbone=False, backbone_config=backbone,
                          use_pretrained_backbone=False, d_model=32, encoder_layers=1,
                          decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                          encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5, num_labels=3)
    return Out(_t().DetrForObjectDetection(cfg), "logits"), (torch.randn(1, 3, 64, 64),)


def unet():
    from diffusers import UNet2DConditionModel
    m = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                             block_out_channels=(32, 64),
                             down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                             up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                             cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8)
    model = Call(m, lambda m, x, t, c: m(x, t, encoder_hidden_states=c).sample)
    return model, (torch.randn(1, 4, 16, 16), torch.tensor([10]), torch.randn(1, 5, 32))


def vae():
    from diffusers import AutoencoderKL
    m = AutoencoderKL(in_channels=3, out_channels=3,
                      down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                      up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
                      block_out_channels=(16, 32), layers_per_block=1, latent_channels=4,
                      norm_num_groups=8, sample_size=32)
    return Call(m, lambda m, x: m(x, sample_posterior=False).sample), (torch.randn(1, 3, 32, 32),)


def dit():
    from diffusers import DiTTransformer2DModel
    m = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                              out_channels=4, num_layers=2, sample_size=8, patch_size=2,
                              num_embeds_ada_norm=10, norm_num_groups=4)
    model = Call(m, lambda m, x, t, y: m(x, timestep=t, class_labels=y).sample)
    return model, (torch.randn(1, 4, 8, 8), torch.tensor([3]), torch.tensor([1]))


MODELS = dict(vit=vit, convnext=convnext, swin=swin, clip=clip, wav2vec2=wav2vec2, detr=detr,
              unet=unet, vae=vae, dit=dit)
DIFFUSERS = ("unet", "vae", "dit")
