"""The MFU denominator: Lightning's peak table where it knows the device, ours only where it lacks it or
reads it wrongly, none at all for a CPU or an unknown device (MFU is then omitted, not guessed)."""

from __future__ import annotations

import pytest
import torch

from lightning_field.profiling.throughput import LIGHTNING_PEAK_SOURCE, PEAK_FLOPS, peak_flops

CUDA = torch.device("cuda", 0)


def _named(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def test_a_cpu_has_no_peak_and_a_user_peak_wins_everywhere() -> None:
    assert peak_flops(torch.device("cpu"), "32-true", None) == (None, "no peak for cpu: MFU is not reported")
    assert peak_flops(CUDA, "bf16-mixed", 1e12) == (1e12, "user override (peak_flops)")


def test_a_device_lightning_knows_gets_lightnings_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    _named(monkeypatch, "NVIDIA H100 80GB HBM3")
    peak, source = peak_flops(CUDA, "bf16-mixed", None)
    assert peak == pytest.approx(989.4e12) and LIGHTNING_PEAK_SOURCE in source
    _named(monkeypatch, "NVIDIA A100-SXM4-80GB")
    assert peak_flops(CUDA, "16-mixed", None)[0] == pytest.approx(312e12)


@pytest.mark.parametrize(("name", "fragment"), [("NVIDIA H200", "H200"), ("NVIDIA L40S", "L40S")])
def test_devices_lightning_lacks_or_misreads_get_our_dense_peak(
    monkeypatch: pytest.MonkeyPatch, name: str, fragment: str
) -> None:
    _named(monkeypatch, name)
    peak, source = peak_flops(CUDA, "bf16-mixed", None)
    assert peak == PEAK_FLOPS[fragment]["bf16"] and source.startswith(f"{fragment} bf16 dense peak")


def test_an_unknown_device_has_no_peak_and_says_how_to_give_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _named(monkeypatch, "Imaginary Accelerator 9000")
    peak, source = peak_flops(CUDA, "bf16-mixed", None)
    assert peak is None and "unknown device 'Imaginary Accelerator 9000'" in source and "pass peak_flops" in source
