"""EXL2 layers whose runtime replaces the file's ``q_weight`` (``Exl2TritonLinear``, ``Exl2CpuLinear``).

Their runtimes keep every code, so keeping ``q_weight`` beside them would hold the weight twice. Once
``prepare()`` built the runtime, the words are dropped and rebuilt from it (word for word) whenever the
checkpoint is asked for: ``tensors()``, ``state_dict()``, ``dequantize()``, sharding. A state dict that brings
``q_weight`` back gives the layer an empty buffer to load into, and the next forward prepares again.
"""

from __future__ import annotations

from typing import Any

import torch

from .exl2 import Exl2TorchLinear, exl2_params


class Exl2ReplacedWeight(Exl2TorchLinear):
    """Base of the EXL2 layers whose runtime stands in for ``q_weight`` once prepared."""

    def register_checkpoint_buffers(self, bias: bool) -> None:
        super().register_checkpoint_buffers(bias)
        #: ``q_weight`` was dropped for the runtime (``prepare``); ``tensors()`` rebuilds it
        self.weight_replaced = False

    # the three things a subclass says about its runtime
    def rebuild_q_weight(self) -> torch.Tensor:
        """The file's ``q_weight`` from the runtime, word for word."""
        raise NotImplementedError

    def runtime_anchor(self) -> torch.Tensor:
        """A runtime tensor that stands in for ``q_weight`` in the identity key of ``ensure_prepared``."""
        raise NotImplementedError

    def drop_runtime(self) -> None:
        """Forget the runtime (new words are arriving)."""
        raise NotImplementedError

    def replace_weight(self) -> None:
        """After the runtime is built: drop ``q_weight`` and key the runtime on what is left."""
        self.q_weight, self.weight_replaced = None, True
        self._runtime_key = self._current_key()

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors; once the runtime replaced ``q_weight``, it is rebuilt from it (transient)."""
        t = super().tensors()
        if self.weight_replaced:
            t["q_weight"] = self.rebuild_q_weight()
        return t

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        if not self.weight_replaced:
            return super().checkpoint_tensors()
        return [self.runtime_anchor(), self.q_invperm, self.q_scale, self.q_scale_max, self.q_groups, self.bias]

    def _restore_weight_buffer(self) -> None:
        """Before a state dict with ``q_weight`` arrives in a layer whose words were replaced: an empty buffer."""
        p = exl2_params(self.scheme)
        self.q_weight = torch.empty(sum(p.word_rows), self.out_features, dtype=torch.int32,
                                    device=self.q_scale.device)
        self.drop_runtime()
        self.weight_replaced, self._runtime_key = False, None

    def _load_from_state_dict(self, state_dict: dict[str, object], prefix: str, *args: object,
                              **kwargs: object) -> None:
        if self.weight_replaced and prefix + "q_weight" in state_dict:
            self._restore_weight_buffer()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        """The checkpoint is the file's layout, also when the runtime replaced ``q_weight`` (rebuilt)."""
        if not self.weight_replaced:
            return super()._save_to_state_dict(destination, prefix, keep_vars)
        self._buffers["q_weight"] = self.rebuild_q_weight()
        try:
            super()._save_to_state_dict(destination, prefix, keep_vars)
        finally:
            self._buffers["q_weight"] = None

    def ensure_prepared(self) -> None:
        if not self.weight_replaced:  # the runtime is the weight now; nothing to derive it from
            super().ensure_prepared()
