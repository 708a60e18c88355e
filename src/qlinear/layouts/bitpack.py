"""Little-endian bit-stream packing of unsigned ``b``-bit codes into signed torch integer words.

One rule covers every width: code ``i`` occupies stream bits ``[b*i, b*i + b)`` and stream bit ``t``
lives in word ``t // W`` at bit ``t % W`` (``W`` = word bits). When ``b`` divides ``W`` this is "field
``j`` of word ``r`` holds code ``r*pf + j``"; for 3 bits in int32 it is GPTQ's 10-1-10-1-10 layout.

Words are signed torch integers holding the unsigned bits (``0x87654321`` is a negative int32). The
bit math works on blocks of ``lcm(b, W) / b`` codes (``lcm(b, W) / W`` words), looping only over the
positions inside one block. It runs in the word dtype itself for int32/int64 words (torch's left
shift wraps like an unsigned shift; right shifts are arithmetic, so every read masks afterwards) and
in int32 for int8/int16 words, which are masked and reinterpreted at the end.
"""

from __future__ import annotations

import math

import torch

WORD_DTYPES: tuple[torch.dtype, ...] = (torch.int8, torch.int16, torch.int32, torch.int64)
_INT_CODE_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def word_bits_of(dtype: torch.dtype, name: str = "pack_dtype") -> int:
    """Bits per word of a pack dtype; raises unless it is int8, int16, int32 or int64."""
    if dtype not in WORD_DTYPES:
        raise ValueError(f"{name}: expected one of torch.int8, torch.int16, torch.int32, torch.int64 "
                         f"as the word dtype, got {dtype}")
    return torch.iinfo(dtype).bits


