"""Mamba and Mamba-2 mixers under each family's field names: their dimensions, the state they keep per sequence
and their parameters. Every Mamba family (Mamba, Falcon-Mamba, Mamba-2, Jamba, Nemotron-H, Bamba, Granite 4.0-H,
Falcon-H1, Zamba, Zamba2) builds the same two mixers from differently named fields (transformers'
configuration_<family>.py; vLLM's get_mamba_state_shape_from_config reads the same fields)."""

from __future__ import annotations

import math
from typing import NamedTuple

from kvplan.errors import KvplanError
from kvplan.model import RecurrentState
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.quantization import optional_dtype
from kvplan.text import brief

# Field names, first present wins. Mamba-2 alone names its SSM heads num_heads and head_dim: in the hybrids those
# names are the attention's.
D_STATE = ("mamba_d_state", "ssm_state_size", "state_size")
D_CONV = ("mamba_d_conv", "conv_kernel", "mamba_conv_kernel")
EXPAND = ("mamba_expand", "expand")
HEADS = ("mamba_num_heads", "mamba_n_heads", "n_mamba_heads")
HEAD_DIM = ("mamba_head_dim", "mamba_d_head", "mamba_headdim")
GROUPS = ("mamba_n_groups", "n_groups", "mamba_ngroups")
# Bias of in_proj and out_proj, by family (transformers' mixers); the others read mamba_proj_bias.
PROJ_BIAS = {"mamba": "use_bias", "falcon_mamba": "use_bias", "mamba2": "use_bias", "nemotron_h": "use_bias",
             "zamba2": "add_bias_linear"}
# Nemotron-H keeps its SSM state in fp32 unless the config says otherwise: transformers' NemotronHConfig
# (mamba_ssm_cache_dtype "float32"); vLLM's default differs by release (kvplan/engines/vllm/engine.py).
SSM_DTYPE_DEFAULT = {"nemotron_h": "fp32"}


class Mamba(NamedTuple):
    """One Mamba mixer's shape. version 1: Gu & Dao's selective SSM (Jamba, Zamba: d_inner channels, each an
    own d_state state); version 2: Mamba-2's heads (heads x head_dim = d_inner), B and C shared by groups."""

    version: int
    hidden: int
    d_inner: int
    d_state: int
    d_conv: int
    heads: int | None  # Mamba-2 heads; None for Mamba (1)
    head_dim: int | None
    groups: int | None  # Mamba-2 n_groups
    dt_rank: int | None  # Mamba (1) time-step rank
    conv_bias: bool
    in_bias: bool
    out_bias: bool
    gated_norm: bool  # Mamba-2's RMSNormGated over d_inner before out_proj
    bcdt_norms: bool  # Jamba's dt, B and C RMSNorms (dt_rank + 2 x d_state weights)

    @property
    def mixer(self) -> str:
        return "mamba" if self.version == 1 else "mamba2"

    @property
    def conv_channels(self) -> int:
        """Channels of the short convolution: x alone (Mamba) or x, B and C (Mamba-2)."""
        return self.d_inner if self.version == 1 else self.d_inner + 2 * self.groups * self.d_state


