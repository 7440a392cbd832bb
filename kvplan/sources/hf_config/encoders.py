"""Encoders and encoder-decoders: what each caches and how many parameters it has.

BERT family (bert, roberta, electra, ...): a plain config describes an encoder, which reads its input in one pass
and keeps no cache. With `is_decoder: true` (which transformers asks for before running one as a causal LM), or a
causal-LM `architectures` entry, it describes a decoder: the same stack attends causally and caches K and V on
every layer (and, with `add_cross_attention`, the keys and values of an encoder's tokens too).

Encoder-decoders (T5, the BART family, Whisper, ProphetNet, T5Gemma, MusicGen): with `is_encoder_decoder` (their
default) the config describes the whole model, and each decoder layer caches its self-attention and a
cross-attention over the encoder's tokens (Whisper's encoder always makes max_source_positions of them; a text
encoder has no fixed length, so it is taken as long as the context). With `is_encoder_decoder: false` (and
`is_decoder: true`), as the families' causal-LM classes set them, it describes the decoder alone, whose
cross-attention has no encoder to read and caches nothing. TrOCR's config only ever describes a decoder.

Parameters follow each family's modeling file in transformers 5.23 (encoder-only: the base model, `AutoModel`;
decoders: the causal-LM class; encoder-decoders: the seq2seq class), checked on the meta device in
tests/test_family_encoders.py.
"""

from __future__ import annotations

from typing import NamedTuple

from kvplan.errors import KvplanError
from kvplan.model import CrossAttention, FullAttention, ModelSpec, NoCache, ParamCounts, Widths
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.layout import layer_caches, layer_types, read_head_dim
from kvplan.sources.hf_config.quantization import common

# ------------------------------------------------------------------------------------------------ BERT family


class BertFamily(NamedTuple):
    """How a BERT-family model builds its blocks (its modeling file in transformers)."""

    positions: bool = True  # a learned position table (RoFormer rotates instead)
    token_types: bool = True
    embedding_norm: bool = True  # a LayerNorm over the embeddings (pre-LN Megatron-BERT and XLM-R XL have none)
    final_norm: bool = False  # a LayerNorm after the last layer (pre-LN families)
    pooler: bool = True  # the base model's pooler, h x h + h
    causal_lm_pooler: bool = False  # the causal-LM class keeps the pooler (BigBird)
    head_transform: bool = True  # dense + LayerNorm before the output projection
    ties_head: bool = True  # the projection ties to the word embeddings with tie_word_embeddings (RemBERT's never)
    bias_pair: bool = True  # the head's `bias` and the projection's are one tensor only while tied to the embeddings
    max_positions: int = 512  # transformers' defaults of max_position_embeddings and type_vocab_size
    type_vocab: int = 2


BERT_FAMILIES: dict[str, BertFamily] = {
    "bert": BertFamily(),
    "bert-generation": BertFamily(token_types=False, pooler=False, head_transform=False),
    "big_bird": BertFamily(causal_lm_pooler=True, max_positions=4096),
    "camembert": BertFamily(),
    "data2vec-text": BertFamily(),
    "electra": BertFamily(pooler=False, bias_pair=False),
    "ernie": BertFamily(),
    "megatron-bert": BertFamily(embedding_norm=False, final_norm=True),
    "rembert": BertFamily(ties_head=False, bias_pair=False),
    "roberta": BertFamily(),
    "roberta-prelayernorm": BertFamily(final_norm=True),
    "roc_bert": BertFamily(),
    "roformer": BertFamily(positions=False, pooler=False, max_positions=1536),
    "xlm-roberta": BertFamily(),
    "xlm-roberta-xl": BertFamily(embedding_norm=False, final_norm=True, max_positions=514, type_vocab=1),
    "xmod": BertFamily(),
}
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "GenerationDecoder")  # BertLMHeadModel, BertGenerationDecoder


def runs_as_decoder(cfg: Fields, top: Fields) -> bool:
    """is_decoder, or an architectures entry naming a causal-LM class."""
    return cfg.flag("is_decoder") or any(a.endswith(CAUSAL_LM_SUFFIXES) for a in top.list("architectures"))