def packed_length(count: int, bits: int, word_bits: int) -> int:
    """Words needed for ``count`` codes of ``bits`` bits: ``ceil(count * bits / word_bits)``."""
    return -(-count * bits // word_bits)


def _check_bits(bits: int, word_bits: int) -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= min(8, word_bits):
        raise ValueError(f"bits: expected an integer in 1..{min(8, word_bits)} for {word_bits}-bit words, "
                         f"got {bits!r}")


def _block(bits: int, word_bits: int) -> tuple[int, int, list[tuple[int, int]]]:
    """Codes per block, words per block, and (word index, shift) of every code position in a block."""
    span = math.lcm(bits, word_bits)
    return span // bits, span // word_bits, [divmod(bits * p, word_bits) for p in range(span // bits)]


def _as_3d(t: torch.Tensor, dim: int, name: str) -> tuple[torch.Tensor, int]:
    """View ``t`` as ``[pre, L, post]`` around ``dim`` (so slices along L stay contiguous in post)."""
    if t.dim() == 0:
        raise ValueError(f"{name}: expected a tensor with at least 1 dimension, got a scalar")
    if not -t.dim() <= dim < t.dim():
        raise ValueError(f"{name}: dim {dim} is out of range for a {t.dim()}-D tensor of shape {tuple(t.shape)}")
    dim %= t.dim()
    pre = math.prod(t.shape[:dim])
    post = math.prod(t.shape[dim + 1:])
    return t.reshape(pre, t.shape[dim], post), dim


def _acc_dtype(word_bits: int) -> torch.dtype:
    """Dtype for the bit math: the word itself for 32/64-bit words (left shifts wrap), else int32."""
    return torch.int64 if word_bits == 64 else torch.int32


def _to_words(values: torch.Tensor, word_bits: int, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret accumulator values holding ``word_bits``-bit patterns as signed ``dtype`` words."""
    if word_bits >= 32:
        return values  # already the word dtype, every bit in place
    values = values & ((1 << word_bits) - 1)
    half = 1 << (word_bits - 1)
    return torch.where(values >= half, values - (1 << word_bits), values).to(dtype)


def pack_bits(codes: torch.Tensor, bits: int, pack_dtype: torch.dtype, dim: int = 0, *,
              name: str = "codes") -> torch.Tensor:
    """Pack ``codes`` (unsigned ``bits``-bit values) along ``dim`` into ``pack_dtype`` words.

    The output has ``ceil(L * bits / W)`` words along ``dim`` (``L`` = codes along ``dim``); unused
    tail bits are zero. ``name`` is used in error messages.
    """
    word_bits = word_bits_of(pack_dtype)
    _check_bits(bits, word_bits)
    if codes.dtype not in _INT_CODE_DTYPES:
        raise ValueError(f"{name}: expected an integer dtype (uint8 codes), got {codes.dtype}")
    x, dim = _as_3d(codes, dim, name)
    maxq = (1 << bits) - 1
    if codes.numel():
        lo, hi = int(codes.min()), int(codes.max())
        if lo < 0 or hi > maxq:
            bad = ((codes < 0) | (codes > maxq)).nonzero()[0].tolist()
            raise ValueError(f"{name}: values must be in 0..{maxq} for {bits} bits; found {int(codes[tuple(bad)])} "
                             f"at index {tuple(bad)} (range {lo}..{hi})")
    pre, length, post = x.shape
    per_block, words_per_block, places = _block(bits, word_bits)
    n_blocks = -(-length // per_block)
    if n_blocks * per_block != length:
        padded = torch.zeros(pre, n_blocks * per_block, post, dtype=x.dtype, device=x.device)
        padded[:, :length] = x
        x = padded
    x = x.reshape(pre, n_blocks, per_block, post)
    acc = _acc_dtype(word_bits)
    out = torch.zeros(pre, n_blocks, words_per_block, post, dtype=acc, device=codes.device)
    for p, (word, shift) in enumerate(places):
        v = x[:, :, p].to(acc)
        out[:, :, word] |= v << shift  # left shifts wrap, so bits past a 32/64-bit word fall off
        if shift + bits > word_bits:  # the code spills into the next word
            out[:, :, word + 1] |= v >> (word_bits - shift)
    out = _to_words(out, word_bits, pack_dtype).reshape(pre, n_blocks * words_per_block, post)
    n_words = packed_length(length, bits, word_bits)
    shape = (*codes.shape[:dim], n_words, *codes.shape[dim + 1:])
    return out[:, :n_words].reshape(shape).contiguous()


def unpack_bits(words: torch.Tensor, bits: int, count: int, dim: int = 0, *, name: str = "words") -> torch.Tensor:
    """Read ``count`` unsigned ``bits``-bit codes along ``dim`` of ``words``; returns uint8.

    ``words`` must hold at least ``ceil(count * bits / W)`` words along ``dim``; extra words are ignored.
    """
    word_bits = word_bits_of(words.dtype, name)
    _check_bits(bits, word_bits)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"count: expected a non-negative integer number of codes, got {count!r}")
    x, dim = _as_3d(words, dim, name)
    pre, have, post = x.shape
    need = packed_length(count, bits, word_bits)
    if have < need:
        raise ValueError(f"{name}: {count} codes of {bits} bits need {need} {words.dtype} words along dim {dim}, "
                         f"found {have} (shape {tuple(words.shape)})")
    per_block, words_per_block, places = _block(bits, word_bits)
    n_blocks = -(-count // per_block)
    acc = _acc_dtype(word_bits)
    x = x[:, :n_blocks * words_per_block].to(acc)  # sign-extended; every read below masks
    if x.shape[1] < n_blocks * words_per_block:
        padded = torch.zeros(pre, n_blocks * words_per_block, post, dtype=acc, device=words.device)
        padded[:, :x.shape[1]] = x
        x = padded
    w = x.reshape(pre, n_blocks, words_per_block, post)
    mask = (1 << bits) - 1
    out = torch.empty(pre, n_blocks, per_block, post, dtype=torch.uint8, device=words.device)
    for p, (word, shift) in enumerate(places):
        low_bits = min(bits, word_bits - shift)
        v = (w[:, :, word] >> shift) & ((1 << low_bits) - 1)  # arithmetic shift: mask off the sign copies
        if low_bits < bits:  # the high bits come from the start of the next word
            v |= (w[:, :, word + 1] & ((1 << (bits - low_bits)) - 1)) << low_bits
        out[:, :, p] = (v & mask).to(torch.uint8)
    out = out.reshape(pre, n_blocks * per_block, post)[:, :count]
    return out.reshape(*words.shape[:dim], count, *words.shape[dim + 1:]).contiguous()
