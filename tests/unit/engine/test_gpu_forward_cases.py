"""The pure part of `bench.engine.gpu_forward` (the GPU run itself needs torch and a GPU): the
shards it builds are the profiles' models, and the model figures it prints next to a measured
step are exactly what the engine model charges for that step. Where torch is installed (CPU is
enough), its MoE block is also checked against a plain per-token one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.engine.gpu_forward import (
    MOE_FIELDS,
    TINY_MOE,
    Case,
    Shard,
    default_cases,
    default_targets,
    fits,
    group_by_expert,
    main,
    model_figures,
    timed_parts,
    uniform_assignment,
)
from services.sim.engine import StepTimeModel, get_profile
from services.sim.engine.profiles import GLM47_FP8, GLM47_FP8_H100X8, H100_SXM, QWEN3_32B, QWEN25_3B

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "engine" / "results"


def test_a_one_rank_shard_holds_the_whole_model_and_a_tp2_rank_half_of_it() -> None:
    for model in (QWEN3_32B, QWEN25_3B):
        assert Shard.of(model, 1).params == model.total_params
    rank = Shard.of(QWEN3_32B, 2)
    assert (rank.q_heads, rank.kv_heads, rank.intermediate, rank.vocab) == (32, 4, 12800, 75968)
    assert rank.params == pytest.approx(QWEN3_32B.total_params / 2, rel=1e-9)
    assert Shard.of(QWEN3_32B, 1).qk_norm and not Shard.of(QWEN25_3B, 1).qk_norm
    assert not rank.is_moe and rank.record() == {k: v for k, v in dataclasses.asdict(rank).items() if k not in MOE_FIELDS}
    with pytest.raises(ValueError, match="divisible"):
        Shard.of(QWEN3_32B, 3)


def test_a_tp8_rank_of_glm_holds_an_eighth_of_every_expert_and_the_whole_router() -> None:
    rank = Shard.of(GLM47_FP8, 8)
    assert (rank.q_heads, rank.kv_heads, rank.intermediate, rank.vocab) == (12, 1, 1536, 18944)
    assert (rank.dense_layers, rank.moe_layers, rank.experts, rank.top_k, rank.shared_experts) == (3, 89, 160, 8, 1)
    assert rank.expert_intermediate == 1536 // 8  # expert MLPs TP-sharded, no expert parallelism
    # The ModelSpec's parameters divided by 8, except the router, which every rank holds whole.
    router = GLM47_FP8.n_moe * GLM47_FP8.hidden_size * GLM47_FP8.num_experts
    assert rank.router_params == router
    assert rank.params == pytest.approx(GLM47_FP8.total_params / 8 + router * 7 / 8, rel=1e-12)
    assert rank.params == pytest.approx(44.16e9, rel=1e-3)  # ~44 GB of FP8 weights on one H200
    assert Shard.of(GLM47_FP8, 1).params == GLM47_FP8.total_params
    assert rank.qk_norm and rank.record() == dataclasses.asdict(rank)
    with pytest.raises(ValueError, match="divisible"):
        Shard.of(GLM47_FP8, 5)


def test_the_expert_assignment_is_the_engine_models_uniform_routing() -> None:
    experts, k = 160, 8
    one = uniform_assignment(64, experts, k, seed=1)
    assert one == uniform_assignment(64, experts, k, seed=1)  # a case always draws the same
    assert all(len(set(row)) == k and all(0 <= e < experts for e in row) for row in one)
    # step_time.py: T tokens touch E (1 - (1 - k/E)^T) of a layer's experts on average
    for tokens in (1, 4, 16, 64):
        touched = [len({e for row in uniform_assignment(tokens, experts, k, seed) for e in row}) for seed in range(300)]
        expected = experts * (1 - (1 - k / experts) ** tokens)
        assert sum(touched) / len(touched) == pytest.approx(expected, rel=0.02)


def test_grouping_orders_the_pairs_by_expert_then_token() -> None:
    assignment = [(2, 0), (1, 2), (0, 3)]
    order, counts = group_by_expert(assignment, 4)
    assert counts == [2, 1, 2, 1]
    flat = [e for row in assignment for e in row]
    assert [flat[p] for p in order] == [0, 0, 1, 2, 2, 3]
    assert order == [1, 4, 2, 0, 3, 5]  # within an expert, by token


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


def test_the_glm_rank_is_priced_as_the_engine_model_prices_its_profile_on_an_h200() -> None:
    target = {t.label: t for t in default_targets()}["glm-4.7-fp8-h200x8/tp8-rank"]
    assert target.profile.tp == 8 and target.profile.gpu.name.startswith("H200")
    assert dataclasses.replace(target.profile, name=GLM47_FP8_H100X8.name, gpu=H100_SXM) == GLM47_FP8_H100X8
    model = GLM47_FP8
    cost = StepTimeModel(target.profile)
    decode = Case("d", decode_seqs=8, decode_ctx=4096)
    fig = model_figures(target.profile, decode)
    assert fig["step_s"] == pytest.approx(cost.decode_step_time_s(8, 4096))
    assert fig["gpu_s"] == pytest.approx(fig["linear_s"] + fig["attention_s"] + fig["per_layer_s"])
    # The MoE blocks' figure: the same roofline over the routers, shared experts and the experts
    # one token touches (k of them), FP8 bytes and FP8 FLOPs, one rank's eighth.
    one = model_figures(target.profile, Case("one", decode_seqs=1, decode_ctx=10))
    params = model.n_moe * (model.hidden_size * model.num_experts
                            + (model.num_shared_experts + model.experts_per_token) * model.expert_params) / 8
    p = target.profile
    mem = params * model.weight_bytes_per_param / (p.gpu.hbm_bytes_per_s * p.bw_efficiency)
    comp = 2 * params / (p.gpu.fp8_flops * p.compute_efficiency)
    assert one["moe_s"] == pytest.approx((mem**3 + comp**3) ** (1 / 3), rel=1e-9)
    for case in default_cases():
        fig = model_figures(target.profile, case)
        assert 0 < fig["moe_s"] < fig["linear_s"]
    assert "moe_s" not in model_figures(get_profile("qwen3-32b-h100x2"), decode)
    assert [label for label, _ in timed_parts(target.shard)] == ["all", "linear", "attention", "moe"]
    assert [label for label, _ in timed_parts(Shard.of(QWEN3_32B, 2))] == ["all", "linear", "attention"]


def test_default_cases_are_steps_vllm_would_schedule_and_memory_decides_what_runs() -> None:
    for case in default_cases():
        assert 0 < case.num_tokens <= 8192  # vLLM V1's default max_num_batched_tokens
    by_label = {t.label: t for t in default_targets()}
    one_gpu = by_label["qwen3-32b-h200x1"].shard
    free = 139.8 * 1024**3 - one_gpu.params * 2
    assert not fits(one_gpu, Case("big", decode_seqs=256, decode_ctx=2048), free)  # 137 GB of KV
    assert fits(one_gpu, Case("ok", decode_seqs=32, decode_ctx=4096), free)
    glm = by_label["glm-4.7-fp8-h200x8/tp8-rank"].shard  # one KV head per rank: every case fits
    free = 139.8 * 1024**3 - glm.params * 1.0
    assert all(fits(glm, case, free) for case in default_cases())
    assert not fits(glm, Case("huge", decode_seqs=1024, decode_ctx=131072), free)


def test_unknown_targets_are_refused_before_anything_needs_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--targets", "qwen3-32b-h200x1,no-such-target"])
    assert exc.value.code == 2
    assert "no-such-target" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gpu_forward_h200.json", "gpu_forward_h200_fused.json", "gpu_forward_h200_cudnn.json",
                                  "gpu_forward_h200_glm.json"])
def test_the_kept_gpu_runs_price_their_steps_as_the_engine_model_does_today(name: str) -> None:
    # docs/simulation.md compares these measured steps with the model figures stored beside them;
    # if the step-time model or a profile changes, those figures (and the docs' tables) are stale:
    # re-run `python -m bench.engine.gpu_forward` on a GPU, or recompute the model columns.
    doc = json.loads((RESULTS / name).read_text())
    targets = {t.label: t for t in default_targets()}
    rows = 0
    for entry in doc["targets"]:
        profile = targets[entry["label"]].profile
        assert entry["shard"] == targets[entry["label"]].shard.record()
        for row in entry["rows"]:
            if "model" not in row:
                continue
            case = Case(**row["case"])
            assert model_figures(profile, case) == pytest.approx(row["model"], rel=1e-9), case.name
            assert row["measured_s"] > 0 and row["linear_s"] > 0 and row["attention_s"] > 0
            rows += 1
    assert rows >= 10


# --------------------------------------------------------------------------- with torch (CPU)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped-gemm", "gemm-per-expert"])
def test_the_moe_block_equals_a_plain_per_token_moe(fp8: bool, grouped: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from bench.engine.gpu_forward import Decoder, naive_moe, route

    if not grouped:  # the fallback the decoder takes where the grouped kernels refuse
        monkeypatch.delattr(torch, "_grouped_mm", raising=False)
        monkeypatch.delattr(torch, "_scaled_grouped_mm", raising=False)
    shard = Shard.of(TINY_MOE, 1)
    dec = Decoder(shard, "cpu", fp8=fp8)
    if fp8 and not dec.fp8:
        pytest.skip("this torch build has no FP8 GEMM on the CPU")
    layer = dec.layers[-1]
    g = torch.Generator().manual_seed(5)
    layer["router_bias"].normal_(0.0, 0.01, generator=g)
    h = torch.randn(37, shard.hidden, generator=g).to(torch.bfloat16)
    limit = 0.15 if fp8 else 0.03  # relative to the largest output: FP8 vs BF16 rounding
    for assignment in (route(torch, h, layer, shard.top_k), uniform_assignment(37, shard.experts, shard.top_k, seed=7)):
        with torch.no_grad():
            ours = dec.make_moe(37, assignment=assignment)(h, layer).float()
        ref = naive_moe(torch, h, layer, shard.top_k, assignment=assignment)
        assert float((ours - ref).abs().max() / ref.abs().max()) < limit
    paths = " ".join(sorted(dec.gemm_paths))
    assert ("FP8" if fp8 else "BF16") in paths
    if not grouped:
        assert "per expert" in paths
    elif not fp8:  # PyTorch's CPU grouped GEMM is BF16 only
        assert "torch._grouped_mm" in paths


def test_every_timed_part_of_an_moe_step_runs_on_the_cpu() -> None:
    torch = pytest.importorskip("torch")
    from bench.engine.gpu_forward import Decoder

    shard = Shard.of(TINY_MOE, 1)
    dec = Decoder(shard, "cpu")
    assert dec.weight_bytes() >= shard.params * 2  # BF16, plus the FP32 router and the norms
    mixed = Case("m", decode_seqs=3, decode_ctx=9, prefill_tokens=20, prefill_prior=5)
    for case in (mixed, Case("d", decode_seqs=2, decode_ctx=4)):
        outs = {}
        for label, parts in timed_parts(shard):
            with torch.inference_mode():
                outs[label] = dec.make_step(case, parts)()
            assert torch.isfinite(outs[label].float()).all()
        assert outs["all"].shape == (case.num_sampled, shard.vocab)


def test_the_moe_block_is_transformers_glm4_moe() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers.models.glm4_moe")
    from bench.engine.gpu_forward import check_moe

    res = check_moe("cpu")
    assert res["naive"] < 0.03 and res["transformers"] is not None and res["transformers"] < 0.03


def test_the_expert_gemm_bench_counts_the_experts_the_engine_model_reads() -> None:
    from bench.engine.gpu_forward import touched_experts
    assert touched_experts(1, 160, 8) == 8
    assert touched_experts(8192, 160, 8) == 160
    assert touched_experts(8, 160, 8) == round(160 * (1 - (1 - 8 / 160) ** 8))  # step_time.py's expected count