def bert_family(cfg: Fields, top: Fields, model_type: str, name: str, source: str, notes: list[str]) -> ModelSpec:
    """A BERT-family encoder (no cache) or, run as a decoder, K and V of every layer: num_attention_heads heads of
    hidden_size / num_attention_heads, plus cross-attention over an encoder's tokens with add_cross_attention."""
    family = BERT_FAMILIES[model_type]
    layers = cfg.layers("num_hidden_layers")
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    decoder = runs_as_decoder(cfg, top)
    cross = decoder and cfg.flag("add_cross_attention")
    if decoder:
        attention = {"kv_heads": heads, "head_dim": read_head_dim(cfg, hidden, heads)}
        attention["head_dim_v"] = attention["head_dim"]
        caches = []
        for i in range(layers):
            caches.append(FullAttention(layer=i, **attention))
            if cross:
                caches.append(CrossAttention(layer=i, **attention))
        if cross:
            notes.append("cross-attention holds as many encoder tokens as the context (the encoder has no fixed "
                         "input length)")
    else:
        notes.append(f"{model_type} is encoder-only: it encodes its input in one pass, never decodes, and keeps no "
                     "KV cache (is_decoder: true reads it as a decoder)")
        caches = [NoCache(layer=i, reason="encoder-only") for i in range(layers)]
    params = _bert_params(cfg, model_type, family, layers, hidden, decoder, cross)
    widths = Widths(hidden=hidden, mlp_intermediate=cfg.int("intermediate_size"), gated_mlp=False,
                    mlp_activation=str(cfg.get("hidden_act", default="gelu")))
    return ModelSpec(name=name, architecture=model_type, num_layers=layers, num_attention_heads=heads,
                     caches=tuple(caches), params=params, widths=widths if decoder else None, source=source,
                     **common(cfg, notes))


