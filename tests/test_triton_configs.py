"""The launch-config table and heuristics (``kernels/triton/configs.py``): which variant and tiles a call
gets, from the shipped H200 table or the heuristic. No kernel runs here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from qlinear.kernels.triton import configs


@pytest.fixture(autouse=True)
def _fresh_layered_tables():
    """Tests below swap the shipped tables; the per-device merge is cached by device name."""
    configs._layered.cache_clear()
    yield
    configs._layered.cache_clear()


def test_shipped_gemv_tc_entries_run_the_chunks_they_state() -> None:
    """Every shipped gemv_tc entry's block_k is the step it ran on the H200 (``units`` takes it unchanged), and
    the heuristic keeps steps inside a group except for 32-code groups (two a step)."""
    pytest.importorskip("triton", reason="qmv_tc.units lives in a Triton module")
    from qlinear.kernels.triton.layout import block_rows
    from qlinear.kernels.triton.qmv_tc import units

    entries = {key: e for dev in configs._shipped()[0].values() for key, e in dev["configs"].items()
               if key.startswith("gemv_tc:")}
    assert len(entries) >= 30
    for key, e in entries.items():
        f = dict(part.split("=") for part in key.split(":")[1:])
        bits, group, k = int(f["b"]), int(f["g"]), int(f["k"])
        ck = block_rows(group, 32 // bits) * 32 // bits
        p = SimpleNamespace(rows_per_block=ck * bits // 32, bits=bits, kp=k, group=group)
        assert units(p, e["block_k"]) * ck == e["block_k"], key
    for bits, group, want in ((4, 128, 2), (2, 128, 1), (4, 32, 2), (2, 32, 2), (4, 64, 1), (4, 1 << 30, 4)):
        cfg = configs.heuristic("gemv_tc", 132, 1, 4096, 4096, bits, group)
        ck = block_rows(min(group, 4096), 32 // bits) * 32 // bits
        assert cfg.block_k == want * ck, (bits, group, cfg.block_k)


def test_configs_table_and_heuristics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured entries win (nearest M bucket of the same variant and shape); others get the heuristic."""
    key = configs.table_key("gemv", 1, 4096, 4096, 4, 128)
    table = {"H": {"crossovers": {"4": {"gemv": 1, "skinny": 8, "gemm": 256}},
                   "configs": {key: {"block_n": 512, "block_k": 32, "split_k": 7, "num_warps": 4}}}}
    monkeypatch.setattr(configs, "_shipped", lambda: (table, {}))
    assert [configs.pick_variant("H", m, 4) for m in (1, 2, 8, 9, 256, 300)] == \
        ["gemv", "skinny", "skinny", "gemm", "gemm", "dense"]
    assert configs.choose("H", 132, 2, 4096, 4096, 4, 128, "gemv").split_k == 7  # nearest bucket
    assert configs.choose("other", 132, 1, 4096, 4096, 4, 128).variant == "gemv_tc"
    assert configs.choose("other", 132, 1, 4096, 4096, 4, 128, exclude=("gemv_tc",)).variant == "gemv"
    cfg = configs.legal(configs.Config("gemv", 4, 64, 64, 999, 2, 2), 1, 4096, 4)
    assert (cfg.block_m, cfg.block_n, cfg.split_k) == (1, 256, 64)  # layout contract, split <= K steps
    assert configs.legal(configs.Config("gemv", 4, 256, 64, 4, 2, 2), 3, 4096, 4).block_m == 4  # rows <= 4
    assert configs.choose("H", 132, 3, 4096, 4096, 4, 128, "gemv").block_m == 4  # another bucket's entry
    assert configs.choose("H", 132, 1, 4096, 4096, 4, 128, "gemv").block_m == 16  # the entry as measured