def read_mamba(cfg: Fields, model_type: str, mixer: str) -> Mamba:
    """The mixer's dimensions. d_inner: Nemotron-H heads x head_dim; Falcon-H1's mamba_d_ssm and Mamba's
    intermediate_size when set (falcon-mamba-7b's is not its expand x hidden_size); else expand x hidden_size.
    Mamba-2 head_dim: the field, or d_inner / heads where it is "auto" or absent (Zamba2 always derives it);
    heads x head_dim must equal d_inner, as transformers' configs check."""
    hidden = cfg.int("hidden_size", "d_model")
    d_state, d_conv = cfg.int(*D_STATE), cfg.int(*D_CONV)
    heads_fields = HEADS + (("num_heads",) if model_type == "mamba2" else ())
    head_dim_fields = HEAD_DIM + (("head_dim",) if model_type == "mamba2" else ())
    if model_type == "falcon_h1" and cfg.has("mamba_d_ssm"):
        d_inner = cfg.int("mamba_d_ssm")
    elif model_type in ("mamba", "falcon_mamba") and cfg.has("intermediate_size"):
        d_inner = cfg.int("intermediate_size")
    elif model_type == "nemotron_h" or not any(cfg.has(f) for f in EXPAND):
        d_inner = cfg.int(*heads_fields) * cfg.int(*head_dim_fields)
    else:
        d_inner = cfg.int(*EXPAND) * hidden
    proj_bias = cfg.flag(PROJ_BIAS.get(model_type, "mamba_proj_bias"))
    common = {"hidden": hidden, "d_inner": d_inner, "d_state": d_state, "d_conv": d_conv,
              "conv_bias": model_type == "zamba2" or cfg.flag("mamba_conv_bias", cfg.flag("use_conv_bias", True)),
              "in_bias": proj_bias}
    if mixer == "mamba":
        rank = cfg.get("mamba_dt_rank", "time_step_rank", default="auto")
        dt_rank = math.ceil(hidden / 16) if rank == "auto" else cfg.int("mamba_dt_rank", "time_step_rank")
        return Mamba(version=1, heads=None, head_dim=None, groups=None, dt_rank=dt_rank, out_bias=proj_bias,
                     gated_norm=False, bcdt_norms=model_type == "jamba", **common)
    heads = cfg.int(*heads_fields)
    explicit = cfg.get(*head_dim_fields, default="auto")
    head_dim = d_inner // heads if explicit == "auto" or model_type == "zamba2" else cfg.int(*head_dim_fields)
    if heads * head_dim != d_inner:
        raise KvplanError(f"{cfg.where}: {heads} Mamba heads of {head_dim} do not make the mixer's {d_inner:,} "
                          f"channels ({head_dim_fields[0]} x {heads_fields[0]} must equal the inner size)")
    groups = cfg.int(*GROUPS)
    if heads % groups:
        raise KvplanError(f"{cfg.where}: field {GROUPS[0]} ({groups}) must divide the {heads} Mamba heads")
    out_bias = cfg.flag("projectors_bias") if model_type == "falcon_h1" else proj_bias
    gated_norm = cfg.flag("mamba_rms_norm") if model_type == "falcon_h1" else True
    return Mamba(version=2, heads=heads, head_dim=head_dim, groups=groups, dt_rank=None, out_bias=out_bias,
                 gated_norm=gated_norm, bcdt_norms=False, **common)


def mamba_state(cfg: Fields, model_type: str, layer: int, mixer: str) -> RecurrentState:
    """State per sequence, as vLLM's MambaSpec sizes it (`mamba_utils.py` mamba1_state_shape,
    mamba2_state_shape): conv channels x (d_conv - 1), plus the SSM: d_inner x d_state (Mamba) or
    heads x head_dim x d_state (Mamba-2)."""
    m = read_mamba(cfg, model_type, mixer)
    ssm = m.d_inner * m.d_state if m.version == 1 else m.heads * m.head_dim * m.d_state
    stated = optional_dtype(cfg, "mamba_ssm_cache_dtype", "mamba_ssm_dtype")
    ssm_dtype = stated or SSM_DTYPE_DEFAULT.get(model_type)
    return RecurrentState(layer=layer, mixer=m.mixer, conv_elements=m.conv_channels * (m.d_conv - 1),
                          ssm_elements=ssm, ssm_dtype=ssm_dtype, ssm_dtype_stated=stated is not None,
                          conv_kernel=m.d_conv if m.d_conv > 1 else None, heads=m.heads, groups=m.groups,
                          state_size=m.d_state if m.version == 2 else None)


def mamba_params(cfg: Fields, model_type: str, mixer: str) -> tuple[int, int]:
    """(matrix params, other params) of one mixer (transformers' MambaMixer / Mamba2Mixer and the hybrids' copies).
    Mamba: in_proj h x 2 d_inner, x_proj d_inner x (dt_rank + 2 N), dt_proj dt_rank x d_inner, out_proj d_inner x h;
    conv d_inner x d_conv (+ bias), dt bias, A d_inner x N, D.
    Mamba-2: in_proj h x (2 d_inner + 2 G N + heads) to z, x, B, C, dt; out_proj d_inner x h; conv (d_inner + 2 G N)
    x d_conv (+ bias); dt_bias, A_log, D per head; the gated norm's d_inner weights."""
    m = read_mamba(cfg, model_type, mixer)
    h, d_inner, n = m.hidden, m.d_inner, m.d_state
    channels = m.conv_channels
    other = channels * m.d_conv + (channels if m.conv_bias else 0) + (h if m.out_bias else 0)
    if m.version == 1:
        in_width = 2 * d_inner
        matrices = h * in_width + d_inner * (m.dt_rank + 2 * n) + m.dt_rank * d_inner + d_inner * h
        other += d_inner + d_inner * n + d_inner  # dt_proj bias, A_log, D
        if m.bcdt_norms:
            other += m.dt_rank + 2 * n
    else:
        in_width = 2 * d_inner + 2 * m.groups * n + m.heads
        matrices = h * in_width + d_inner * h
        other += 3 * m.heads + (d_inner if m.gated_norm else 0)
    return matrices, other + (in_width if m.in_bias else 0)


