"""A gloo job (2 ranks, CPU) starts from emitted settings and trains: the TP plan of the
'ficco' row as ccoverlap's ParallelStyles, and FSDP2 with the emitted ``fully_shard`` keywords
and prefetch depth; both match one process training the same model."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import emit_job  # noqa: E402  (tests/planning/emit is on sys.path under pytest's default import mode)

from ccoverlap.planning.emit import build_emit, read_emit, write_emit  # noqa: E402
from ccoverlap.runtime.launch import spawn  # noqa: E402

STEPS = 3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gloo_job_trains_with_the_emitted_tp_styles_and_fsdp_settings(example_plan, tmp_path):
    w = example_plan.workload
    ficco = example_plan.strategy("ficco")
    tp_dir = tmp_path / "ficco"
    example_plan.emit(tp_dir, strategy="ficco")
    # a decision that changes FSDP2's settings: the recommended row's knobs with a deeper prefetch
    row = example_plan.strategy("knobs+lagom")
    knobs = dict(row.knobs, fsdp_prefetch=2)
    fsdp_dir = tmp_path / "fsdp"
    write_emit(build_emit(dataclasses.replace(row, knobs=knobs), w, simulate=False), fsdp_dir)
    files = read_emit(fsdp_dir)
    assert files["framework"]["pytorch"]["fully_shard"] == {"reshard_after_forward": False}
    assert files["framework"]["pytorch"]["fsdp2_prefetch"] == {"forward": 2, "backward": 2}
    emitted = read_emit(tp_dir)["framework"]["tp_plan"]
    # FiCCO's pick per pair is the schedule of that pair's modules (qkv: wq, wk, wv; ...)
    picks = ficco.decision["tp_schedules"]
    assert emitted["layers.*.attention.wq"]["schedule"] == picks["qkv"]["schedule"]
    assert emitted["layers.*.feed_forward.w2"]["schedule"] == picks["mlp_fc2"]["schedule"]
    assert emitted["output"]["schedule"] == picks["lm_head"]["schedule"]

    res = spawn(emit_job.run_rank, 2, (str(tp_dir), str(fsdp_dir), STEPS), timeout_s=240, threads=1)
    ref = emit_job.reference(STEPS)
    for r in res:
        # the styles the job built carry the emitted schedules
        assert {m: v for m, v in r["tp_schedules"].items() if "schedule" in emitted[m]} == \
            {m: e["schedule"] for m, e in emitted.items() if "schedule" in e}
        assert r["tp_losses"] == pytest.approx(ref, rel=1e-4, abs=1e-5)
        assert r["fully_shard_kwargs"] == {"reshard_after_forward": False}
        assert r["prefetch"] == 2
        assert r["fsdp_losses"] == pytest.approx(ref, rel=1e-4, abs=1e-5)
