"""A CUDA build's start-up report (app/engine/cuda_check.py) reaches the operator without a shell:
/props carries it whole, and /health carries its problems as warnings beside the others. The
report itself is tested against stand-in NVIDIA libraries in tests/unit/test_cuda_check.py."""

from __future__ import annotations

import dataclasses

from app.engine import cuda_check
from app.engine.fake import FakeEngine
from tests.support.app import make_client


def engine_with(report: cuda_check.CudaReport | None, **kwargs) -> FakeEngine:
    engine = FakeEngine(**kwargs)
    cuda = report.as_dict() if report is not None else None
    engine._info = dataclasses.replace(engine._info, cuda=cuda)
    return engine


def test_a_gpu_the_build_cannot_use_is_a_health_warning_and_in_props():
    old_driver = cuda_check.CudaReport(
        driver="470.256.02", driver_cuda=(11, 4), runtime=(12, 9), archs=[800, 890, 900, 1200],
        gpus=[cuda_check.Gpu(0, "NVIDIA L4", (8, 9), 23 * 2**30)])
    client = make_client(engine_with(old_driver, n_ctx=512, n_ctx_train=256))
    health = client.get("/health")
    assert health.status_code == 200  # it serves, on the CPU: said, not hidden
    warnings = health.get_json()["warnings"]
    assert len(warnings) == 2
    assert "trained for (256)" in warnings[0]
    assert warnings[1] == old_driver.problems()[0] and "older than this build's CUDA" in warnings[1]
    cuda = client.get("/props").get_json()["cuda"]
    assert cuda == old_driver.as_dict()
    assert cuda["driver"] == "470.256.02" and cuda["problems"] == [warnings[1]]


def test_a_sound_gpu_host_and_a_cpu_build_warn_nothing():
    sound = cuda_check.CudaReport(
        driver="535.216.01", driver_cuda=(12, 2), runtime=(12, 9), archs=[800, 890, 900, 1200],
        gpus=[cuda_check.Gpu(0, "NVIDIA L4", (8, 9), 23 * 2**30)])
    assert sound.problems() == []
    client = make_client(engine_with(sound))
    assert "warnings" not in client.get("/health").get_json()
    assert client.get("/props").get_json()["cuda"]["gpus"][0]["name"] == "NVIDIA L4"
    cpu = make_client(engine_with(None))
    assert "warnings" not in cpu.get("/health").get_json()
    assert cpu.get("/props").get_json()["cuda"] is None