def test_a_shape_timed_for_several_variants_takes_the_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the table times two variants for the exact key (one run, side by side) the faster one runs;
    one timed variant, or none left after ``exclude``, leaves the choice to the crossovers."""
    def entry(us: float) -> dict:
        return {"block_m": 16, "block_n": 64, "block_k": 128, "split_k": 2, "num_warps": 2, "us": us}

    table = {"H": {"crossovers": {"4": {"gemv_tc": 8, "skinny2": 16, "gemm2": 256}},
                   "configs": {configs.table_key("gemv_tc", 16, 4096, 14336, 4, 128): entry(23.0),
                               configs.table_key("skinny2", 16, 4096, 14336, 4, 128): entry(25.9),
                               configs.table_key("gemv_tc", 16, 4096, 4096, 4, 128): entry(11.7),
                               configs.table_key("skinny2", 16, 4096, 4096, 4, 128): entry(10.7),
                               configs.table_key("gemv_tc", 16, 8192, 4096, 4, 128): entry(1.0)}}}
    monkeypatch.setattr(configs, "_shipped", lambda: (table, {}))
    assert configs.choose("H", 132, 12, 4096, 14336, 4, 128).variant == "gemv_tc"
    assert configs.choose("H", 132, 12, 4096, 4096, 4, 128).variant == "skinny2"
    assert configs.choose("H", 132, 12, 8192, 4096, 4, 128).variant == "skinny2"  # only one timed: crossovers
    assert configs.choose("H", 132, 12, 4096, 14336, 4, 128, exclude=("gemv_tc",)).variant == "skinny2"
    assert configs.choose("H", 132, 4, 4096, 14336, 4, 128).variant == "gemv_tc"  # another bucket: crossovers


def test_shipped_table_runs_the_fastest_timed_variant_at_mid_m() -> None:
    """The H200 table times variants side by side per key (one run per key: gemm5 against the shipped gemm4 /
    gemv_tc / dense at M = 8..4096 on four shapes): every such key picks its fastest. A 4-bit call whose table
    has no timing falls to the crossovers, which put gemm5 ahead of gemm4 ahead of gemm3 ahead of gemm2;
    excluding the ones a layer cannot run gives the next."""
    table = configs.device_table("NVIDIA H200")["configs"]
    timed: dict[str, dict[str, float]] = {}
    for key, entry in table.items():
        if "us" in entry:
            timed.setdefault(key.split(":", 1)[1], {})[key.split(":")[0]] = entry["us"]
    mid = [rest for rest, by in timed.items() if "gemm5" in by or "gemm4" in by]
    assert len([rest for rest in mid if "gemm5" in timed[rest] and len(timed[rest]) >= 2]) >= 32
    for rest in mid:
        f = dict(part.split("=") for part in rest.split(":"))
        m, n, k = int(f["m"]), int(f["n"]), int(f["k"])
        # one timed variant: the crossovers decide, and they give gemm5 from M = 9 to 4096
        want = min(timed[rest], key=timed[rest].__getitem__) if len(timed[rest]) >= 2 else "gemm5"
        assert configs.choose("NVIDIA H200", 132, m, n, k, 4, 128).variant == want, rest
    def pick(m: int, bits: int = 4, exclude: tuple[str, ...] = ()) -> str:
        return configs.choose("NVIDIA H200", 132, m, 3072, 3072, bits, 128, exclude=exclude).variant

    assert pick(100) == pick(12) == pick(600) == pick(3000) == "gemm5"
    assert pick(12, exclude=("gemm5",)) == "gemm4"
    assert pick(12, exclude=("gemm5", "gemm4")) == "skinny2"
    assert pick(12, bits=2) == "gemv_tc"  # 2-bit crossovers
    assert pick(100, exclude=("gemm5", "gemm4")) == "gemm3"
    assert pick(100, exclude=("gemm5", "gemm4", "gemm3")) == "gemm2"
    assert pick(100, bits=8) == "gemm2"  # 8-bit crossovers
    assert pick(3000, exclude=("gemm5",)) == pick(600, exclude=("gemm5", "gemm4")) == "dense"
    assert pick(5000) == "dense"


def test_explain_choice_names_the_variant_config_and_evidence() -> None:
    """The explanation re-traces choose(): its first line names the variant and the legalised config the call
    runs, with the side-by-side times where the table has them; every other variant gets its own reason."""
    from qlinear.kernels.triton.why import explain_choice

    h200 = "NVIDIA H200"
    lines = explain_choice(h200, 132, 128, 14336, 4096, 4096, 4, 128, {})
    cfg = configs.legal(configs.choose(h200, 132, 128, 14336, 4096, 4, 128), 128, 4096, 4)
    table = configs.device_table(h200)["configs"]
    us = {v: table[configs.table_key(v, 128, 14336, 4096, 4, 128)]["us"] for v in ("gemm5", "gemm4")}
    assert cfg.variant == "gemm5" and us["gemm5"] < us["gemm4"]
    assert lines[0].startswith("M=128: gemm5 — fastest of the variants")
    assert f"gemm5 {us['gemm5']:.1f} us, gemm4 {us['gemm4']:.1f} us" in lines[0]
    assert f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}, split-K {cfg.split_k}" in lines[0]
    assert f"  gemm4: timed slower for this shape ({us['gemm4']:.1f} us)" in lines
    assert "  gemm3: gemm5 comes first in the crossovers for this M" in lines
    assert "  gemv_tc: serves M buckets <= 8" in lines
    assert len(lines) == len(configs.VARIANTS)  # the chosen one, then each other variant once
    why = "compute capability 8.0 (needs 9.0+ for bfloat16 (sub/mul.bf16x2))"
    why4 = "compute capability 8.0 (Gluon wgmma + TMA: sm_90 only)"
    lines = explain_choice(h200, 132, 100, 3072, 3072, 3072, 4, 128, {"gemm5": why4, "gemm4": why4, "gemm3": why})
    assert lines[0].startswith("M=100: gemm2 — crossover: gemm2 serves M buckets <= 256 (128 here)")
    assert "heuristic (no table entry for this shape)" in lines[0]
    assert f"  gemm3: {why}" in lines and f"  gemm4: {why4}" in lines and f"  gemm5: {why4}" in lines
    assert explain_choice(h200, 132, 5000, 3072, 3072, 3072, 4, 128, {})[0].startswith(
        "M=5000: dense — no variant's crossover covers M bucket 8192")


def test_an_aliased_device_uses_the_other_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shipped alias gives a device another's table (same die, measured side by side); ``borrow_table``
    overrides it for A/B runs ("" = no table: the heuristic and default crossovers) and None undoes that."""
    key = configs.table_key("gemv", 1, 4096, 4096, 4, 128)
    own = configs.table_key("gemv", 1, 4096, 4096, 8, 128)
    table = {"H": {"crossovers": {"4": {"gemv": 1, "gemm": 256}},
                   "configs": {key: {"block_n": 512, "block_k": 32, "split_k": 7, "num_warps": 4},
                               own: {"block_n": 512, "block_k": 32, "split_k": 3, "num_warps": 4}}},
             "H-sibling": {"configs": {own: {"block_n": 256, "block_k": 64, "split_k": 5, "num_warps": 2}}}}
    monkeypatch.setattr(configs, "_shipped", lambda: (table, {"H-sibling": "H"}))
    assert configs.table_device("H-sibling") == "H"
    assert configs.choose("H-sibling", 132, 1, 4096, 4096, 4, 128).split_k == 7
    assert configs.choose("H-sibling", 132, 1, 4096, 4096, 8, 128, "gemv").split_k == 5  # its own entry wins
    assert configs.choose("H", 132, 1, 4096, 4096, 8, 128, "gemv").split_k == 3
    assert configs.pick_variant("H-sibling", 2, 4) == "gemm"
    try:
        configs.borrow_table("H-sibling", "")
        assert configs.device_table("H-sibling") == {}
        assert configs.pick_variant("H-sibling", 1, 4) == "gemv_tc"  # default crossovers
        configs.borrow_table("other", "H")
        assert configs.choose("other", 132, 1, 4096, 4096, 4, 128, "gemv").split_k == 7
    finally:
        configs.borrow_table("H-sibling", None)
        configs.borrow_table("other", None)
    assert configs.table_device("H-sibling") == "H" and configs.table_device("other") == "other"


def test_shipped_aliases_name_a_shipped_table() -> None:
    """The H100 SXM runs on the H200's table (same die and SM count; measured side by side): every shipped alias
    points at a table that ships, and a device's own entries (the H100's M = 1 g32 keys) are layered over it: an
    own entry replaces the aliased table's entry of that key, every other key is the aliased table's."""
    tables, aliases = configs._shipped()
    assert aliases.get("NVIDIA H100 80GB HBM3") == "NVIDIA H200"
    for device, source in aliases.items():
        assert source in tables and source != device, (device, source)
    layered = configs.device_table("NVIDIA H100 80GB HBM3")["configs"]
    own, base = tables["NVIDIA H100 80GB HBM3"]["configs"], tables["NVIDIA H200"]["configs"]
    assert set(own) & set(base), "an H100 entry should replace an H200 entry of the same key"
    assert set(layered) == set(base) | set(own)
    for key, entry in layered.items():
        assert entry == (own[key] if key in own else base[key]), key