def _bert_params(cfg: Fields, model_type: str, family: BertFamily, layers: int, hidden: int, decoder: bool,
                 cross: bool) -> ParamCounts:
    """Embeddings (word, position, token type tables of width E), layers, final norm, pooler; a decoder adds
    its LM head: a dense + LayerNorm transform to width O, the V x O projection (tied to the word embeddings
    unless tie_word_embeddings is false) and its bias (untied, most heads keep two). Per layer: q, k, v, o
    (4h^2 + 4h), fc1, fc2 (2hI + I + h), two LayerNorms (4h)."""
    vocab, intermediate = cfg.int("vocab_size"), cfg.int("intermediate_size")
    width = cfg.int("embedding_size", "input_embedding_size", default=hidden)  # E: ELECTRA, RoFormer, RemBERT
    out = {"electra": width, "roformer": width, "rembert": cfg.int("output_embedding_size", default=hidden)}.get(
        model_type, hidden)  # O: the head's width
    positions = cfg.int("max_position_embeddings", default=family.max_positions)
    embedding = vocab * width
    other = 0
    if family.positions:
        embedding += positions * width
    if family.token_types:
        embedding += cfg.int("type_vocab_size", default=family.type_vocab, minimum=0) * width
    if family.embedding_norm:
        other += 2 * width
    if model_type == "roformer":  # a frozen sinusoidal table of max_position_embeddings x head_dim
        embedding += positions * (hidden // cfg.int("num_attention_heads"))
    if model_type == "ernie" and cfg.flag("use_task_id"):
        embedding += cfg.int("task_type_vocab_size", default=3) * hidden
    if model_type == "roc_bert":  # pronunciation and shape tables, and the map of their concatenation to h
        pronunciation, shape = cfg.int("pronunciation_embed_dim"), cfg.int("shape_embed_dim")
        embedding += cfg.int("pronunciation_vocab_size") * pronunciation + cfg.int("shape_vocab_size") * shape
        if cfg.flag("concat_input", default=True):
            joined = hidden + (pronunciation if cfg.flag("enable_pronunciation", default=True) else 0) + \
                (shape if cfg.flag("enable_shape", default=True) else 0)
            other += joined * hidden + hidden
    if model_type == "rembert" or width != hidden:  # embeddings_project / embedding_hidden_mapping_in
        other += width * hidden + hidden
    qkv_bias = 3 * hidden if model_type != "big_bird" or cfg.flag("use_bias", default=True) else 0
    attention_other = qkv_bias + hidden + 2 * hidden  # q, k, v and o biases; its LayerNorm
    per_layer_other = attention_other + intermediate + hidden + 2 * hidden
    mlp = layers * 2 * hidden * intermediate
    if model_type == "xmod":  # an adapter per language: h -> h / reduction -> h, with biases
        bottleneck = hidden // cfg.int("adapter_reduction_factor", default=2)
        languages = len(cfg.list("languages")) or 1
        mlp += layers * languages * 2 * hidden * bottleneck
        per_layer_other += languages * (bottleneck + hidden) + (2 * hidden if cfg.flag("adapter_layer_norm") else 0)
    attention = layers * 4 * hidden * hidden
    if cross:
        attention += layers * 4 * hidden * hidden
        per_layer_other += attention_other
    other += layers * per_layer_other
    if family.final_norm or (model_type == "xmod" and cfg.flag("pre_norm")):
        other += 2 * hidden
    if family.pooler and (not decoder or family.causal_lm_pooler):
        other += hidden * hidden + hidden
    lm_head = 0
    if decoder:
        if family.head_transform:
            other += hidden * out + out + 2 * out
        tied = family.ties_head and cfg.flag("tie_word_embeddings", default=True)
        other += vocab * (2 if family.bias_pair and not tied else 1)  # the output bias
        lm_head = 0 if tied else vocab * out
    return ParamCounts(embedding=embedding, lm_head=lm_head, attention=attention, mlp=mlp, experts=0,
                       active_experts=0, other=other)


def encoder_only(cfg: Fields, model_type: str, name: str, source: str, notes: list[str]) -> ModelSpec:
    """Other encoders (DistilBERT, DeBERTa, ALBERT, ModernBERT, MPNet, ...), counted as BERT's blocks: no KV cache."""
    layers = cfg.layers("num_hidden_layers", "n_layers", "num_layers")
    hidden, heads = cfg.int("hidden_size", "dim"), cfg.int("num_attention_heads", "n_heads")
    intermediate, vocab = cfg.int("intermediate_size", "hidden_dim"), cfg.int("vocab_size")
    positions = cfg.int("max_position_embeddings", default=512)
    types = cfg.int("type_vocab_size", default=0, minimum=0)
    reason = f"{model_type} is encoder-only: it encodes its input in one pass, never decodes, and keeps no KV cache"
    notes.append(reason)
    per_layer_other = 4 * hidden + intermediate + hidden + 2 * 2 * hidden  # q,k,v,o and MLP biases; 2 LayerNorms
    params = ParamCounts(
        embedding=(vocab + positions + types) * hidden, lm_head=0,
        attention=layers * 4 * hidden * hidden, mlp=layers * 2 * hidden * intermediate, experts=0, active_experts=0,
        other=layers * per_layer_other + 2 * hidden,
    )
    return ModelSpec(name=name, architecture=model_type, num_layers=layers, num_attention_heads=heads,
                     caches=tuple(NoCache(layer=i, reason="encoder-only") for i in range(layers)), params=params,
                     source=source, **common(cfg, notes))


# ------------------------------------------------------------------------------------------ encoder-decoders


class Seq2SeqFamily(NamedTuple):
    """How a BART-family stack is built (modeling_bart.py and the files copied from it)."""

    # learned: a table; sinusoidal: a frozen table transformers keeps as a parameter (Marian, Pegasus); none:
    # computed, no parameter (TrOCR's sinusoidal positions)
    positions: str = "learned"
    offset: int = 0  # rows a learned table has beyond the max positions (BART's 2)
    embedding_norm: bool = False  # layernorm_embedding after the embeddings
    final_norm: bool = False  # a LayerNorm after the last layer (pre-LN families)
    attention_bias: str = "all"  # all, no_k (Whisper's k_proj), or the config's use_bias (BigBird-Pegasus)
    causal_lm_tied: bool = True  # the causal-LM class ties its head to the embeddings (BigBird-Pegasus' does not)


SEQ2SEQ_FAMILIES: dict[str, Seq2SeqFamily] = {
    "bart": Seq2SeqFamily(offset=2, embedding_norm=True),
    "mbart": Seq2SeqFamily(offset=2, embedding_norm=True, final_norm=True),
    "plbart": Seq2SeqFamily(offset=2, embedding_norm=True),
    "mvp": Seq2SeqFamily(offset=2, embedding_norm=True),
    "blenderbot": Seq2SeqFamily(final_norm=True),
    "blenderbot-small": Seq2SeqFamily(embedding_norm=True),
    "marian": Seq2SeqFamily(positions="sinusoidal"),
    "pegasus": Seq2SeqFamily(positions="sinusoidal", final_norm=True),
    "bigbird_pegasus": Seq2SeqFamily(final_norm=True, attention_bias="use_bias", causal_lm_tied=False),
    "whisper": Seq2SeqFamily(final_norm=True, attention_bias="no_k"),
    "trocr": Seq2SeqFamily(offset=2),
}
ENCODER_DECODERS = frozenset({*SEQ2SEQ_FAMILIES, "t5", "prophetnet", "t5gemma", "musicgen", "musicgen_melody"})


def encoder_decoder(cfg: Fields, top: Fields, model_type: str, name: str, source: str,
                    notes: list[str]) -> ModelSpec:
    """The whole model (is_encoder_decoder, the families' default), or the decoder alone when the config says
    is_encoder_decoder: false, as the causal-LM classes set it (with is_decoder), or names a causal-LM class
    (TrOCR's config: always)."""
    whole = model_type != "trocr" and cfg.flag("is_encoder_decoder", default=True) and not any(
        a.endswith("ForCausalLM") for a in top.list("architectures"))
    if model_type == "t5":
        return _t5(cfg, model_type, name, source, notes)
    if model_type == "t5gemma":
        return _t5gemma(cfg, name, source, notes)
    if model_type in ("musicgen", "musicgen_melody"):
        return _musicgen(cfg, model_type, name, source, notes)
    if model_type == "prophetnet":
        return _prophetnet(cfg, whole, name, source, notes)
    if model_type not in SEQ2SEQ_FAMILIES:
        raise KvplanError(f"{cfg.where}: encoder-decoder model_type {model_type!r} is not one kvplan knows "
                          f"(it reads {', '.join(sorted(ENCODER_DECODERS))})")
    return _bart_family(cfg, model_type, whole, name, source, notes)


def _decoder_caches(layers: int, heads: int, head_dim: int, cross: bool, encoder_tokens: int | None) -> list:
    attention = {"kv_heads": heads, "head_dim": head_dim, "head_dim_v": head_dim}
    caches = []
    for i in range(layers):
        caches.append(FullAttention(layer=i, **attention))
        if cross:
            caches.append(CrossAttention(layer=i, encoder_tokens=encoder_tokens, **attention))
    return caches


def _alone_or_whole(whole: bool, encoder_tokens: int | None, notes: list[str]) -> None:
    if not whole:
        notes.append("the decoder alone (is_encoder_decoder is false): its cross-attention has no encoder to read "
                     "and caches nothing")
    elif encoder_tokens is None:
        notes.append("cross-attention holds as many encoder tokens as the context (the encoder has no fixed input "
                     "length)")


def _bart_family(cfg: Fields, model_type: str, whole: bool, name: str, source: str, notes: list[str]) -> ModelSpec:
    """Decoder layers: self-attention, cross-attention and an fc1/fc2 MLP, each with a LayerNorm; encoder
    layers the same without cross-attention. Whisper's encoder starts with two width-3 convolutions over
    num_mel_bins channels and has max_source_positions positions, which its cross-attention holds."""
    family = SEQ2SEQ_FAMILIES[model_type]
    d = cfg.int("d_model")
    layers, heads = cfg.layers("decoder_layers"), cfg.int("decoder_attention_heads")
    if d % heads:
        raise KvplanError(f"{cfg.where}: d_model {d} is not a multiple of {heads} decoder_attention_heads")
    whisper = model_type == "whisper"
    encoder_tokens = cfg.int("max_source_positions") if whisper and whole else None
    _alone_or_whole(whole, encoder_tokens, notes)
    caches = _decoder_caches(layers, heads, d // heads, whole, encoder_tokens)
    if model_type == "mvp" and cfg.flag("use_prompt"):
        notes.append("MVP's layer-wise prompts are prepended to the keys and values after the cache: not cached")
    params = _bart_params(cfg, model_type, family, whole)
    fields = common(cfg, notes)
    if whisper:  # the decoder's positions bound the output; vLLM's max_model_len
        fields["max_context"] = cfg.int("max_target_positions")
    widths = Widths(hidden=d, mlp_intermediate=cfg.int("decoder_ffn_dim"), gated_mlp=False,
                    mlp_activation=str(cfg.get("activation_function", default="gelu")))
    return ModelSpec(name=name, architecture=model_type, num_layers=layers, num_attention_heads=heads,
                     caches=tuple(caches), params=params, widths=widths, source=source, **fields)


def _bart_params(cfg: Fields, model_type: str, family: Seq2SeqFamily, whole: bool) -> ParamCounts:
    """Token table (one, shared by both stacks; Marian's decoder may have its own vocabulary), position tables,
    per layer 4d^2 for each attention block (a cross-attention's k and v read cross_attention_hidden_size wide
    states when TrOCR's config gives one), 2 d ffn for fc1 and fc2, their biases and a LayerNorm per block;
    layernorm_embedding and a final LayerNorm per stack where the family has them."""
    d, vocab = cfg.int("d_model"), cfg.int("vocab_size")
    if model_type == "trocr":  # TrOCR states its positions and embedding norm in its config
        learned = cfg.flag("use_learned_position_embeddings", default=True)
        family = Seq2SeqFamily(positions="learned" if learned else "none", offset=2,
                               embedding_norm=cfg.flag("layernorm_embedding", default=True))
    bias = {"all": 4 * d, "no_k": 3 * d}.get(family.attention_bias, 4 * d * cfg.flag("use_bias", default=False))
    totals = {"attention": 0, "mlp": 0, "other": 0}

    def stack(prefix: str, cross: bool) -> None:
        layers, ffn = cfg.layers(f"{prefix}_layers"), cfg.int(f"{prefix}_ffn_dim")
        blocks = 2 if cross else 1
        key_width = cfg.int("cross_attention_hidden_size", default=d)
        totals["attention"] += layers * (4 * d * d + (2 * d * d + 2 * key_width * d if cross else 0))
        totals["mlp"] += layers * 2 * d * ffn
        totals["other"] += layers * (blocks * (bias + 2 * d) + ffn + d + 2 * d)
        totals["other"] += 2 * d * (family.embedding_norm + family.final_norm)
        if model_type == "mvp" and whole and cross and cfg.flag("use_prompt"):
            # a prompt (table and 2-layer MLP) per decoder attention block; MvpModel builds none for the encoder
            # (it passes use_prompt where MvpEncoder takes embed_tokens), the causal-LM class none at all
            length, mid = cfg.int("prompt_length"), cfg.int("prompt_mid_dim")
            totals["other"] += 2 * (length * d + d * mid + mid + mid * layers * 2 * d + layers * 2 * d)

    def positions(length: int) -> int:
        return 0 if family.positions == "none" else (length + family.offset) * d

    stack("decoder", cross=True)
    # Marian may give its decoder a vocabulary of its own (decoder_vocab_size); the others one for both stacks
    decoder_vocab = cfg.int("decoder_vocab_size", default=vocab) if model_type == "marian" else vocab
    target = cfg.int("max_target_positions") if model_type == "whisper" else cfg.int("max_position_embeddings")
    embedding = positions(target)
    tied = cfg.flag("tie_word_embeddings", default=True)
    head = vocab * d  # the head's rows: vocab_size, but decoder_vocab_size for Marian's unshared seq2seq model
    if not whole:
        embedding += decoder_vocab * d
        tied = tied and family.causal_lm_tied
    elif model_type == "whisper":  # no encoder token table; conv1 (num_mel_bins -> d), conv2 (d -> d), width 3
        stack("encoder", cross=False)
        totals["other"] += 3 * d * (cfg.int("num_mel_bins") + d) + 2 * d
        embedding += vocab * d + cfg.int("max_source_positions") * d  # the encoder's frozen sinusoidal table
    else:
        stack("encoder", cross=False)
        embedding += positions(cfg.int("max_position_embeddings"))
        if model_type == "marian" and not cfg.flag("share_encoder_decoder_embeddings", default=True):
            embedding += vocab * d + decoder_vocab * d  # each stack its own table
            head = decoder_vocab * d
        else:  # one shared table; the stacks' own are tied to it only with the head
            embedding += vocab * d + (0 if tied else vocab * d + decoder_vocab * d)
    return ParamCounts(embedding=embedding, lm_head=0 if tied else head, experts=0, active_experts=0, **totals)


def _prophetnet(cfg: Fields, whole: bool, name: str, source: str, notes: list[str]) -> ModelSpec:
    """ProphetNet: its decoder predicts `ngram` future tokens in extra streams, but caches the main stream's K and
    V only (`ProphetNetNgramSelfAttention`). Its self-attention adds a relative-position projection to
    num_buckets x heads logits; the encoder is BART-like, with one position table per stack."""
    h, vocab = cfg.int("hidden_size"), cfg.int("vocab_size")
    layers, heads = cfg.layers("num_decoder_layers"), cfg.int("num_decoder_attention_heads")
    if h % heads:
        raise KvplanError(f"{cfg.where}: hidden_size {h} is not a multiple of {heads} num_decoder_attention_heads")
    _alone_or_whole(whole, None, notes)
    caches = _decoder_caches(layers, heads, h // heads, whole, None)
    positions, ffn = cfg.int("max_position_embeddings"), cfg.int("decoder_ffn_dim")
    relative = cfg.int("num_buckets") * heads
    blocks = 2 if cfg.flag("add_cross_attention", default=True) else 1
    # per attention block: q, k, v, o (4h^2), their biases and a LayerNorm (6h); per MLP: 2 h ffn, ffn + h biases
    # and a LayerNorm; the self-attention's relative-position projection h x relative, with its bias
    attention = layers * (blocks * 4 * h * h + h * relative)
    mlp = layers * 2 * h * ffn
    other = layers * (blocks * 6 * h + relative + ffn + 3 * h) + 2 * h  # + embeddings_layer_norm
    embedding = vocab * h + positions * h + cfg.int("ngram") * h
    tied = cfg.flag("tie_word_embeddings", default=True)
    if not tied:  # the decoder's (and the encoder's) token tables are tied to the model's only with the head
        embedding += vocab * h * (2 if whole else 1)
    if whole:
        encoder_layers, encoder_ffn = cfg.layers("num_encoder_layers"), cfg.int("encoder_ffn_dim")
        attention += encoder_layers * 4 * h * h
        mlp += encoder_layers * 2 * h * encoder_ffn
        other += encoder_layers * (6 * h + encoder_ffn + 3 * h) + 2 * h
        embedding += positions * h
    params = ParamCounts(embedding=embedding, lm_head=0 if tied else vocab * h, attention=attention, mlp=mlp,
                         experts=0, active_experts=0, other=other)
    widths = Widths(hidden=h, mlp_intermediate=ffn, gated_mlp=False,
                    mlp_activation=str(cfg.get("activation_function", default="gelu")))
    return ModelSpec(name=name, architecture="prophetnet", num_layers=layers, num_attention_heads=heads,
                     caches=tuple(caches), params=params, widths=widths, source=source, **common(cfg, notes))


def _t5_encoder(cfg: Fields, layers: int) -> ParamCounts:
    """A T5 encoder stack (T5EncoderModel): the shared token table, per layer q, k, v, o (4 h inner, no biases),
    the feed-forward (3 h d_ff gated, else 2), two RMSNorms; the relative position table on its first layer; a
    final norm."""
    hidden, inner = cfg.int("d_model"), cfg.int("num_heads") * cfg.int("d_kv")
    gated = str(cfg.get("feed_forward_proj", default="relu")).startswith("gated")
    buckets = cfg.int("relative_attention_num_buckets", default=32)
    return ParamCounts(embedding=cfg.int("vocab_size") * hidden, lm_head=0, attention=layers * 4 * hidden * inner,
                       mlp=layers * (3 if gated else 2) * hidden * cfg.int("d_ff"), experts=0, active_experts=0,
                       other=buckets * cfg.int("num_heads") + (2 * layers + 1) * hidden)


def _t5(cfg: Fields, model_type: str, name: str, source: str, notes: list[str]) -> ModelSpec:
    """T5: each decoder layer caches its self-attention and its cross-attention, num_heads heads of d_kv.
    Parameters: the encoder stack, and a decoder stack whose layers add a cross-attention block and its norm."""
    heads, d_kv = cfg.int("num_heads"), cfg.int("d_kv")
    enc_layers = cfg.layers("num_layers")
    dec_layers = cfg.layers("num_decoder_layers", default=enc_layers)
    _alone_or_whole(True, None, notes)
    caches = _decoder_caches(dec_layers, heads, d_kv, True, None)
    encoder, decoder = _t5_encoder(cfg, enc_layers), _t5_encoder(cfg, dec_layers)
    hidden = cfg.int("d_model")
    params = ParamCounts(
        embedding=encoder.embedding,
        lm_head=0 if cfg.flag("tie_word_embeddings", default=True) else encoder.embedding,
        attention=encoder.attention + 2 * decoder.attention, mlp=encoder.mlp + decoder.mlp, experts=0,
        active_experts=0, other=encoder.other + decoder.other + dec_layers * hidden)
    return ModelSpec(name=name, architecture=model_type, num_layers=dec_layers, num_attention_heads=heads,
                     caches=tuple(caches), params=params, source=source, **common(cfg, notes))


def _nested(cfg: Fields, name: str) -> Fields:
    """A nested stack config (T5Gemma's encoder and decoder, MusicGen's decoder), with the top-level dtype."""
    stack = cfg.mapping(name)
    data = dict(stack.data)
    for key in ("torch_dtype", "dtype", "quantization_config"):
        if key not in data and key in cfg.data:
            data[key] = cfg.data[key]
    return Fields(data, stack.where)


def _gemma_attention(stack: Fields, key_width: int) -> tuple[int, int]:
    """(matrices, biases) of a Gemma 2-style attention: q and o over heads x head_dim, k and v over the KV heads,
    reading key_width wide states."""
    hidden, heads, kv = stack.int("hidden_size"), stack.int("num_attention_heads"), stack.int("num_key_value_heads")
    head_dim = stack.int("head_dim")
    matrices = 2 * hidden * heads * head_dim + 2 * key_width * kv * head_dim
    biases = heads * head_dim + 2 * kv * head_dim + hidden if stack.flag("attention_bias") else 0
    return matrices, biases


def _t5gemma(cfg: Fields, name: str, source: str, notes: list[str]) -> ModelSpec:
    """T5Gemma: Gemma 2 layers in both stacks (sliding and global layers by layer_types; four RMSNorms and a
    gated MLP per layer), the decoder's adding a cross-attention (k and v read cross_attention_hidden_size wide
    encoder states) with two more norms. The decoder caches its self-attention (sliding layers their window)
    and the cross-attention's keys and values; each stack has its own token table, the head ties to the
    decoder's."""
    encoder, decoder = _nested(cfg, "encoder"), _nested(cfg, "decoder")
    layers, heads = decoder.layers("num_hidden_layers"), decoder.int("num_attention_heads")
    kv, head_dim = decoder.int("num_key_value_heads"), decoder.int("head_dim")
    types = layer_types(decoder, "gemma2", layers, notes)  # layer_types, else Gemma 2's alternation
    cross = {"kv_heads": kv, "head_dim": head_dim, "head_dim_v": head_dim}
    caches = []
    for own in layer_caches(decoder, "t5gemma", types, kv, head_dim):
        caches += [own, CrossAttention(layer=own.layer, **cross)]
    _alone_or_whole(True, None, notes)
    totals = {"embedding": 0, "attention": 0, "mlp": 0, "other": 0}
    for stack, norms in ((encoder, 4), (decoder, 6)):
        hidden, count = stack.int("hidden_size"), stack.layers("num_hidden_layers")
        matrices, biases = _gemma_attention(stack, hidden)
        if stack is decoder:
            cross_matrices, cross_biases = _gemma_attention(stack, stack.int("cross_attention_hidden_size",
                                                                             default=encoder.int("hidden_size")))
            matrices, biases = matrices + cross_matrices, biases + cross_biases
        totals["embedding"] += stack.int("vocab_size") * hidden
        totals["attention"] += count * matrices
        totals["mlp"] += count * 3 * hidden * stack.int("intermediate_size")
        totals["other"] += count * (biases + norms * hidden) + hidden
    tied = cfg.flag("tie_word_embeddings", default=True)
    params = ParamCounts(lm_head=0 if tied else decoder.int("vocab_size") * decoder.int("hidden_size"), experts=0,
                         active_experts=0, **totals)
    widths = Widths(hidden=decoder.int("hidden_size"), mlp_intermediate=decoder.int("intermediate_size"),
                    mlp_activation=str(decoder.get("hidden_activation", default="gelu_pytorch_tanh")))
    return ModelSpec(name=name, architecture="t5gemma", num_layers=layers, num_attention_heads=heads,
                     caches=tuple(caches), params=params, widths=widths, source=source, **common(decoder, notes))


def _musicgen(cfg: Fields, model_type: str, name: str, source: str, notes: list[str]) -> ModelSpec:
    """MusicGen: a T5 text encoder, and a decoder that sums one token table per codebook (num_codebooks x
    (vocab_size + 1)) and predicts each codebook with its own bias-free head; its layers are BART's without biases
    in the attention and the MLP. MusicGen's decoder cross-attends to the text encoder's tokens; MusicGen Melody's
    has no cross-attention: the text and chroma conditioning is a prefix of its self-attention, so it is in the
    context. The EnCodec audio codec is not counted."""
    decoder, text = _nested(cfg, "decoder"), _nested(cfg, "text_encoder")
    layers, heads = decoder.layers("num_hidden_layers"), decoder.int("num_attention_heads")
    hidden, ffn = decoder.int("hidden_size"), decoder.int("ffn_dim")
    if hidden % heads:
        raise KvplanError(f"{decoder.where}: hidden_size {hidden} is not a multiple of {heads} num_attention_heads")
    melody = model_type == "musicgen_melody"
    if melody:
        notes.append("the text and chroma conditioning is a prefix of the decoder's self-attention: count it in "
                     "the context")
    else:
        _alone_or_whole(True, None, notes)
    notes.append("the EnCodec audio codec (audio_encoder) is not counted in the weights")
    caches = _decoder_caches(layers, heads, hidden // heads, not melody, None)
    codebooks, vocab = decoder.int("num_codebooks"), decoder.int("vocab_size")
    blocks = 1 if melody else 2
    t5 = _t5_encoder(text, text.layers("num_layers"))
    other = t5.other + layers * (blocks * 2 * hidden + 2 * hidden) + 2 * hidden  # LayerNorms
    text_hidden = text.int("d_model")
    if text_hidden != hidden and not decoder.has("cross_attention_hidden_size"):  # enc_to_dec_proj
        other += text_hidden * hidden + hidden
    if melody:  # audio_enc_to_dec_proj: chroma bins -> hidden
        other += cfg.int("num_chroma") * hidden + hidden
    params = ParamCounts(embedding=t5.embedding + codebooks * (vocab + 1) * hidden, lm_head=codebooks * vocab * hidden,
                         attention=t5.attention + layers * blocks * 4 * hidden * hidden,
                         mlp=t5.mlp + layers * 2 * hidden * ffn, experts=0, active_experts=0, other=other)
    widths = Widths(hidden=hidden, mlp_intermediate=ffn, gated_mlp=False,
                    mlp_activation=str(decoder.get("activation_function", default="gelu")))
    return ModelSpec(name=name, architecture=model_type, num_layers=layers, num_attention_heads=heads,
                     caches=tuple(caches), params=params, widths=widths, source=source, **common(decoder, notes))
