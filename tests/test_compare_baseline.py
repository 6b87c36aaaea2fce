"""benchmarks/compare_baseline.py: jax_mla's benchmark rows against FlashMLA's on the same GPU."""

from __future__ import annotations

import json

from script_loader import load_script

GPU = "NVIDIA H100 80GB HBM3"


def _write(path, device, rows):
    path.write_text(json.dumps({"device_kind": device, "rows": rows}))
    return str(path)


def _write_driver(path, device, configs):
    """A file as benchmarks/flashmla_baseline/driver.cu writes it."""
    rows = [{"name": n, "us_per_call_with_metadata": w, "us_per_call_without_metadata": wo, "check": "pass"}
            for n, w, wo in configs]
    path.write_text(json.dumps({"gpu": device, "configs": rows}))
    return str(path)


def _run(capsys, argv):
    rc = load_script("benchmarks/compare_baseline.py").main(argv)
    return rc, capsys.readouterr()


def test_medians_and_ratio(tmp_path, capsys):
    ours = [
        _write(tmp_path / "bench.json", GPU, [
            {"name": "b16_sq1_h128_1k", "impl": "jax_mla", "us": 30.0},
            {"name": "b16_sq1_h128_1k", "impl": "plain-xla", "us": 900.0},   # not ours: ignored
            {"name": "b1_sq1_h128_32k", "impl": "jax_mla", "us": 50.0},
        ]),
        _write(tmp_path / "bench-2.json", GPU, [
            {"name": "b16_sq1_h128_1k", "impl": "jax_mla", "us": 34.0},
            {"name": "b1_sq1_h128_32k", "impl": "jax_mla", "us": 52.0},
        ]),
    ]
    base = [_write_driver(tmp_path / "flashmla.json", GPU, [
        ("b16_sq1_h128_1k", 40.0, 32.0),
        ("b128_sq1_h128_4k", 300.0, 290.0),   # no row of ours: not printed
    ])]
    rc, out = _run(capsys, ["--ours", *ours, "--baseline", *base])
    assert rc == 0, out.err
    line = next(l for l in out.out.splitlines() if l.startswith("b16_sq1_h128_1k"))
    # median of ours (30, 34) = 32; 32 / 40 = 0.80; without FlashMLA's metadata 32.0, ratio 1.00.
    assert line.split()[-4:] == ["40.0", "0.80", "32.0", "1.00"]
    assert "30.0 34.0" in line
    assert "b128_sq1_h128_4k" not in out.out and "b1_sq1_h128_32k" not in out.out


def test_variant_rows(tmp_path, capsys):
    ours = [_write(tmp_path / "bench.json", GPU, [
        {"name": "b16_sq1_h128_1k", "impl": "jax_mla/exact", "us": 36.0},
        {"name": "b16_sq1_h128_1k", "impl": "jax_mla/lazy", "us": 20.0},
    ])]
    base = [_write_driver(tmp_path / "flashmla.json", GPU, [("b16_sq1_h128_1k", 40.0, 40.0)])]
    rc, out = _run(capsys, ["--ours", *ours, "--baseline", *base, "--variant", "lazy"])
    assert rc == 0
    assert " 0.50 " in out.out
    # Without --variant no row is the default implementation's: an error, not an empty table.
    rc, out = _run(capsys, ["--ours", *ours, "--baseline", *base])
    assert rc == 1 and "no config" in out.err


def test_refuses_files_from_different_gpus(tmp_path, capsys):
    ours = [_write(tmp_path / "bench.json", GPU, [{"name": "x", "impl": "jax_mla", "us": 1.0}])]
    base = [_write_driver(tmp_path / "flashmla.json", "NVIDIA H200", [("x", 1.0, 1.0)])]
    rc, out = _run(capsys, ["--ours", *ours, "--baseline", *base])
    assert rc == 1 and "different GPUs" in out.err
