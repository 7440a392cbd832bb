"""Vision towers of multimodal checkpoints: their parameters, loaded with the decoder but used by no text token."""

from __future__ import annotations

import math

from kvplan.errors import KvplanError
from kvplan.model import MultimodalInput
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


def _qwen3_5_vision(vision: Fields, text_hidden: int, deepstack: bool = False) -> int:
    """Qwen3.5 and Qwen3-VL (transformers `Qwen3_5VisionModel`, `Qwen3VLVisionModel`): a biased Conv3d patch
    embedding (channels x temporal_patch_size x patch^2 -> hidden), a learned position table
    (num_position_embeddings x hidden), depth pre-norm ViT layers, and the patch merger that is the projector into
    the decoder: a LayerNorm over hidden, then two biased matrices over the merged width m = hidden x
    spatial_merge_size^2 (m x m, m x out_hidden_size). Qwen3-VL (`deepstack`) adds one merger per
    deepstack_visual_indexes entry, its LayerNorm over m; Qwen3.5's model builds none, whatever the config lists."""
    hidden, intermediate = vision.int("hidden_size"), vision.int("intermediate_size")
    patch = vision.int("patch_size")
    merged = hidden * vision.int("spatial_merge_size") ** 2
    out = vision.int("out_hidden_size")
    embed = vision.int("in_channels", default=3) * vision.int("temporal_patch_size") * patch * patch * hidden + hidden
    tower = (embed + vision.int("num_position_embeddings") * hidden
             + vision.layers("depth") * _vit_layer(hidden, intermediate))
    mlp = merged * merged + merged + merged * out + out
    mergers = len(vision.list("deepstack_visual_indexes", int)) if deepstack else 0
    return tower + 2 * hidden + mlp + mergers * (2 * merged + mlp)


def _qwen3_vl_vision(vision: Fields, text_hidden: int) -> int:
    return _qwen3_5_vision(vision, text_hidden, deepstack=True)


VISION_TOWERS = {"gemma3": _gemma3_vision, "gemma4": _gemma4_vision, "llama4": _llama4_vision,  # by model_type
                 "qwen3_vl": _qwen3_vl_vision, "qwen3_vl_moe": _qwen3_vl_vision, "qwen3_5": _qwen3_5_vision,
                 "qwen3_5_moe": _qwen3_5_vision}


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
                     "is not counted (kvplan counts Gemma 3, Gemma 4, Llama 4, Qwen3-VL and Qwen3.5 vision towers)")
        return 0
    count = counter(top.mapping("vision_config"), text.int("hidden_size", "n_embd", "d_model", "dim"))
    notes.append(f"text decoder read from text_config; weights include the vision tower and projector "
                 f"({count / 1e9:.2f}B params, not active for text)")
    if top.has("audio_config"):
        notes.append(f"the audio encoder of {model_type} is not counted")
    return count


# The largest item's decoder embedding rows at the processor's defaults, as vLLM 0.33.0 counts them for its encoder
# budget (`get_mm_max_toks_per_item`: the embedding positions of its largest dummy item), by model_type.
LLAMA4_MAX_TILES = 16  # transformers Llama4ImageProcessor max_patches; vLLM's dummy image is 16 tiles tall


def _gemma3_tokens(top: Fields, vision: Fields) -> tuple[int, str]:
    """Gemma 3 (vLLM models/gemma3_mm.py `get_num_image_tokens`): (crops + 1) x image_seq_length, with no crops unless
    pan-and-scan is asked for (Gemma3ImageProcessor's do_pan_and_scan is off by default); image_seq_length is
    the config's mm_tokens_per_image (the projector pools the SigLIP grid to it)."""
    tokens = top.int("mm_tokens_per_image", default=256)
    return tokens, "mm_tokens_per_image; pan-and-scan off, the processor's default"