# mamba_ssm's own checkpoint format (state-spaces/mamba-*, state-spaces/mamba2-*): d_model, n_layer and the mixer's
# arguments in ssm_cfg, with the defaults of mamba_ssm's Mamba (mamba_simple.py) and Mamba2 (mamba2.py) classes.
MAMBA_SSM_DEFAULTS = {"Mamba1": {"d_state": 16, "d_conv": 4, "expand": 2, "dt_rank": "auto"},
                      "Mamba2": {"d_state": 128, "d_conv": 4, "expand": 2, "headdim": 64, "ngroups": 1}}
# ssm_cfg arguments read besides the defaults' (the projections' and convolution's biases) and those that change
# no tensor's shape (initialisation, kernels, chunking); any other is refused.
MAMBA_SSM_OTHER_ARGS = {"layer", "dt_min", "dt_max", "dt_init", "dt_scale", "dt_init_floor", "dt_limit", "chunk_size",
                       "use_mem_eff_path", "activation", "norm_before_gate", "A_init_range", "conv_init",
                       "bias", "conv_bias"}


def is_mamba_ssm_config(config: dict) -> bool:
    """mamba_ssm writes no model_type: its config is d_model, n_layer and ssm_cfg (config_mamba.py)."""
    return not config.get("model_type") and "ssm_cfg" in config and "d_model" in config


def mamba_ssm_fields(config: dict, where: str) -> dict:
    """A mamba_ssm config under transformers' Mamba or Mamba-2 field names, as transformers' converters map it
    (convert_mamba_ssm_checkpoint_to_pytorch.py, convert_mamba2_ssm_checkpoint_to_pytorch.py): hidden_size d_model,
    num_hidden_layers n_layer, the vocabulary padded up to pad_vocab_size_multiple (mamba_ssm's embedding rows),
    tie_embeddings; the mixer's dimensions from ssm_cfg over mamba_ssm's defaults (the converters take the
    defaults, which every published checkpoint uses). Attention blocks (attn_layer_idx) and MLP blocks
    (d_intermediate) have no place in transformers' Mamba models and are refused."""
    cfg = Fields(config, where)
    ssm = cfg.mapping("ssm_cfg").data
    layer = ssm.get("layer", "Mamba1")
    if not isinstance(layer, str) or layer not in MAMBA_SSM_DEFAULTS:
        raise KvplanError(f"{where}: ssm_cfg layer {brief(layer)} is not one kvplan models (Mamba1, Mamba2)")
    if cfg.list("attn_layer_idx", int):
        raise KvplanError(f"{where}: field attn_layer_idx: mamba_ssm's attention blocks have no transformers or vLLM "
                          "model, so kvplan does not size them")
    if cfg.int("d_intermediate", default=0, minimum=0):
        raise KvplanError(f"{where}: field d_intermediate: mamba_ssm's MLP blocks have no transformers or vLLM model, "
                          "so kvplan does not size them")
    if not cfg.flag("rms_norm", True):
        raise KvplanError(f"{where}: field rms_norm false: transformers' Mamba models have RMSNorms only")
    unknown = sorted(set(ssm) - MAMBA_SSM_OTHER_ARGS - MAMBA_SSM_DEFAULTS[layer].keys())
    if unknown:
        raise KvplanError(f"{where}: ssm_cfg field {unknown[0]} is not one kvplan reads for a {layer} mixer")
    mixer = Fields(MAMBA_SSM_DEFAULTS[layer] | ssm, f"{where} (ssm_cfg)")
    vocab, multiple = cfg.int("vocab_size"), cfg.int("pad_vocab_size_multiple", default=8)
    common = {"hidden_size": cfg.int("d_model"), "num_hidden_layers": cfg.int("n_layer"),
              "vocab_size": -(-vocab // multiple) * multiple, "tie_word_embeddings": cfg.flag("tie_embeddings", True),
              "state_size": mixer.int("d_state"), "conv_kernel": mixer.int("d_conv"), "expand": mixer.int("expand"),
              "use_bias": mixer.flag("bias"), "use_conv_bias": mixer.flag("conv_bias", True)}
    for key in ("torch_dtype", "dtype"):
        if key in config:
            common[key] = config[key]
    if layer == "Mamba1":
        return common | {"model_type": "mamba", "time_step_rank": mixer.get("dt_rank")}
    d_inner, head_dim = common["expand"] * common["hidden_size"], mixer.int("headdim")
    if d_inner % head_dim:
        raise KvplanError(f"{where}: ssm_cfg headdim {head_dim} does not divide the mixer's {d_inner:,} channels")
    return common | {"model_type": "mamba2", "num_heads": d_inner // head_dim, "head_dim": head_dim,
                     "n_groups": mixer.int("ngroups")}
