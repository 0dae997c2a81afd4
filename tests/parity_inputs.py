"""Seeded input builders for the parity cases (tests/parity_cases.py): activations, FP8/FP4 data with their scale
factors in every kind and layout TileKernels reads, poisoned output buffers, MoE expert layouts.

Everything is made by one `Gen` per call, from a seeded torch generator on the call's device, so two builds of one
case hold the same bytes. On the meta device (the CPU check of the cases) the same code makes tensors of the same
shapes, dtypes and strides, without values.
"""

from __future__ import annotations

import torch

BF16, F32 = torch.bfloat16, torch.float32
E4M3 = torch.float8_e4m3fn
PACK = 4  # UE8M0 exponent bytes per int32 (TileKernels on CUDA)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align(a: int, b: int) -> int:
    return ceil_div(a, b) * b


class Gen:
    """Tensors for one call, on `device`, from a torch generator seeded with `seed` (none on meta)."""

    def __init__(self, device, seed: int):
        self.device = torch.device(device)
        self.meta = self.device.type == "meta"
        self.g = None if self.meta else torch.Generator(self.device).manual_seed(seed)

    def randn(self, *shape, dtype=F32) -> torch.Tensor:
        return torch.randn(shape, generator=self.g, device=self.device).to(dtype)

    def rand(self, *shape) -> torch.Tensor:
        return torch.rand(shape, generator=self.g, device=self.device)

    def randint(self, low: int, high: int, *shape, dtype=torch.int64) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=self.g, device=self.device, dtype=dtype)

    def bools(self, n: int, p: float) -> torch.Tensor:
        return self.rand(n) < p

    def tensor(self, values, dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def poisoned(self, *shape, dtype) -> torch.Tensor:
        """An output buffer, every byte 0xFF (NaN for floats), so elements nobody writes show."""
        return self.poison(torch.empty(shape, dtype=dtype, device=self.device))

    def poison(self, t: torch.Tensor) -> torch.Tensor:
        if not self.meta:
            t.untyped_storage().fill_(0xFF)
        return t

    def activations(self, *shape, dtype=BF16, row_pitch: int | None = None) -> torch.Tensor:
        """Rows of very different magnitudes, an all-zero row, and exact quarters (rounding ties) every 37th column.
        With `row_pitch`, a view of the first shape[-1] columns of wider rows (the rest random too)."""
        full = (*shape[:-1], row_pitch or shape[-1])
        x = self.randn(*full) * torch.exp2(self.randint(-8, 9, *full[:-1], 1).float())
        if x.ndim >= 2 and x.shape[-2] > 2:
            x[..., x.shape[-2] // 2, :] = 0
        x[..., ::37] = torch.round(x[..., ::37] * 4) / 4
        return x.to(dtype)[..., : shape[-1]]

    def logits(self, tokens: int, experts: int) -> torch.Tensor:
        """MoE gate logits with exact ties in every row (experts 0, 9, 18, ... equal) and one row of nothing but ties."""
        x = self.randn(tokens, experts) * 2
        x[:, 9::9] = x[:, :1]
        x[0] = 0.5
        return x

    # -- quantized data and scale factors

    def fp8(self, rows: int, cols: int) -> torch.Tensor:
        """Random E4M3 bytes over the whole range, subnormals included, NaN codes replaced by +-448."""
        b = self.randint(0, 256, rows, cols, dtype=torch.int32)
        b = torch.where((b & 0x7F) == 0x7F, b - 1, b)
        return b.to(torch.uint8).view(E4M3)

    def fp4(self, rows: int, cols: int) -> torch.Tensor:
        """Random E2M1 pairs, two a byte (every 4-bit code is a number), as int8 of `cols` // 2 columns."""
        return self.randint(-128, 128, rows, cols // 2, dtype=torch.int8)

    def sf_values(self, rows: int, cols: int, kind: str) -> torch.Tensor:
        """Positive scale factors (rows, cols) as float32: kind 'fp32' any, 'pow2'/'ue8m0' powers of two, 'e4m3' E4M3
        values."""
        exps = self.randint(-12, 8, rows, cols).float()
        if kind in ("pow2", "ue8m0"):
            return torch.exp2(exps)
        value = torch.exp2(exps) * (1 + self.rand(rows, cols))
        return value.to(E4M3).float() if kind == "e4m3" else value

    def sf_tensor(self, values: torch.Tensor, kind: str, col_major: bool, col_pack: bool = False) -> torch.Tensor:
        """Scale factors (float32 values, logical (rows, cols)) stored as TileKernels stores them: float32, E4M3 or
        UE8M0 bytes packed 4 to an int32 (along columns, or along rows with `col_pack`); column-major ones as the
        transposed view of a (cols, rows aligned to 16 bytes) buffer."""
        rows, cols = values.shape
        if kind == "ue8m0":
            exps = ((values.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
            if col_pack:
                padded = torch.zeros(align(rows, PACK), cols, dtype=torch.uint8, device=self.device)
                padded[:rows] = exps
                return padded.view(-1, PACK, cols).transpose(1, 2).contiguous().view(torch.int32).view(-1, cols)
            padded = torch.zeros(rows, align(cols, PACK), dtype=torch.uint8, device=self.device)
            padded[:, :cols] = exps
            stored = padded.view(torch.int32)
        else:
            stored = values.to(E4M3) if kind == "e4m3" else values
        if not col_major:
            return stored.contiguous()
        r, c = stored.shape
        pitch = align(r, 16 // stored.element_size())
        buf = torch.zeros(c, pitch, dtype=stored.dtype, device=self.device)
        buf[:, :r] = stored.T
        return buf[:, :r].T


def sf_grid(tokens: int, hidden: int, block: tuple[int, int]) -> tuple[int, int]:
    return ceil_div(tokens, block[0]), ceil_div(hidden, block[1])


def psum_layout(gen_rng, tokens: int, experts: int, alignment: int = 128) -> list[int]:
    """End of each expert's tokens, TileKernels' psum_num_tokens_per_expert: expert e's rows start at its
    predecessor's end rounded up to `alignment`; some experts get none, ends never pass `tokens`."""
    ends, begin = [], 0
    for e in range(experts):
        start = min(align(begin, alignment), tokens)
        count = 0 if gen_rng.random() < 0.25 else gen_rng.randint(0, max(0, tokens - start))
        if e == experts - 1 and gen_rng.random() < 0.5:
            count = tokens - start
        ends.append(start + count)
        begin = start + count
    return ends


def psum_rows(tokens: int, ends: list[int], alignment: int = 128) -> list[bool]:
    """The rows TileKernels' SwiGLU writes for a psum layout: [aligned end of expert e-1, end of expert e)."""
    rows = [False] * tokens
    start = 0
    for end in ends:
        for r in range(start, min(end, tokens)):
            rows[r] = True
        start = align(end, alignment)
    return rows
