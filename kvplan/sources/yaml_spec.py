"""kvplan's YAML spec format, for models that have no config.json (format documented in docs/yaml-spec.md).

A spec lists its layers in groups (`count` layers of one kind) and its parameters, and is validated by
pydantic; every error names the file and the line of the offending value.
"""

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from kvplan.errors import KvplanError
from kvplan.model import (
    ChunkedAttention,
    CrossAttention,
    FullAttention,
    MLALatent,
    ModelSpec,
    NoCache,
    ParamCounts,
    RecurrentState,
    SlidingWindow,
    Widths,
)
from kvplan.sources.hf_config import MAX_FIELD, MAX_LAYERS, read_text
from kvplan.sources.hf_config.quantization import FLOAT_NAMES
from kvplan.text import shorten

_CACHE_TYPES = {cls.model_fields["kind"].default: cls for cls in
                (FullAttention, SlidingWindow, ChunkedAttention, MLALatent, RecurrentState, CrossAttention, NoCache)}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LayerGroup(_Strict):
    """`count` consecutive layers of one kind; the other keys are that kind's fields (see kvplan.model)."""

    model_config = ConfigDict(extra="allow", strict=True)
    kind: Literal["full", "sliding", "chunked", "mla", "recurrent", "cross", "none"]
    count: PositiveInt = 1


class SpecParams(_Strict):
    total: PositiveInt
    active: PositiveInt | None = None
    embedding: int = Field(0, ge=0)
    lm_head: int = Field(0, ge=0)


class YamlSpec(_Strict):
    name: str
    dtype: Literal["fp32", "bf16", "fp16"] = "bf16"

    @field_validator("dtype", mode="before")
    @classmethod
    def _config_spelling(cls, value: object) -> object:
        """config.json's names too: float32, bfloat16, float16."""
        return FLOAT_NAMES.get(value.lower(), value) if isinstance(value, str) else value

    max_context: PositiveInt | None = None
    num_attention_heads: PositiveInt
    params: SpecParams
    layers: Annotated[list[LayerGroup], Field(min_length=1)]
    widths: Widths | None = None


MAX_VALUES = 1_000_000  # values a spec may expand to, aliases followed: a real one has a few hundred


def read_yaml_spec(path: Path) -> ModelSpec:
    text = read_text(path)
    loader = yaml.SafeLoader(text)  # not libyaml: it crashes on deep nesting
    try:
        root = loader.get_single_node()
        if root is None:
            data = None
        else:
            _check_graph(root, path)
            data = loader.construct_document(root)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise KvplanError(f"{where}: malformed YAML: {getattr(err, 'problem', None) or err}") from None
    except RecursionError:
        raise KvplanError(f"{path}: YAML nested too deeply to be a model spec") from None
    except ValueError as err:  # an integer past Python's digit limit
        raise KvplanError(f"{path}: YAML holds a value no model has ({shorten(str(err))})") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise KvplanError(f"{path}: a model spec is a YAML mapping with name, params and layers")
    too_large = _past_limit(data)
    if too_large is not None:
        raise KvplanError(f"{path}:{_line(root, too_large)}: {'.'.join(map(str, too_large))}: a number no real model "
                          f"has (at most {MAX_FIELD:,}, as in a config.json)")
    try:
        spec = YamlSpec.model_validate(data)
        if sum(group.count for group in spec.layers) > MAX_LAYERS:
            raise KvplanError(f"{path}: more than {MAX_LAYERS:,} layers is not a real model")
        caches = _caches(spec)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "spec"
        raise KvplanError(f"{path}:{_line(root, first['loc'])}: {field}: {first['msg']}") from None
    except _GroupError as err:
        loc, msg = err.args
        raise KvplanError(f"{path}:{_line(root, loc)}: {'.'.join(map(str, loc))}: {msg}") from None
    total = spec.params.total
    matrices = total - spec.params.embedding - spec.params.lm_head
    inactive = total - (spec.params.active or total)
    if matrices < 0 or inactive < 0 or inactive > matrices:
        line = _line(root, ("params",))
        raise KvplanError(f"{path}:{line}: params: need embedding + lm_head <= active <= total")
    params = ParamCounts(embedding=spec.params.embedding, lm_head=spec.params.lm_head, attention=0,
                         mlp=matrices - inactive, experts=inactive, active_experts=0, other=0)
    layers = max(c.layer for c in caches) + 1
    return ModelSpec(name=spec.name, architecture="yaml-spec", num_layers=layers,
                     num_attention_heads=spec.num_attention_heads, caches=tuple(caches), params=params,
                     dtype=spec.dtype, max_context=spec.max_context, widths=spec.widths,
                     source=f"YAML spec {path}")


def _check_graph(root: yaml.Node, path: Path) -> None:
    """Refuse a composed document whose aliases make it a cycle (an anchor used inside itself) or expand it past
    MAX_VALUES, visiting each node once: a 430-byte spec of ten nested aliases stands for 10^10 values, which every
    later step (the number check, pydantic) would walk one by one."""
    sizes: dict[int, int] = {}  # node id -> values it expands to; 0 while its children are being counted

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known == 0:
            raise KvplanError(f"{path}:{node.start_mark.line + 1}: a YAML anchor used inside itself is not a "
                              "model spec")
        if known is not None:
            return known
        sizes[id(node)] = 0
        children = ([part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode)
                    else node.value if isinstance(node, yaml.SequenceNode) else [])
        total = 1 + sum(size(child) for child in children)
        if total > MAX_VALUES:
            raise KvplanError(f"{path}: YAML of more than {MAX_VALUES:,} values (an alias counted each time it is "
                              "used) is not a model spec")
        sizes[id(node)] = total
        return total

    size(root)


def _past_limit(value: object, loc: tuple = ()) -> tuple | None:
    """Where the first number beyond MAX_FIELD (or not finite) sits, or None: float arithmetic on it would be
    inexact or overflow."""
    if isinstance(value, dict | list):
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            found = _past_limit(item, (*loc, key))
            if found is not None:
                return found
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return loc if number and not -MAX_FIELD <= value <= MAX_FIELD else None


class _GroupError(Exception):
    """A layer group's fields failed validation: args are (location, message)."""


def _caches(spec: YamlSpec) -> list:
    """Expand the groups into one cache per layer, numbered in order (a group cannot set `layer`)."""
    caches: list = []
    for index, group in enumerate(spec.layers):
        fields = dict(group.model_extra or {})
        if "layer" in fields:
            raise _GroupError(("layers", index, "layer"), "layers are numbered by their order; remove `layer`")
        if group.kind in ("full", "sliding", "chunked", "cross"):
            fields.setdefault("head_dim_v", fields.get("head_dim"))
        try:
            first = _CACHE_TYPES[group.kind].model_validate({**fields, "layer": len(caches)}, strict=True)
        except ValidationError as err:
            error = err.errors()[0]
            raise _GroupError(("layers", index, *error["loc"]), error["msg"]) from None
        caches += [first.model_copy(update={"layer": first.layer + i}) for i in range(group.count)]
    return caches


def _line(node, loc: tuple) -> int:
    """The 1-based line of the YAML node at a pydantic error location (the deepest one that exists)."""
    line = node.start_mark.line
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            match = node.value[part]
        else:
            match = None
        if match is None:
            break
        node, line = match, match.start_mark.line
    return line + 1
