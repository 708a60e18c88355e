"""Layers whose runtime holds every code of the checkpoint's packed words, so the words are not kept twice.

A CPU int4 layer re-lays ``qweight`` into its kernels' blocks, an EXL2 layer ``q_weight`` into GPTQ layouts or
4-bit parts, an MLX layer on CPU its ``weight`` into 4-bit parts; keeping both held each code twice (8.8 bits a
4-bit GPTQ weight at groups of 128 on CPU instead of 4.4). Once the runtime is built, ``drop_codes_buffer()``
empties the words' buffer; reading the attribute afterwards (``affine()``, ``dequantize()``, sharding,
conversion) gets the words rebuilt from the runtime, word for word, as a transient tensor, and ``state_dict()``
writes them. Writing the words (``load_state_dict``, ``load_affine``) gives the layer its buffer back first and
the runtime is built again at the next forward.
"""

from __future__ import annotations

from typing import Any

import torch


class CodesInRuntime:
    """Mixin for a ``QuantLinear`` whose runtime can give back every code of its ``codes_buffer``.

    The kernel provides ``runtime_can_rebuild()``, ``rebuilt_words()`` (the buffer's words from the runtime),
    ``runtime_anchor()`` (a runtime tensor that stands in for the words in the identity key) and
    ``drop_runtime()``; the layout base ``checkpoint_names()`` and ``checkpoint_shapes()``. Its ``prepare()``
    reads the words as usual (rebuilt, when dropped), calls ``keep_words_unless`` before replacing the runtime
    and ``drop_codes_buffer`` after.
    """

    #: the checkpoint buffer the runtime replaces
    codes_buffer = "qweight"

    def runtime_can_rebuild(self) -> bool:
        raise NotImplementedError

    def rebuilt_words(self) -> torch.Tensor:
        """The checkpoint's words from the runtime, word for word (a transient tensor)."""
        raise NotImplementedError

    def runtime_anchor(self) -> torch.Tensor:
        raise NotImplementedError

    def drop_runtime(self) -> None:
        """Forget the runtime (new words are arriving)."""
        raise NotImplementedError

    @property
    def codes_replaced(self) -> bool:
        """The words' buffer is empty and the runtime holds the codes."""
        return self.__dict__.get("_buffers", {}).get(self.codes_buffer, 0) is None

    def keep_words_unless(self, readable: bool, words: torch.Tensor | None = None) -> None:
        """Before a new runtime replaces the current one: if the new one cannot give the codes back
        (``readable`` False) and the words were dropped, put them back (``words``, when the caller already read
        them, else rebuilt from the current runtime) first."""
        if self.codes_replaced and not readable:
            self._buffers[self.codes_buffer] = self.rebuilt_words() if words is None else words

    def drop_codes_buffer(self) -> None:
        """After the runtime is built (``prepare``): empty the words' buffer when the runtime can rebuild it."""
        if self.runtime_can_rebuild():
            self._buffers[self.codes_buffer] = None
            self._runtime_key = self._current_key()

    def __getattr__(self, name: str) -> Any:
        if name == type(self).codes_buffer and self.codes_replaced:
            return self.rebuilt_words()
        return super().__getattr__(name)

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        if not self.codes_replaced:
            return super().checkpoint_tensors()
        return [self.runtime_anchor() if n == self.codes_buffer else getattr(self, n) for n in self.checkpoint_names()]

    def restore_codes_buffer(self) -> None:
        """Give the words their buffer back (zero-filled, the layout's shape) before something writes into it."""
        if self.codes_replaced:
            shape, dtype = self.checkpoint_shapes()[self.codes_buffer]
            device = next(b.device for b in self._buffers.values() if b is not None)
            self._buffers[self.codes_buffer] = torch.zeros(shape, dtype=dtype, device=device)
            self.drop_runtime()
            self._runtime_key = None

    def write_checkpoint(self, values: Any, bias: torch.Tensor | None = None) -> None:
        if self.codes_buffer in values:
            self.restore_codes_buffer()
        super().write_checkpoint(values, bias)

    def _load_from_state_dict(self, state_dict: dict[str, object], prefix: str, *args: object,
                              **kwargs: object) -> None:
        if prefix + self.codes_buffer in state_dict:
            self.restore_codes_buffer()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        """The checkpoint is the file's layout, also when the runtime holds the codes (the words rebuilt)."""
        if not self.codes_replaced:
            return super()._save_to_state_dict(destination, prefix, keep_vars)
        self._buffers[self.codes_buffer] = self.rebuilt_words()
        try:
            super()._save_to_state_dict(destination, prefix, keep_vars)
        finally:
            self._buffers[self.codes_buffer] = None


class DeviceMovesOnly:
    """Mixin: ``model.half()`` / ``model.to(torch.bfloat16)`` move such a layer but cast none of its tensors. A runtime
    that holds the codes with their scales (float16 or bfloat16 as stored, float32 super-scales) must keep them
    exact, or the file's words could not be rebuilt and the layer would compute with rounded scales."""

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        def keep_dtype(t: torch.Tensor) -> torch.Tensor:
            out = fn(t)
            return out if out.dtype == t.dtype else t.to(out.device)

        return super()._apply(keep_dtype, recurse)  # type: ignore[misc]