def _llama4_tokens(top: Fields, vision: Fields) -> tuple[int, str]:
    """Llama 4 (vLLM models/mllama4.py): the dummy image is max_patches tiles tall, so it takes max_patches tiles
    and a global one, each (image_size / patch_size)^2 // round(1 / pixel_shuffle_ratio^2) embedding rows
    (`get_patch_per_chunk`; 336 / 14 = 24, 576 // 4 = 144). The shuffle merges 1 / ratio^2 patches into one row
    (transformers `pixel_shuffle`), so a ratio above 1, or one merging more patches than a tile has, leaves no row."""
    ratio = vision.number("pixel_shuffle_ratio")
    patches = (vision.int("image_size") // vision.int("patch_size")) ** 2
    if not patches:
        raise KvplanError(f"{vision.where}: field image_size is smaller than patch_size: a tile has no patches")
    if not (ratio <= 1 and ratio * ratio * (patches + 0.5) > 1):  # so that 1 <= round(1 / ratio^2) <= patches
        raise KvplanError(f"{vision.where}: field pixel_shuffle_ratio is {ratio:g}: it merges 1 / ratio^2 patches "
                          f"into one embedding row, so it must be between {1 / math.sqrt(patches):.3g} (all "
                          f"{patches:,} patches of a tile in one) and 1")
    per_tile = patches // round(1 / ratio**2)
    tiles = LLAMA4_MAX_TILES + 1
    return tiles * per_tile, (f"{tiles} tiles of {per_tile}: the image processor's max_patches {LLAMA4_MAX_TILES} "
                              "and a global tile")


ITEM_TOKENS = {"gemma3": _gemma3_tokens, "llama4": _llama4_tokens}
# The modalities each family's vision tower encodes (vLLM `_mark_tower_model` in models/gemma4_mm.py, qwen3_5.py,
# qwen3_vl.py); a family not listed takes images.
TOWER_MODALITIES = {"gemma4": ("image", "video"), "qwen3_vl": ("image", "video"), "qwen3_vl_moe": ("image", "video"),
                    "qwen3_5": ("image", "video"), "qwen3_5_moe": ("image", "video")}


def multimodal_input(top: Fields, text: Fields) -> MultimodalInput | None:
    """The non-text inputs of a checkpoint with a text_config beside a vision_config or audio_config: its modalities
    (an audio_config adds audio), those the counted vision tower encodes (none where kvplan does not count the
    tower), and the embedding rows of the largest item where kvplan knows the processor (Gemma 3, Llama 4)."""
    if not (top.has("vision_config") or top.has("audio_config")):
        return None
    model_type = str(top.get("model_type", default=""))
    tower = TOWER_MODALITIES.get(model_type, ("image",)) if top.has("vision_config") else ()
    modalities = (*tower, *(("audio",) if top.has("audio_config") else ()))
    counted = model_type in VISION_TOWERS and top.has("vision_config")
    tokens, basis = None, ""
    if model_type in ITEM_TOKENS and top.has("vision_config"):
        tokens, basis = ITEM_TOKENS[model_type](top, top.mapping("vision_config"))
    return MultimodalInput(modalities=modalities, tower_modalities=tower if counted else (), tokens_per_item=tokens,
                           item_modality="image" if tokens else None,
                           embedding_width=text.int("hidden_size", "n_embd", "d_model", "dim"), basis=basis)


FLAT_ENCODERS = frozenset({"git", "phi4_multimodal"})  # decoders whose own config holds the towers they count


def flat_encoders_note(top: Fields, notes: list[str]) -> None:
    """A config with a vision_config or audio_config beside its text fields (no text_config; Qwen2-VL's config.json
    on the Hub is one) whose family's towers kvplan does not count: say so, as for nested configs."""
    model_type = str(top.get("model_type", default=""))
    encoders = [name.removesuffix("_config") for name in ("vision_config", "audio_config") if top.has(name)]
    if encoders and model_type not in FLAT_ENCODERS:
        notes.append(f"the {' and '.join(encoders)} encoder of {model_type or 'this model'} is not counted (kvplan "
                     "counts the towers of Gemma 3, Gemma 4, Llama 4, Qwen3-VL, Qwen3.5, GIT and Phi-4-multimodal)")
