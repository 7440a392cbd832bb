"""Vision towers of multimodal checkpoints: their parameters, loaded with the decoder but used by no text token."""

from __future__ import annotations

import math

from kvplan.sources.hf_config.fields import Fields


def _vit_attention_and_mlp(hidden: int, intermediate: int) -> int:
    """A ViT block's attention and MLP (SigLIP, Llama 4 vision): q, k, v, o with biases; fc1, fc2 with biases."""
    return 4 * (hidden * hidden + hidden) + 2 * hidden * intermediate + intermediate + hidden


def _vit_layer(hidden: int, intermediate: int) -> int:
    """One pre-norm ViT encoder layer: attention and MLP, and two LayerNorms (weight and bias)."""
    return _vit_attention_and_mlp(hidden, intermediate) + 2 * 2 * hidden


def _gemma3_vision(vision: Fields, text_hidden: int) -> int:
    """Gemma 3: a SigLIP vision transformer (transformers `SiglipVisionModel`) and `Gemma3MultiModalProjector`.
    SigLIP: a patch Conv2d with bias, one learned position per patch, the layers, a post LayerNorm, and the
    attention-pooling head only if vision_use_head (Gemma 3 sets it false). Projector: a vision x text matrix
    and an RMSNorm over the vision width."""
    hidden, intermediate = vision.int("hidden_size"), vision.int("intermediate_size")
    patch = vision.int("patch_size")
    patches = (vision.int("image_size") // patch) ** 2
    tower = (vision.int("num_channels", default=3) * patch * patch * hidden + hidden + patches * hidden
             + vision.layers("num_hidden_layers") * _vit_layer(hidden, intermediate) + 2 * hidden)
    if vision.flag("vision_use_head", default=True):  # probe, nn.MultiheadAttention and MLP, LayerNorm
        tower += hidden + _vit_attention_and_mlp(hidden, intermediate) + 2 * hidden
    return tower + hidden * text_hidden + hidden


def _llama4_vision(vision: Fields, text_hidden: int) -> int:
    """Llama 4: `Llama4VisionModel` and `Llama4MultiModalProjector`. The tower: an unfolded patch projection
    (no bias), a class embedding, one learned position per patch plus the class token, pre and post LayerNorms,
    the layers, and the pixel-shuffle adapter's two bias-free matrices (intermediate x projector_input_dim,
    projector_output_dim squared). Projector: vision_output_dim x text hidden, no bias."""
    hidden, intermediate = vision.int("hidden_size"), vision.int("intermediate_size")
    patch = vision.int("patch_size")
    positions = (vision.int("image_size") // patch) ** 2 + 1
    adapter = intermediate * vision.int("projector_input_dim") + vision.int("projector_output_dim") ** 2
    tower = (vision.int("num_channels", default=3) * patch * patch * hidden + hidden + positions * hidden
             + 2 * 2 * hidden + vision.layers("num_hidden_layers") * _vit_layer(hidden, intermediate) + adapter)
    return tower + vision.int("vision_output_dim") * text_hidden


def _gemma4_vision(vision: Fields, text_hidden: int) -> int:
    """Gemma 4: `Gemma4VisionModel` and the `Gemma4MultimodalEmbedder` that projects it into the decoder. The
    tower: a bias-free patch projection (3 x patch^2 -> hidden), a two-axis position table (2 x
    position_embedding_size x hidden), and layers of bias-free q, k, v, o (k and v over num_key_value_heads),
    per-head q and k norms (v's has no weight), a gated MLP and four norms; its pooler and the clipping bounds and
    standardisation of some checkpoints are buffers. The projector: hidden x text hidden, after a weightless
    norm."""
    hidden, intermediate = vision.int("hidden_size"), vision.int("intermediate_size")
    head_dim = vision.int("head_dim")
    q, kv = vision.int("num_attention_heads") * head_dim, vision.int("num_key_value_heads") * head_dim
    layer = hidden * (q + 2 * kv) + q * hidden + 2 * head_dim + 3 * hidden * intermediate + 4 * hidden
    patch = vision.int("patch_size")
    tower = (3 * patch * patch * hidden + 2 * vision.int("position_embedding_size") * hidden
             + vision.layers("num_hidden_layers") * layer)
    return tower + hidden * text_hidden


VISION_TOWERS = {"gemma3": _gemma3_vision, "gemma4": _gemma4_vision, "llama4": _llama4_vision}  # by model_type


def git_vision(cfg: Fields, text_hidden: int) -> int:
    """GIT (GitModel): a CLIP vision transformer (`GitVisionModel`: a class embedding, a bias-free patch Conv2d, one
    learned position per patch plus the class token, pre and post LayerNorms, the layers), `GitProjection` (a biased
    vision x text matrix and a LayerNorm) and, with num_image_with_embedding, one temporal embedding per image."""
    vision = cfg.mapping("vision_config")
    hidden, intermediate = vision.int("hidden_size"), vision.int("intermediate_size")
    patch = vision.int("patch_size")
    positions = (vision.int("image_size") // patch) ** 2 + 1
    tower = (hidden + vision.int("num_channels", default=3) * patch * patch * hidden + positions * hidden
             + 2 * 2 * hidden + vision.layers("num_hidden_layers") * _vit_layer(hidden, intermediate))
    projector = hidden * text_hidden + text_hidden + 2 * text_hidden
    return tower + projector + cfg.int("num_image_with_embedding", default=0, minimum=0) * hidden


def phi4_multimodal_encoders(cfg: Fields, text_hidden: int) -> int:
    """Phi-4-multimodal's image and audio encoders (modeling_phi4_multimodal.py `Phi4MultimodalFeatureEmbedding`).

    Image: a SigLIP vision transformer (a biased patch Conv2d, one learned position per patch, the layers, a post
    LayerNorm and the attention-pooling head: probe, nn.MultiheadAttention, LayerNorm, MLP), biased up and down
    projections to the text width, and two learned separators (global_img_feature_extensor, sub_img_feature_extensor).

    Audio: a Conformer. Its input subsampling (`NemoConvSubsampling`) has a first Conv2d 1 -> C and, for each further
    halving of time_reduction, a depthwise 3x3 and a pointwise Conv2d, all biased, then a linear C x
    nemo_final_size -> hidden; a relative-position bias table (bias_max_distance buckets, twice that unless
    symmetric, x heads); each block has two feed-forwards (LayerNorm, gated up, down, biased), biased q, k, v, o,
    a convolution module (LayerNorm; a GLU pointwise Conv1d to 2 x ext_pw_out_channel with its two bias vectors; a
    depthwise Conv1d of kernel_size and a pointwise one; an output pointwise Conv1d) and two LayerNorms. Two pairs
    of biased projections (speech, vision-speech) take it to the text width."""
    vision = cfg.mapping("vision_config")
    hidden, intermediate, patch = vision.int("hidden_size"), vision.int("intermediate_size"), vision.int("patch_size")
    tower = (vision.int("num_channels", default=3) * patch * patch * hidden + hidden
             + (vision.int("image_size") // patch) ** 2 * hidden
             + vision.layers("num_hidden_layers") * _vit_layer(hidden, intermediate) + 2 * hidden
             + hidden + _vit_attention_and_mlp(hidden, intermediate) + 2 * hidden)
    image = tower + hidden * text_hidden + text_hidden + text_hidden * text_hidden + text_hidden + 2 * hidden

    audio = cfg.mapping("audio_config")
    width, inner, heads = audio.int("hidden_size"), audio.int("intermediate_size"), audio.int("num_attention_heads")
    channels, halvings = audio.int("nemo_conv_channels"), int(math.log2(audio.int("time_reduction")))
    subsampling = (10 * channels + (halvings - 1) * (10 * channels + channels * channels + channels)
                   + channels * audio.int("nemo_final_size") * width + width)
    buckets = audio.int("bias_max_distance") * (1 if audio.flag("bias_symmetric") else 2)
    glu, separable = audio.int("ext_pw_out_channel"), audio.int("depthwise_separable_out_channel")
    depthwise = width * audio.int("depthwise_multiplier")
    feed_forward = 2 * width + width * 2 * inner + 2 * inner + inner * width + width
    convolution = (2 * width + width * 2 * glu + 2 * glu + 2 * glu + depthwise * audio.int("kernel_size") + depthwise
                   + depthwise * separable + separable + width * glu + glu)
    block = 2 * feed_forward + 4 * (width * width + width) + convolution + 2 * 2 * width
    projections = 2 * (width * audio.int("downsample_rate", default=1) * text_hidden + text_hidden
                       + text_hidden * text_hidden + text_hidden)
    audio_total = subsampling + buckets * heads + audio.int("num_blocks") * block + projections
    return image + audio_total


def vision_params(top: Fields, text: Fields, notes: list[str]) -> int:
    """Parameters of a multimodal checkpoint's vision tower and projector, from its vision_config. They are
    loaded with the decoder (vLLM loads them unless images are turned off) but no text token touches them,
    so they count in the weights and not in the active parameters. Unknown towers are left out, with a note."""
    model_type = str(top.get("model_type", default=""))
    counter = VISION_TOWERS.get(model_type)
    others = [name for name in ("vision_config", "audio_config") if top.has(name)]
    if counter is None or not top.has("vision_config"):
        encoders = " and ".join(name.removesuffix("_config") for name in others) or "non-text"
        notes.append(f"text decoder read from text_config; the {encoders} encoder of {model_type or 'this model'} "
                     "is not counted (kvplan counts Gemma 3, Gemma 4 and Llama 4 vision towers)")
        return 0
    count = counter(top.mapping("vision_config"), text.int("hidden_size", "n_embd", "d_model", "dim"))
    notes.append(f"text decoder read from text_config; weights include the vision tower and projector "
                 f"({count / 1e9:.2f}B params, not active for text)")
    if top.has("audio_config"):
        notes.append(f"the audio encoder of {model_type} is not counted")
    return count
