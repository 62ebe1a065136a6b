"""TorchRec's side of the drop-in ``EmbeddingBags`` (imported only when asked for): an
``EmbeddingBagCollection``, float or quantized (``torchrec.quant``), described as the tables'
rows (the quantized one's read where FBGEMM keeps them: views into its TBE buffers, not copies)
and the features pooled from them, a ``KeyedJaggedTensor`` cut into per-feature inputs, and the
pooled result as the ``KeyedTensor`` the collection returns."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from recperf.core.errors import ConfigError
from recperf.embed.dropin_inputs import Slot, Source, TableSpec, check_bag
from recperf.embed.kernels.base import Lookup, Pooling

QUANT_FORMATS = {"fp32": torch.float32, "fp16": torch.float16, "int8": None, "int4": None}
"""FBGEMM ``SparseType`` values the drop-in reads from a quantized collection, and the float
dtype their bytes are viewed as (None: codes with a scale and bias)."""


def describe_ebc(ebc: Any) -> Source:
    """A TorchRec ``EmbeddingBagCollection``'s tables and inputs (features, in its output order);
    one ConfigError for what the kernels cannot pool as it does."""
    from torchrec import EmbeddingBagCollection  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from torchrec.modules.embedding_modules import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        EmbeddingCollection,
    )
    from torchrec.quant.embedding_modules import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        EmbeddingBagCollection as QuantEmbeddingBagCollection,
    )

    if isinstance(ebc, EmbeddingCollection):
        raise ConfigError(
            "ebc: a TorchRec EmbeddingCollection returns sequence embeddings (unpooled rows); "
            "only an EmbeddingBagCollection is supported"
        )
    if isinstance(ebc, QuantEmbeddingBagCollection):
        return _describe_quant(ebc)
    if not isinstance(ebc, EmbeddingBagCollection):
        raise ConfigError(
            "ebc: expected a TorchRec EmbeddingBagCollection (float or torchrec.quant), "
            f"got {type(ebc).__name__}"
        )
    configs = ebc.embedding_bag_configs()
    weights, tables = [], []
    for cfg in configs:
        bag = ebc.embedding_bags[cfg.name]
        spec = check_bag(bag, f"table {cfg.name!r}")
        tables.append(replace(spec, out_dtype=torch.float32))
        weights.append(bag.weight)
    return Source(
        weights=tuple(weights),
        tables=tuple(tables),
        slots=_slots(configs),
        torchrec=True,
        weighted=bool(ebc.is_weighted()),
        names=tuple(cfg.name for cfg in configs),
    )


def _slots(configs: Sequence[Any]) -> tuple[Slot, ...]:
    """Per feature of ``configs`` (in order) its output key, input key and table."""
    from torchrec.modules.embedding_modules import get_embedding_names_by_table  # type: ignore[import-untyped, import-not-found, unused-ignore]

    names = get_embedding_names_by_table(list(configs))
    return tuple(
        Slot(name, feature, t)
        for t, (cfg, keys) in enumerate(zip(configs, names, strict=True))
        for name, feature in zip(keys, cfg.feature_names, strict=True)
    )


def _describe_quant(ebc: Any) -> Source:
    """A ``torchrec.quant.EmbeddingBagCollection``: per table the views FBGEMM's
    ``split_embedding_weights`` gives into its TBE's buffer, in the collection's output order
    (its tables grouped by pooling, one TBE per group)."""
    from torchrec.modules.embedding_configs import PoolingType  # type: ignore[import-untyped, import-not-found, unused-ignore]

    keys = list(ebc._key_to_tables)  # (pooling, virtual) -> its tables, one TBE each
    groups = [ebc._key_to_tables[k] for k in keys]
    tbes = list(ebc._emb_modules)
    weights: list[torch.Tensor] = []
    scale_bias: list[torch.Tensor | None] = []
    tables: list[TableSpec] = []
    configs = list(itertools.chain(*groups))
    out_dtype = ebc.output_dtype()
    for key, group, tbe in zip(keys, groups, tbes, strict=True):
        _check_tbe(tbe, group, virtual=bool(key[1]))
        splits = tbe.split_embedding_weights()
        for cfg, spec, (w, sb) in zip(group, tbe.embedding_specs, splits, strict=True):
            label = f"table {cfg.name!r}"
            kind = str(getattr(spec[3], "value", spec[3]))
            if kind not in QUANT_FORMATS:
                raise ConfigError(
                    f"{label} data_type: {kind} rows are not read here; "
                    f"allowed: {', '.join(QUANT_FORMATS)}"
                )
            view = QUANT_FORMATS[kind]
            weights.append(w if view is None else w.view(view))
            scale_bias.append(sb if view is None else None)
            if cfg.pooling not in (PoolingType.SUM, PoolingType.MEAN):
                raise ConfigError(f"{label} pooling: {cfg.pooling} is not supported (sum or mean)")
            pooling: Pooling = "sum" if cfg.pooling == PoolingType.SUM else "mean"
            fmt = None if view is not None else kind
            # A KeyedJaggedTensor's offsets carry the end of the last bag (B + 1 of them).
            tables.append(
                TableSpec(label, pooling, True, fmt=fmt, out_dtype=out_dtype, weighted_mean=True)
            )
    return Source(
        weights=tuple(weights),
        tables=tuple(tables),
        slots=_slots(configs),
        scale_bias=tuple(scale_bias),
        torchrec=True,
        weighted=bool(ebc.is_weighted()),
        names=tuple(cfg.name for cfg in configs),
    )


def _check_tbe(tbe: Any, group: Sequence[Any], virtual: bool) -> None:
    """Refuse what a TBE does beyond pooling its rows: remapped (pruned) ids, a KV store."""
    where = ", ".join(f"table {cfg.name!r}" for cfg in group)
    if virtual or not hasattr(tbe, "split_embedding_weights"):
        raise ConfigError(f"{where}: a virtual (key-value) table is not supported")
    for name in ("index_remappings_array", "index_remapping_hash_table"):
        remap = getattr(tbe, name, None)
        if isinstance(remap, torch.Tensor) and remap.numel():
            raise ConfigError(f"{where}: pruned tables (ids remapped by the TBE) are not supported")


def kjt_inputs(
    kjt: Any, slots: Sequence[Slot], weighted: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor] | None]:
    """Per slot the values, offsets and (for a weighted EBC) weights of its feature in ``kjt``."""
    from torchrec import KeyedJaggedTensor  # type: ignore[import-untyped, import-not-found, unused-ignore]

    if not isinstance(kjt, KeyedJaggedTensor):
        raise ConfigError(
            f"features: expected a TorchRec KeyedJaggedTensor, got {type(kjt).__name__}"
        )
    if kjt.variable_stride_per_key() or kjt.inverse_indices_or_none() is not None:
        raise ConfigError("features: a batch size per feature (variable stride) is not supported")
    missing = sorted({s.feature for s in slots} - set(kjt.keys()))
    if missing:
        raise ConfigError(
            f"features: no key {missing[0]!r} (the collection reads "
            f"{', '.join(dict.fromkeys(s.feature for s in slots))})"
        )
    if weighted and kjt.weights_or_none() is None:
        raise ConfigError(
            "features: the EmbeddingBagCollection is weighted; the KeyedJaggedTensor has no weights"
        )
    jagged = kjt.to_dict()
    values = [jagged[s.feature].values() for s in slots]
    offsets = [jagged[s.feature].offsets() for s in slots]
    psw = [jagged[s.feature].weights() for s in slots] if weighted else None
    return values, offsets, psw


def kjt_lookup(kjt: Any, features: Sequence[str], device: torch.device) -> Lookup | None:
    """``kjt`` as one TBE-layout batch, its buffers as they are, where it already is one: its
    keys ``features`` in order, one batch size, int64 values and offsets on ``device``, no
    weights; else None (``kjt_inputs`` then cuts it per feature and checks each)."""
    from torchrec import KeyedJaggedTensor  # type: ignore[import-untyped, import-not-found, unused-ignore]

    if not isinstance(kjt, KeyedJaggedTensor) or kjt.keys() != list(features):
        return None
    if kjt.variable_stride_per_key() or kjt.weights_or_none() is not None:
        return None
    values, offsets, batch = kjt.values(), kjt.offsets(), kjt.stride()
    if values.dtype != torch.int64 or offsets.dtype != torch.int64 or batch < 1:
        return None
    if values.device != device or offsets.device != device or values.dim() != 1:
        return None
    if offsets.dim() != 1 or offsets.shape[0] != len(features) * batch + 1:
        return None
    return Lookup(indices=values, offsets=offsets, batch_size=batch)


def tbe_kjt(batch: Lookup, features: Sequence[str]) -> Any:
    """A TBE-layout batch as the ``KeyedJaggedTensor`` of ``features`` it is: its ids as the
    values, its offsets and weights as they are (no copies)."""
    from torchrec import KeyedJaggedTensor  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return KeyedJaggedTensor(keys=list(features), values=batch.indices, offsets=batch.offsets,
                             weights=batch.per_sample_weights, stride=batch.batch_size)  # fmt: skip


def keyed_tensor(keys: list[str], dims: list[int], values: torch.Tensor) -> Any:
    """TorchRec's ``KeyedTensor`` over ``values`` ``[B, sum(dims)]``, ``dims[i]`` columns a key."""
    from torchrec import KeyedTensor  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return KeyedTensor(keys=keys, length_per_key=dims, values=values, key_dim=1)
