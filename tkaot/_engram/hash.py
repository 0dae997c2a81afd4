"""tkaot.engram.engram_hash: the n-gram hash that indexes the Engram embedding tables."""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._engram.kernels import ENGRAM_HASH, MAX_NGRAM
from tkaot._op import current_stream, op_parts
from tkaot._validate import Rule, Signature, Tensor

__all__ = ["engram_hash"]

_I32, _I64 = torch.int32, torch.int64
SIGNATURE = Signature(
    "tkaot.engram.engram_hash",
    tensors=(
        Tensor("ngram_token_ids", (_I32,), (("num_tokens", "max_ngram_size"),), layout="contiguous"),
        Tensor("multipliers", (_I64,), (("num_layers", "max_ngram_size"),), layout="contiguous"),
        Tensor("vocab_sizes", (_I32,), (("num_layers", "orders", "num_tables"),), layout="contiguous",
               what="3-D (num_ngram_layers, max_ngram_size - 1, num_embed_table_per_ngram)"),
        Tensor("offsets", (_I32,), (("num_layers", "num_cols"),), layout="contiguous"),
        Tensor("image_token_mask", (torch.bool,), (("num_tokens",),), layout="contiguous", optional=True),
    ),
    dims=("num_tokens", "max_ngram_size", "num_layers", "num_tables", "num_cols"),
    rules=(
        Rule("ngram_token_ids", f"2 <= max_ngram_size <= {MAX_NGRAM}", f"of 2 to {MAX_NGRAM} n-gram columns",
             actual="f'shape {tuple(h_ngram_token_ids)}'", after="ngram_token_ids"),
        Rule("vocab_sizes", "orders == max_ngram_size - 1", "of shape ({num_layers}, {max_ngram_size - 1}, num_embed_table_per_ngram)",
             actual="tuple(h_vocab_sizes)", after="vocab_sizes"),
        Rule("offsets", "num_cols == orders * num_tables", "of shape ({num_layers}, {orders * num_tables})",
             actual="tuple(h_offsets)", after="offsets"),
        Rule("num_layers", "num_layers <= 65535", "at most 65535"),
        Rule("ngram_token_ids", "num_tokens * num_cols <= _MAX_I32", "of fewer than 2**31 output elements a layer",
             actual="f'{num_tokens} tokens x {num_cols} columns'"),
    ),
)  # fmt: skip

[(_check, _HASH)] = op_parts(globals(), (SIGNATURE, ENGRAM_HASH))


def engram_hash(
    ngram_token_ids: torch.Tensor,
    multipliers: torch.Tensor,
    vocab_sizes: torch.Tensor,
    offsets: torch.Tensor,
    image_token_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Embedding-table indices of each token's n-grams.

    For layer l, token t and n-gram order n (2 .. max_ngram_size), h = XOR over i < n of
    ngram_token_ids[t, i] * multipliers[l, i] (int64, wrapping); table j of that order gives column
    c = (n - 2) * num_embed_table_per_ngram + j the index (h mod vocab_sizes[l, n - 2, j]) + offsets[l, c],
    mod being the floor modulo. Image tokens (image_token_mask True) get -1 in every column.

    Args:
        ngram_token_ids: (num_tokens, max_ngram_size) int32, contiguous; max_ngram_size in [2, 8].
        multipliers: (num_ngram_layers, max_ngram_size) int64, contiguous.
        vocab_sizes: (num_ngram_layers, max_ngram_size - 1, num_embed_table_per_ngram) int32, contiguous; positive.
        offsets: (num_ngram_layers, (max_ngram_size - 1) * num_embed_table_per_ngram) int32, contiguous.
        image_token_mask: optional (num_tokens,) bool.

    Returns:
        (num_ngram_layers, num_tokens, (max_ngram_size - 1) * num_embed_table_per_ngram) int32.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
    device, num_tokens, max_ngram_size, num_layers, num_tables, num_cols, ids_ptr, mult_ptr, vocab_ptr, offsets_ptr, mask_ptr = _check(
        ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask
    )
    output = torch.empty((num_layers, num_tokens, num_cols), dtype=_I32, device=ngram_token_ids.device)
    if num_tokens == 0 or num_layers == 0 or num_cols == 0:
        return output
    launcher = _HASH.get(device, max_ngram_size)
    launcher(
        device, current_stream(device),
        ids_ptr, mult_ptr, vocab_ptr, offsets_ptr, mask_ptr, output.data_ptr(), 0 if image_token_mask is None else 1,
        num_tokens, num_layers, num_tables,
    )  # fmt: skip
    return output


def _fake(new, ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask=None):
    """engram_hash's output (tracing, tkaot/_compile.py)."""
    num_cols = vocab_sizes.shape[1] * vocab_sizes.shape[2]
    return new.empty((multipliers.shape[0], ngram_token_ids.shape[0], num_cols), _I32, ngram_token_ids.device)


_traced_engram_hash = traced(engram_hash, _fake)
