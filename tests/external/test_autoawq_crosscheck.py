"""Bit-for-bit cross-check of qlinear's AWQ layouts against AutoAWQ 0.2.9's own pure-torch code.

Install: ``.venv/bin/pip install --no-deps -r requirements/nodeps-autoawq.txt``. ``import awq`` would pull in
transformers and accelerate (its ``__init__`` loads every model class), so the files used here are loaded
on their own under a stand-in ``awq`` package: ``utils/packing_utils.py`` (``unpack_awq``,
``reverse_awq_order``, ``dequantize_gemm``) and the packers ``WQLinear_GEMM/GEMV/GEMVFast.from_linear``,
which need only torch (``awq.utils.utils`` is stubbed with the one helper gemm.py imports, ``get_best_device``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from qlinear import AffineWeight, Scheme
from qlinear.layouts import awq

pytestmark = pytest.mark.external

INSTALL = ".venv/bin/pip install --no-deps -r requirements/nodeps-autoawq.txt"


@pytest.fixture(scope="module")
def autoawq() -> Iterator[dict[str, types.ModuleType]]:
    spec = importlib.util.find_spec("awq")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"AutoAWQ not installed: {INSTALL}")
    root = Path(spec.submodule_search_locations[0])
    pkg, utils = types.ModuleType("awq"), types.ModuleType("awq.utils")
    pkg.__path__, utils.__path__ = [str(root)], [str(root / "utils")]
    stub = types.ModuleType("awq.utils.utils")
    stub.get_best_device = lambda: "cpu"
    before = set(sys.modules)
    with pytest.MonkeyPatch.context() as mp:
        for name, mod in (("awq", pkg), ("awq.utils", utils), ("awq.utils.utils", stub)):
            mp.setitem(sys.modules, name, mod)
        for name in [n for n in sys.modules if n.startswith("awq.") and n not in ("awq.utils", "awq.utils.utils")]:
            mp.delitem(sys.modules, name)
        loaded = {}
        for name, rel in (("packing", "utils/packing_utils.py"), ("gemm", "modules/linear/gemm.py"),
                          ("gemv", "modules/linear/gemv.py"), ("fast", "modules/linear/gemv_fast.py")):
            mod_spec = importlib.util.spec_from_file_location(f"awq._qlinear_check_{name}", root / rel)
            module = importlib.util.module_from_spec(mod_spec)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod_spec.loader.exec_module(module)
            loaded[name] = module
        try:
            yield loaded
        finally:  # drop what the loaded files imported under the stand-in package
            for name in [n for n in sys.modules if n.startswith("awq.") and n not in before]:
                del sys.modules[name]


def weight(n: int, k: int, gs: int, sym: bool, seed: int) -> tuple[AffineWeight, torch.nn.Linear]:
    """Canonical weight with float16 scales, and the fake-quantized nn.Linear AWQ's packers expect."""
    g = torch.Generator().manual_seed(seed)
    groups = k // gs
    zeros = torch.full((n, groups), 8, dtype=torch.int32) if sym else torch.randint(0, 16, (n, groups), generator=g,
                                                                                      dtype=torch.int32)
    q = AffineWeight(codes=torch.randint(0, 16, (n, k), generator=g).to(torch.uint8),
                     scales=(torch.rand(n, groups, generator=g) * 0.05 + 1e-3).half().float(), zeros=zeros,
                     g_idx=torch.arange(k, dtype=torch.int32) // gs, bits=4, group_size=gs, sym=sym)
    linear = torch.nn.Linear(k, n, bias=False)
    linear.weight.data = q.dequantize(torch.float32)  # exact: fp16 scale times a small integer
    return q, linear


#: AutoAWQ sizes GEMM qweight as N // 32 * 4 words, so its GEMM packer needs N % 32 == 0 (ours: N % 8).
CASES = [(64, 256, 64, False, 0), (32, 128, 32, True, 1), (96, 256, 128, False, 2), (32, 64, 64, False, 3)]


@pytest.mark.parametrize(("n", "k", "gs", "sym", "seed"), CASES)
def test_gemm_matches_autoawq(autoawq, n: int, k: int, gs: int, sym: bool, seed: int) -> None:
    q, linear = weight(n, k, gs, sym, seed)
    ref = autoawq["gemm"].WQLinear_GEMM.from_linear(linear, 4, gs, scales=q.scales.t().contiguous(),
                                                    zeros=q.zeros.t().contiguous())
    ours = awq.to_checkpoint(q, "gemm")
    for name in ("qweight", "qzeros", "scales"):
        assert torch.equal(getattr(ref, name), ours[name]), name
    iw, iz = autoawq["packing"].unpack_awq(ours["qweight"], ours["qzeros"], 4)
    iw, iz = autoawq["packing"].reverse_awq_order(iw, iz, 4)
    assert torch.equal(iw & 15, q.codes.t().to(iw.dtype)) and torch.equal(iz & 15, q.zeros.t().to(iz.dtype))
    dense = autoawq["packing"].dequantize_gemm(ours["qweight"], ours["qzeros"], ours["scales"], 4, gs)
    assert torch.equal(dense, q.dequantize(torch.float16).t())  # fp16 (q - z) * s, one rounding either way


@pytest.mark.parametrize(("n", "k", "gs", "sym", "seed"), CASES)
def test_gemv_matches_autoawq(autoawq, n: int, k: int, gs: int, sym: bool, seed: int) -> None:
    q, linear = weight(n, k, gs, sym, seed)
    ref = autoawq["gemv"].WQLinear_GEMV.from_linear(linear, 4, gs, scales=q.scales, zeros=q.zeros)
    ours = awq.to_checkpoint(q, "gemv")
    for name in ("qweight", "qzeros", "scales"):
        assert torch.equal(getattr(ref, name), ours[name]), name
    assert autoawq["gemv"].calculate_zeros_width(k, gs) == awq.zeros_width(k, gs)


@pytest.mark.parametrize(("n", "k", "gs", "sym", "seed"), CASES)
def test_gemv_fast_matches_autoawq(autoawq, n: int, k: int, gs: int, sym: bool, seed: int) -> None:
    q, linear = weight(n, k, gs, sym, seed)
    ref = autoawq["fast"].WQLinear_GEMVFast.from_linear(linear, 4, gs, scales=q.scales, zeros=q.zeros)
    ours = awq.to_checkpoint(q, "gemv_fast")
    assert torch.equal(ref.qweight, ours["qweight"]) and torch.equal(ref.scales, ours["scales"])
    assert torch.equal(ref.qzeros.view(torch.int16), ours["qzeros"].view(torch.int16))  # -0.0 included
    scheme = Scheme(bits=4, group_size=gs, in_features=k, out_features=n, sym=sym, method="awq", format="gemv_fast")
    back = awq.from_checkpoint({"qweight": ref.qweight, "qzeros": ref.qzeros, "scales": ref.scales}, scheme)
    assert torch.equal(back.codes, q.codes) and torch.equal(back.zeros, q.zeros)
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32)
    assert torch.equal(autoawq["fast"].pack_intweight(codes, interleave=4, kstride=64),
                       awq.pack_fast(codes.to(torch.uint8)))
