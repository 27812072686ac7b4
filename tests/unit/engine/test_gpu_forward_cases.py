"""The pure part of `bench.engine.gpu_forward` (the GPU run itself needs torch and a GPU): the
shards it builds are the profiles' models, and the model figures it prints next to a measured
step are exactly what the engine model charges for that step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.engine.gpu_forward import Case, Shard, default_cases, default_targets, fits, main, model_figures
from services.sim.engine import StepTimeModel, get_profile
from services.sim.engine.profiles import GLM47_FP8, QWEN3_32B, QWEN25_3B

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "engine" / "results"


def test_a_one_rank_shard_holds_the_whole_model_and_a_tp2_rank_half_of_it() -> None:
    for model in (QWEN3_32B, QWEN25_3B):
        assert Shard.of(model, 1).params == model.total_params
    rank = Shard.of(QWEN3_32B, 2)
    assert (rank.q_heads, rank.kv_heads, rank.intermediate, rank.vocab) == (32, 4, 12800, 75968)
    assert rank.params == pytest.approx(QWEN3_32B.total_params / 2, rel=1e-9)
    assert Shard.of(QWEN3_32B, 1).qk_norm and not Shard.of(QWEN25_3B, 1).qk_norm
    with pytest.raises(ValueError, match="MoE"):
        Shard.of(GLM47_FP8, 8)


def test_case_accounting_is_the_engine_models() -> None:
    profile = get_profile("qwen3-32b-h100x2")
    cost = StepTimeModel(profile)
    decode = Case("d", decode_seqs=32, decode_ctx=4096)
    assert model_figures(profile, decode)["step_s"] == pytest.approx(cost.decode_step_time_s(32, 4096))
    chunk = Case("p", prefill_tokens=2048, prefill_prior=16384)
    assert chunk.attn_pairs == 2048 * 16384 + 2048 * 2049 / 2
    assert chunk.kv_tokens_read == 16384 + 2048
    mixed = Case("m", decode_seqs=64, decode_ctx=2048, prefill_tokens=8128)
    assert (mixed.num_tokens, mixed.num_seqs, mixed.num_sampled) == (8192, 65, 65)
    fig = model_figures(profile, mixed)
    cpu = profile.step_overhead_s + profile.per_seq_overhead_s * mixed.num_seqs
    assert fig["gpu_s"] + fig["allreduce_s"] + cpu == pytest.approx(fig["step_s"])
    assert fig["gpu_s"] == pytest.approx(fig["linear_s"] + fig["attention_s"] + fig["per_layer_s"])


def test_default_cases_are_steps_vllm_would_schedule_and_memory_decides_what_runs() -> None:
    for case in default_cases():
        assert 0 < case.num_tokens <= 8192  # vLLM V1's default max_num_batched_tokens
    by_label = {t.label: t for t in default_targets()}
    one_gpu = by_label["qwen3-32b-h200x1"].shard
    free = 139.8 * 1024**3 - one_gpu.params * 2
    assert not fits(one_gpu, Case("big", decode_seqs=256, decode_ctx=2048), free)  # 137 GB of KV
    assert fits(one_gpu, Case("ok", decode_seqs=32, decode_ctx=4096), free)


def test_unknown_targets_are_refused_before_anything_needs_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--targets", "qwen3-32b-h200x1,no-such-target"])
    assert exc.value.code == 2
    assert "no-such-target" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gpu_forward_h200.json", "gpu_forward_h200_fused.json", "gpu_forward_h200_cudnn.json"])
def test_the_kept_gpu_runs_price_their_steps_as_the_engine_model_does_today(name: str) -> None:
    # docs/simulation.md compares these measured steps with the model figures stored beside them;
    # if the step-time model or a profile changes, those figures (and the docs' tables) are stale:
    # re-run `python -m bench.engine.gpu_forward` on a GPU, or recompute the model columns.
    doc = json.loads((RESULTS / name).read_text())
    targets = {t.label: t for t in default_targets()}
    rows = 0
    for entry in doc["targets"]:
        profile = targets[entry["label"]].profile
        assert entry["shard"] == dataclasses.asdict(targets[entry["label"]].shard)
        for row in entry["rows"]:
            if "model" not in row:
                continue
            case = Case(**row["case"])
            assert model_figures(profile, case) == pytest.approx(row["model"], rel=1e-9), case.name
            assert row["measured_s"] > 0 and row["linear_s"] > 0 and row["attention_s"] > 0
            rows += 1
    assert rows >= 10
