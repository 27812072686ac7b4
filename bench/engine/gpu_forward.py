"""`python -m bench.engine.gpu_forward [--targets ...] [--out FILE]`: real forward passes of the
engine profiles' model shapes on the local GPU, next to the engine model's step times.

The engine model (`services/sim/engine/step_time.py`) prices one vLLM step with a per-component
roofline whose efficiencies were fitted to published points (Vidur's CodeLlama-34B/H100 linear
layers, a 32B decode floor, a ShareGPT throughput run). This benchmark checks those constants
against the GPU itself: it builds each model's decoder (the shapes of `ModelSpec`, random BF16
or FP8 weights), times one step of the batches the scheduler forms (pure decode, prefill chunks
with and without a cached prefix, a mixed chunked-prefill step) and prints the time next to the
model's.

How a step runs, and why (each choice mirrors vLLM V1 on a Hopper GPU):
- Fused QKV and gate/up projections (vLLM's `QKVParallelLinear`, `MergedColumnParallelLinear`),
  RMSNorm, rotary embedding, Qwen3's per-head q/k norm, SwiGLU; logits only for the positions that
  sample (vLLM's `LogitsProcessor` on the last token of each sequence).
- The whole step is captured in one CUDA graph and replayed (vLLM V1 runs steps as CUDA graphs),
  so the time is GPU time, without the launch gaps of eager PyTorch.
- Attention is PyTorch's SDPA (FlashAttention-2 on Hopper) over a contiguous per-sequence KV
  cache. vLLM reads a paged cache with FlashAttention-3/FlashInfer; contiguous KV is, if anything,
  slightly kinder to the kernel.
- Tensor parallelism: a `tp`-way profile is measured as one rank's shard (heads, MLP width and
  vocabulary divided by `tp`) on this one GPU; the all-reduces between ranks are not measured and
  are left out of the model figure it is compared with.
- Mixture-of-experts layers (GLM-4.7) follow the engine model's approximations: every expert's MLP
  width is split across the ranks (vLLM's default TP sharding of `FusedMoE`, no expert
  parallelism), and tokens choose their experts uniformly. Per MoE layer a step runs the router
  GEMM (FP32, as vLLM's and transformers' GLM-4 MoE), sigmoid scores and top-k, a gather of the
  tokens grouped by expert, one grouped GEMM for every expert's gate/up projection, SiLU-and-mul,
  one grouped GEMM for the down projections (or, where the kernels refuse, one GEMM per expert),
  the weighted combine, and the shared expert; the whole block is also timed alone. So that
  the step can be captured in a CUDA graph, which expert serves which token is drawn at build time
  (`uniform_assignment`: each token k distinct experts, uniformly, as the model assumes); the top-k
  still runs on the device each step, and the combine weights are the router's scores at the drawn
  experts. vLLM's `fused_moe` also groups on the device (`moe_align_block_size`); that sort, a few
  small kernels per layer, is the one piece left out.
- FP8 profiles (`use_fp8_compute`) run their GEMMs in FP8 with `torch._scaled_mm` (dense layers) and
  `torch._scaled_grouped_mm` (experts): e4m3 weights with a per-tensor scale, activations quantised
  per tensor on the fly (vLLM's dynamic per-tensor FP8 W8A8), a quantisation timed with the GEMMs
  as vLLM's `Fp8LinearMethod` runs it inside the layer. The embedding and LM head stay BF16, as
  the profile's weight bytes count them, and the router FP32. `--no-fp8`, or a GPU without FP8
  GEMMs, runs BF16; the GEMM paths that ran are recorded (`gemm_paths`), as the attention kernels
  are.

Not a dependency of the package: it needs `torch` with CUDA (and `transformers` for the
cross-check), which the GPU machine has. The pure part (cases, shard shapes, the model's figures)
imports neither and is unit-tested.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from services.sim.engine.profiles import (
    GLM47_FP8_H100X8,
    H200_SXM,
    QWEN3_32B_H100X2,
    QWEN25_3B_H200,
    ModelSpec,
    Profile,
)
from services.sim.engine.step_time import StepTimeModel

# Models whose attention normalises q and k per head (HF Qwen3Attention's q_norm/k_norm; GLM-4.5/4.7
# too: the `ModelSpec` comment counts its QK-norm params as negligible). Qwen2.5 and GLM have biases
# on q/k/v (HF Qwen2Attention, GLM's `attention_bias`) and GLM rotates half of each head
# (`partial_rotary_factor` 0.5): elementwise work next to the GEMMs, left out.
QK_NORM_MODELS = frozenset({"Qwen3-32B", "GLM-4.7-FP8"})
# GLM-4.x routing (transformers' Glm4MoeTopkRouter; the GLM-4.5 config.json: sigmoid scores,
# one expert group, top-k weights renormalised then scaled by routed_scaling_factor 2.5).
ROUTED_SCALING = 2.5
FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass(frozen=True, slots=True)
class Case:
    """One engine step: ``decode_seqs`` sequences decoding one token at ``decode_ctx`` tokens of
    context each, plus (optionally) one prefill chunk of ``prefill_tokens`` new tokens after
    ``prefill_prior`` cached ones. The chunk is its prompt's last, so it samples one token."""

    name: str
    decode_seqs: int = 0
    decode_ctx: int = 0
    prefill_tokens: int = 0
    prefill_prior: int = 0

    @property
    def num_tokens(self) -> int:
        return self.decode_seqs + self.prefill_tokens

    @property
    def num_seqs(self) -> int:
        return self.decode_seqs + (1 if self.prefill_tokens else 0)

    @property
    def num_sampled(self) -> int:
        return self.num_seqs

    @property
    def kv_tokens_read(self) -> int:
        decode = self.decode_seqs * (self.decode_ctx + 1)
        return decode + (self.prefill_prior + self.prefill_tokens if self.prefill_tokens else 0)

    @property
    def attn_pairs(self) -> float:
        n, p = self.prefill_tokens, self.prefill_prior
        return float(self.decode_seqs * (self.decode_ctx + 1) + n * p + n * (n + 1) / 2)


def default_cases() -> list[Case]:
    """Decode batches from 1 to 256 sequences at short to long contexts, prefill chunks up to the
    default token budget (8192) with and without a cached prefix, and a mixed chunked-prefill step
    (the 64 decodes plus a chunk that fills the rest of the budget, as vLLM V1 batches them)."""
    cases = [Case(f"decode b={b} ctx={c}", decode_seqs=b, decode_ctx=c)
             for b, c in ((1, 1024), (1, 8192), (1, 32768), (8, 1024), (8, 8192), (32, 1024),
                          (32, 4096), (64, 2048), (128, 1024), (256, 512), (256, 2048))]
    cases += [Case(f"prefill n={n}", prefill_tokens=n) for n in (128, 512, 2048, 8192)]
    cases += [Case(f"prefill n={n} after {p}", prefill_tokens=n, prefill_prior=p)
              for n, p in ((2048, 16384), (8192, 24576))]
    cases.append(Case("mixed 64 decodes ctx=2048 + prefill n=8128", decode_seqs=64, decode_ctx=2048,
                      prefill_tokens=8192 - 64))
    return cases


MOE_FIELDS = frozenset({"moe_layers", "experts", "top_k", "shared_experts", "expert_intermediate"})


@dataclass(frozen=True, slots=True)
class Shard:
    """The tensors one tensor-parallel rank holds (vLLM's column/row-parallel split).

    An MoE model's last ``moe_layers`` layers replace the MLP with ``experts`` routed experts (each
    token uses ``top_k``) plus ``shared_experts`` that every token uses. Every expert's MLP width
    is split across the ranks (``expert_intermediate`` per rank; vLLM's `FusedMoE` without expert
    parallelism) and every rank holds the whole router (vLLM's GLM-4 MoE gate is a plain FP32
    `nn.Linear`, vllm/model_executor/models/glm4_moe.py); the engine model's `ModelSpec` divides
    the router by ``tp`` with the rest, 0.1 % of the rank's parameters."""

    num_layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    qk_norm: bool
    moe_layers: int = 0
    experts: int = 0
    top_k: int = 0
    shared_experts: int = 0
    expert_intermediate: int = 0

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> Shard:
        if model.num_q_heads % tp or model.intermediate_size % tp or model.moe_intermediate_size % tp:
            raise ValueError(f"{model.name}: heads or MLP width not divisible by tp={tp}")
        shard = cls(model.num_layers, model.hidden_size, model.num_q_heads // tp,
                    max(1, model.num_kv_heads // tp), model.head_dim, model.intermediate_size // tp,
                    -(-model.vocab_size // tp), model.tie_embeddings, model.name in QK_NORM_MODELS)
        if not model.is_moe:
            return shard
        return dataclasses.replace(shard, moe_layers=model.n_moe, experts=model.num_experts,
                                   top_k=model.experts_per_token, shared_experts=model.num_shared_experts,
                                   expert_intermediate=model.moe_intermediate_size // tp)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def router_params(self) -> int:
        return self.moe_layers * self.hidden * self.experts

    @property
    def params(self) -> int:
        attn = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim + self.q_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        experts = self.moe_layers * (self.experts + self.shared_experts) * 3 * self.hidden * self.expert_intermediate
        emb = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.num_layers * attn + self.dense_layers * mlp + self.router_params + experts + emb

    def kv_bytes(self, tokens: int) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * 2 * tokens  # K and V, BF16

    def record(self) -> dict[str, Any]:
        """The shard as a results file keeps it (a dense shard without the MoE fields, all zero)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if self.is_moe or k not in MOE_FIELDS}


def uniform_assignment(num_tokens: int, experts: int, top_k: int, seed: int = 0) -> list[tuple[int, ...]]:
    """The experts each token uses: ``top_k`` distinct ones drawn uniformly, independently per token.
    That is the engine model's routing assumption (step_time.py: T tokens touch
    ``E * (1 - (1 - k/E)^T)`` of a layer's E experts). Seeded, so a case always draws the same."""
    rng = random.Random(seed)
    return [tuple(rng.sample(range(experts), top_k)) for _ in range(num_tokens)]


def group_by_expert(assignment: Sequence[Sequence[int]], experts: int) -> tuple[list[int], list[int]]:
    """The (token, slot) pairs of ``assignment``, numbered token-major (``token * k + slot``), in the
    order a grouped GEMM reads them (by expert, then token), and how many pairs each expert got."""
    flat = [e for row in assignment for e in row]
    order = sorted(range(len(flat)), key=flat.__getitem__)  # stable: by token within an expert
    counts = [0] * experts
    for e in flat:
        counts[e] += 1
    return order, counts


@dataclass(frozen=True, slots=True)
class Target:
    """A profile to measure, and the shard of it this GPU runs."""

    label: str
    profile: Profile

    @property
    def shard(self) -> Shard:
        return Shard.of(self.profile.model, self.profile.tp)


def default_targets() -> list[Target]:
    """Profiles of which one rank fits one H200. The engine model is priced on the GPU it runs on,
    so the H100 profiles use the H200's figures (same tensor cores as the H100, 4.8 vs 3.35 TB/s
    HBM) with the efficiencies of the shipped profiles unchanged: those efficiencies are what is
    checked. ``qwen3-32b/tp2-rank`` is one rank of the TAO paper's TP=2 deployment,
    ``glm-4.7-fp8-h200x8/tp8-rank`` one rank of its GLM-4.7-FP8 TP=8 node (~44 GB of FP8 weights)."""
    return [
        Target("qwen2.5-3b-h200", QWEN25_3B_H200),
        Target("qwen3-32b-h200x1", dataclasses.replace(QWEN3_32B_H100X2, name="qwen3-32b-h200x1", gpu=H200_SXM, tp=1)),
        Target("qwen3-32b-h200x2/tp2-rank", dataclasses.replace(QWEN3_32B_H100X2, name="qwen3-32b-h200x2", gpu=H200_SXM)),
        Target("glm-4.7-fp8-h200x8/tp8-rank", dataclasses.replace(GLM47_FP8_H100X8, name="glm-4.7-fp8-h200x8", gpu=H200_SXM)),
    ]


def moe_only(profile: Profile) -> Profile:
    """``profile`` with everything but its MoE blocks taken out of the model (no attention, no dense
    MLP, no vocabulary): the engine model's linear-layer roofline of this profile then prices just
    the routers, shared experts and the routed experts a step touches."""
    m = profile.model
    blocks = dataclasses.replace(m, num_layers=m.n_moe, num_dense_layers=0, num_q_heads=0, num_kv_heads=0,
                                 vocab_size=0)
    return dataclasses.replace(profile, model=blocks)


def model_figures(profile: Profile, case: Case) -> dict[str, float]:
    """The engine model's time for ``case`` on ``profile``, by component, in seconds.

    ``gpu_s`` is what a CUDA-graph replay of the forward pass is compared with: linear layers,
    attention and the per-layer floor of small kernels. ``step_s`` is the full step the engine
    model charges, which adds the all-reduces (not measured on one GPU), the per-step CPU
    overhead (scheduler, input preparation) and the per-sequence overhead (bookkeeping, sampler).
    For an MoE model, ``moe_s`` is the same linear roofline over the MoE blocks' weights and FLOPs
    alone (`moe_only`): part of ``linear_s``, not a term of its own (the model has none)."""
    m = StepTimeModel(profile)
    linear = m.linear_time_s(case.num_tokens, case.num_sampled)
    attention = m.attention_time_s(case.kv_tokens_read, case.attn_pairs)
    per_layer = profile.per_layer_overhead_s * profile.model.num_layers
    step = m.step_time_s(case.num_tokens, case.num_seqs, case.num_sampled, case.kv_tokens_read, case.attn_pairs)
    fig = {"linear_s": linear, "attention_s": attention, "per_layer_s": per_layer,
           "gpu_s": linear + attention + per_layer, "allreduce_s": m.allreduce_time_s(case.num_tokens),
           "step_s": step}
    if profile.model.is_moe:
        fig["moe_s"] = StepTimeModel(moe_only(profile)).linear_time_s(case.num_tokens, 0)
    return fig


def fits(shard: Shard, case: Case, free_bytes: float) -> bool:
    """Whether the case's KV cache and activations fit in the GPU memory left (20 % headroom)."""
    act = case.num_tokens * (shard.hidden * 8 + 2 * shard.intermediate * 3 + (shard.q_heads + 2 * shard.kv_heads) * shard.head_dim * 4)
    # MoE: per (token, expert) pair the gathered input and its FP8 copy, the expert outputs and
    # their reordered copy; the gate/up output and its activation
    act += case.num_tokens * shard.top_k * (shard.hidden * 7 + shard.expert_intermediate * 8)
    need = shard.kv_bytes(case.kv_tokens_read) + act + case.num_sampled * shard.vocab * 4  # the KV it reads is resident
    return need * 1.2 < free_bytes


# --------------------------------------------------------------------------- torch part (GPU only)


def _torch() -> Any:
    import torch  # optional: only the GPU machine has it

    return torch


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    """A weight [..., out, in] in float8_e4m3fn, ``w ~= q * scale`` with one float32 ``scale``
    (0-d) per tensor; ``scale_out`` is that scale repeated per output channel ([..., out]), the
    form `torch._scaled_grouped_mm` takes."""

    q: Any
    scale: Any
    scale_out: Any

    @property
    def shape(self) -> Any:
        return self.q.shape

    def experts(self, first: int, last: int) -> Fp8Weight:
        """Experts ``first`` to ``last`` − 1 of a [E, out, in] weight, side by side as one
        [n·out, in] weight (views: the same bytes)."""
        return Fp8Weight(self.q[first:last].reshape(-1, self.q.shape[-1]), self.scale,
                         self.scale_out[first:last].reshape(-1))


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One step's token-to-expert grouping, as device tensors: ``slots`` [T, k] the expert of each
    (token, slot); ``rows`` [T*k] the token each grouped row reads; ``unsort`` [T*k] where each
    (token, slot) pair, token-major, sits among the grouped rows; ``offs`` [E] int32, the end of
    each expert's rows (a grouped GEMM's offsets); ``counts`` the same group sizes on the host."""

    slots: Any
    rows: Any
    unsort: Any
    offs: Any
    counts: tuple[int, ...]


def _quantize_fp8(torch: Any, w: Any) -> Fp8Weight:
    """``w`` in float8_e4m3fn with one per-tensor scale (its largest magnitude maps to 448)."""
    scale = (w.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    q = (w.float() / scale).to(torch.float8_e4m3fn)
    return Fp8Weight(q, scale, scale.expand(*w.shape[:-1]).contiguous())


def _quantize_act(torch: Any, x: Any) -> tuple[Any, Any]:
    """Dynamic per-tensor FP8 quantisation of an activation, as vLLM's `scaled_fp8_quant` without a
    static scale: the largest magnitude maps to 448, in few kernels (one reduction, two on the
    scalar, one divide, one cast). BF16 rounding can put a value a step above 448; c10's
    float-to-e4m3fn cast rounds anything below 464 to 448, so no clamp is needed. (An all-zero
    activation would give a zero scale: none occurs here.)"""
    scale = torch.linalg.vector_norm(x, float("inf")).float() / FP8_MAX
    return (x / scale).to(torch.float8_e4m3fn), scale


def _fp8_refusal(torch: Any, device: str) -> str | None:
    """Why FP8 GEMMs cannot run on ``device`` (None when a small `torch._scaled_mm` runs)."""
    try:
        a = torch.ones(16, 32, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, ValueError, TypeError, AttributeError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return None


def _nbytes(t: Any) -> int:
    if isinstance(t, Fp8Weight):
        return int(t.q.numel() * t.q.element_size() + t.scale_out.numel() * 4 + 4)
    return int(t.numel() * t.element_size())


class Decoder:
    """Random weights of one shard (BF16, or FP8 where ``fp8`` and the GPU allows) and a forward
    pass for one ``Case``."""

    def __init__(self, shard: Shard, device: str, seed: int = 0, fused: bool = False,
                 attention: str = "flash", fp8: bool = False) -> None:
        torch = _torch()
        self.torch = torch
        self.fused = fused
        self.attention = attention
        self._paths = self._path_list()
        self.s = shard
        self.device = device
        self.attn_paths: set[str] = set()
        self.gemm_paths: set[str] = set()
        self._chosen: dict[str, int] = {}
        refused = _fp8_refusal(torch, device) if fp8 else None
        self.fp8 = fp8 and refused is None
        self.gemm_paths.add("linear: " + ("FP8 torch._scaled_mm, per-tensor scales" if self.fp8 else
                                          "BF16 matmul" + (f" (FP8 refused: {refused})" if refused else "")))
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*shape: int) -> Any:
            t = torch.empty(*shape, dtype=torch.bfloat16, device=device)
            return t.normal_(0.0, 0.02, generator=g)

        def lin(*shape: int) -> Any:  # a GEMM weight: FP8 when this decoder runs FP8 GEMMs
            return _quantize_fp8(torch, w(*shape)) if self.fp8 else w(*shape)

        def ones(n: int) -> Any:
            return torch.ones(n, dtype=torch.bfloat16, device=device)

        s = shard
        qkv_out = (s.q_heads + 2 * s.kv_heads) * s.head_dim
        self.layers: list[dict[str, Any]] = []
        for i in range(s.num_layers):
            layer = {"ln1": ones(s.hidden), "qkv": lin(qkv_out, s.hidden), "o": lin(s.hidden, s.q_heads * s.head_dim),
                     "ln2": ones(s.hidden)}
            if i < s.dense_layers:
                layer |= {"gate_up": lin(2 * s.intermediate, s.hidden), "down": lin(s.hidden, s.intermediate)}
            else:
                ei, si = s.expert_intermediate, s.shared_experts * s.expert_intermediate
                router = torch.empty(s.experts, s.hidden, dtype=torch.float32, device=device)
                layer |= {"router": router.normal_(0.0, 0.02, generator=g),
                          "router_bias": torch.zeros(s.experts, dtype=torch.float32, device=device),
                          "experts_gate_up": lin(s.experts, 2 * ei, s.hidden), "experts_down": lin(s.experts, s.hidden, ei),
                          "shared_gate_up": lin(2 * si, s.hidden), "shared_down": lin(s.hidden, si)}
            if s.qk_norm:
                layer["q_norm"] = ones(s.head_dim)
                layer["k_norm"] = ones(s.head_dim)
            self.layers.append(layer)
        self.embed = w(s.vocab, s.hidden)
        self.lm_head = self.embed if s.tie_embeddings else w(s.vocab, s.hidden)
        self.final_ln = ones(s.hidden)

    def weight_bytes(self) -> int:
        """Bytes of the weights built (FP8 ones at one byte a parameter)."""
        tensors = [t for L in self.layers for t in L.values()] + [self.embed, self.final_ln]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        return sum(_nbytes(t) for t in tensors)

    # -- GEMMs -------------------------------------------------------------------------------

    def _mm(self, x: Any, w: Any) -> Any:
        """``x @ w.T`` for a linear layer's weight [out, in]: BF16, or FP8 with the activation
        quantised per tensor on the fly."""
        return self._gemm(*self._quantised(x, w), w)

    def _quantised(self, x: Any, w: Any) -> tuple[Any, Any]:
        """The activation as a GEMM with ``w`` takes it: with its per-tensor FP8 scale for an FP8
        weight, else as it is (no scale)."""
        return _quantize_act(self.torch, x) if isinstance(w, Fp8Weight) else (x, None)

    def _gemm(self, xq: Any, xs: Any, w: Any) -> Any:
        """``xq @ w.T`` on an activation already in ``w``'s form (`_quantised`)."""
        if not isinstance(w, Fp8Weight):
            return xq @ w.t()
        return self.torch._scaled_mm(xq, w.q.t(), scale_a=xs, scale_b=w.scale, out_dtype=self.torch.bfloat16)

    def _grouped_gemm(self, xq: Any, xs: Any, w: Any, d: Dispatch) -> Any:
        """Every expert's GEMM on its rows of ``xq`` (already in ``w``'s form) as one grouped GEMM."""
        torch = self.torch
        if not isinstance(w, Fp8Weight):
            return torch._grouped_mm(xq, w.transpose(1, 2), offs=d.offs)
        return torch._scaled_grouped_mm(xq, w.q.transpose(1, 2), xs.expand(xq.shape[0]).contiguous(), w.scale_out,
                                        offs=d.offs, out_dtype=torch.bfloat16)

    def _experts_mm(self, key: str, x: Any, w: Any, d: Dispatch) -> Any:
        """Every expert's GEMM on its rows of ``x`` (grouped by expert as ``d`` says) with its
        weight in ``w`` [E, out, in]: one grouped GEMM where the kernels take it, else one GEMM
        per expert that has rows; the first that runs is kept, as for attention."""
        fp8 = isinstance(w, Fp8Weight)
        grouped = "_scaled_grouped_mm" if fp8 else "_grouped_mm"
        attempts: list[tuple[str, Callable[[], Any]]] = []
        if hasattr(self.torch, grouped):
            attempts.append((f"{'FP8' if fp8 else 'BF16'} torch.{grouped}",
                             lambda: self._grouped_gemm(*self._quantised(x, w), w, d)))
        attempts.append(("FP8 torch._scaled_mm per expert" if fp8 else "BF16 matmul per expert",
                         functools.partial(self._per_expert, x, w, d)))
        return self._first_that_runs(f"experts {key}", attempts, self.gemm_paths)

    def _per_expert(self, x: Any, w: Any, d: Dispatch) -> Any:
        """One GEMM per expert with rows (group sizes known on the host: capture-safe, slow)."""
        xq, xs = self._quantised(x, w)
        outs, start = [], 0
        for e, n in enumerate(d.counts):
            if n:
                we = w.experts(e, e + 1) if isinstance(w, Fp8Weight) else w[e]
                outs.append(self._gemm(xq[start: start + n], xs, we))
            start += n
        return self.torch.cat(outs, 0)

    # -- attention ---------------------------------------------------------------------------

    def _first_that_runs(self, key: str, attempts: Sequence[tuple[str, Callable[[], Any]]],
                         into: set[str] | None = None) -> Any:
        """Run the first of ``attempts`` (label, call) that the kernels accept, and keep it for
        ``key``: later calls (a CUDA-graph capture among them) run only that one, so a capture
        never meets a refusal. The kept path is reported in ``into`` (with the last refusal before
        it) or, unless said, in ``attn_paths``.
        PyTorch refuses with RuntimeError (NotImplementedError among them) or, for argument checks
        such as `_scaled_grouped_mm`'s, ValueError."""
        chosen = self._chosen.get(key)
        order = [chosen] if chosen is not None else range(len(attempts))
        err: Exception | None = None
        for i in order:
            label, call = attempts[i]
            try:
                out = call()
            except (RuntimeError, ValueError) as exc:
                err = exc
                continue
            if chosen is None:
                self._chosen[key] = i
                if into is None:
                    self.attn_paths.add(f"{key}: {label}")
                else:  # with why the paths before it were refused
                    why = f" (refused before: {type(err).__name__}: {str(err).splitlines()[0][:160]})" if err else ""
                    into.add(f"{key}: {label}{why}")
            return out
        raise RuntimeError(f"no kernel path ran for {key}: {err}")

    def _sdpa(self, q: Any, k: Any, v: Any, *, prior: int) -> Any:
        """Causal attention of q [1, Hq, n, D] against k/v [1, Hkv, prior + n, D], the query block
        at the end of the keys (bottom-right). The chosen kernel family with native GQA first, then
        with KV expanded per query head, then the other fallbacks (``_path_list``)."""
        attempts = [(f"{'/'.join(names)}, {mask} mask, {'native GQA' if gqa else 'KV expanded'}",
                     functools.partial(self._sdpa_path, i, q, k, v, prior))
                    for i, (names, gqa, mask) in enumerate(self._paths)]
        return self._first_that_runs("prefix" if prior else "fresh", attempts)

    def _path_list(self) -> list[tuple[tuple[str, ...], bool, str]]:
        """(SDPA backends, native GQA, mask kind) in the order tried."""
        flash = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION")
        first = [("CUDNN_ATTENTION",)] if self.attention == "cudnn" else []
        out = [(b, gqa, "causal") for b in (*first, flash) for gqa in (True, False)]
        return out + [(("EFFICIENT_ATTENTION", "MATH"), gqa, "bool") for gqa in (True, False)]

    def _sdpa_path(self, path: int, q: Any, k: Any, v: Any, prior: int) -> Any:
        torch = self.torch
        F = torch.nn.functional
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        names, gqa, mask_kind = self._paths[path]
        backends = [getattr(SDPBackend, n) for n in names]
        group = q.shape[1] // k.shape[1]
        if not gqa and group > 1:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        n, total = q.shape[2], k.shape[2]
        native = gqa and group > 1
        with sdpa_kernel(backends):
            if mask_kind == "causal":
                if prior == 0:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=native)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, total),
                                                      enable_gqa=native)
            mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(total - n)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=native)

    def _decode_attention(self, q: Any, kc: Any, vc: Any) -> Any:
        """Decode: q [B, Hq, D] against the whole cache [B, Hkv, T, D]. The query heads that share
        a KV head are stacked as the query length (non-causal), the usual GQA decode layout."""
        torch = self.torch
        F = torch.nn.functional
        from torch.nn.attention import SDPBackend, sdpa_kernel

        b, hkv, d = kc.shape[0], kc.shape[1], kc.shape[3]
        qg = q.reshape(b, hkv, -1, d)
        backends = ([("cudnn", [SDPBackend.CUDNN_ATTENTION])] if self.attention == "cudnn" else []) + [
            ("flash", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])]

        def attend(kernels: list[Any]) -> Any:
            with sdpa_kernel(kernels):
                return F.scaled_dot_product_attention(qg, kc, vc)

        out = self._first_that_runs("decode", [(f"{name} (heads as queries)", functools.partial(attend, kernels))
                                               for name, kernels in backends])
        return out.reshape(b, -1)

    # -- one step ----------------------------------------------------------------------------

    PARTS = frozenset({"linear", "attention", "other"})

    def _elementwise(self) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
        """The non-GEMM pieces of a layer: residual add + RMSNorm, q/k norm + rotary, SiLU-and-mul.
        Plain PyTorch runs each as several kernels; ``fused`` compiles each into one Triton kernel
        with ``torch.compile`` (vLLM's ``fused_add_rms_norm``, rotary and ``silu_and_mul`` custom
        ops, and its own torch.compile pass, do the same)."""
        torch = self.torch
        F = torch.nn.functional
        s, eps, d = self.s, 1e-6, self.s.head_dim

        def add_norm(x: Any, r: Any, w: Any) -> tuple[Any, Any]:
            y = x + r
            return y, F.rms_norm(y, (s.hidden,), w, eps)

        def qk_rope(q: Any, k: Any, qn: Any, kn: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
            if qn is not None:
                q = F.rms_norm(q, (d,), qn, eps)
                k = F.rms_norm(k, (d,), kn, eps)

            def rot(x: Any) -> Any:
                return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin

            return rot(q), rot(k)

        def silu_mul(gu: Any) -> Any:  # gate and up halves of the last dimension
            half = gu.shape[-1] // 2
            return F.silu(gu[:, :half]) * gu[:, half:]

        if not self.fused:
            return add_norm, qk_rope, silu_mul
        c = torch.compile
        return c(add_norm, dynamic=True), c(qk_rope, dynamic=True), c(silu_mul, dynamic=True)

    def make_step(self, case: Case, parts: frozenset[str] = PARTS, ids: Any = None,
                  assignment: Sequence[Sequence[int]] | None = None) -> Callable[[], Any]:
        """Allocate the case's inputs and KV cache; return a function running one forward step.

        ``parts`` leaves components out so that each can be timed alone: ``linear`` (every GEMM,
        the LM head, routers and experts included), ``attention`` (KV-cache write and attention)
        and ``other`` (embedding, norms, rotary, activation, residual adds, routing, grouping and
        combining). ``moe`` runs an MoE model's MoE blocks whole, GEMMs and the rest (`make_moe`).
        A part left out takes its output from a preallocated tensor of the right shape, so the
        others see the same shapes. ``assignment`` fixes the experts of each token (default: a
        `uniform_assignment`)."""
        torch = self.torch
        s, dev = self.s, self.device
        lin, att, misc = "linear" in parts, "attention" in parts, "other" in parts
        b, ctx, n, p = case.decode_seqs, case.decode_ctx, case.prefill_tokens, case.prefill_prior
        t = case.num_tokens
        if ids is None:
            ids = torch.randint(0, s.vocab, (t,), device=dev)
        pos = torch.cat([torch.full((b,), ctx, device=dev, dtype=torch.long),
                         torch.arange(p, p + n, device=dev, dtype=torch.long)])
        inv = 1.0 / (1_000_000.0 ** (torch.arange(0, s.head_dim, 2, device=dev, dtype=torch.float32) / s.head_dim))
        freqs = pos.float()[:, None] * inv[None, :]
        cos = torch.cat([freqs.cos(), freqs.cos()], -1).to(torch.bfloat16)[:, None, :]
        sin = torch.cat([freqs.sin(), freqs.sin()], -1).to(torch.bfloat16)[:, None, :]
        dec_k = [torch.zeros(b, s.kv_heads, ctx + 1, s.head_dim, dtype=torch.bfloat16, device=dev) for _ in self.layers] if b and att else []
        dec_v = [torch.zeros_like(x) for x in dec_k]
        pre_k = [torch.zeros(1, s.kv_heads, p + n, s.head_dim, dtype=torch.bfloat16, device=dev) for _ in self.layers] if n and att else []
        pre_v = [torch.zeros_like(x) for x in pre_k]
        hq, hkv, d = s.q_heads, s.kv_heads, s.head_dim

        def static(*shape: int) -> Any:
            return torch.randn(*shape, dtype=torch.bfloat16, device=dev) * 0.02

        qkv_out = (hq + 2 * hkv) * d
        fixed_x = static(t, s.hidden)
        fixed_qkv: Any = None if lin else static(t, qkv_out)
        fixed_attn: Any = None if att else static(t, hq * d)
        fixed_o: Any = None if lin else static(t, s.hidden)
        fixed_gu: Any = None if lin else static(t, 2 * s.intermediate)
        fixed_mlp: Any = None if lin else static(t, s.hidden)
        # Rows that sample: every decode row, and the last token of the prefill chunk.
        sample_rows = torch.arange(b, device=dev)
        if n:
            sample_rows = torch.cat([sample_rows, torch.tensor([b + n - 1], device=dev)])
        F = torch.nn.functional
        eps = 1e-6
        add_norm, qk_rope, silu_mul = self._elementwise()
        mm = self._mm
        moe = self.make_moe(t, parts, assignment, silu_mul) if s.is_moe else None

        def step() -> Any:
            x = self.embed[ids] if misc else fixed_x
            mlp = None
            for i, L in enumerate(self.layers):
                if not misc:
                    h = x
                elif mlp is None:
                    h = F.rms_norm(x, (s.hidden,), L["ln1"], eps)
                else:  # the previous layer's residual add, fused with this layer's norm
                    x, h = add_norm(x, mlp, L["ln1"])
                qkv = mm(h, L["qkv"]) if lin else fixed_qkv
                q = qkv[:, : hq * d].view(-1, hq, d)
                k = qkv[:, hq * d: (hq + hkv) * d].view(-1, hkv, d)
                v = qkv[:, (hq + hkv) * d:].view(-1, hkv, d)
                if misc:
                    q, k = qk_rope(q, k, L.get("q_norm"), L.get("k_norm"), cos, sin)
                if att:
                    outs = []
                    if b:
                        dec_k[i][:, :, ctx] = k[:b]
                        dec_v[i][:, :, ctx] = v[:b]
                        outs.append(self._decode_attention(q[:b], dec_k[i], dec_v[i]))
                    if n:
                        pre_k[i][0, :, p:] = k[b:].transpose(0, 1)
                        pre_v[i][0, :, p:] = v[b:].transpose(0, 1)
                        qp = q[b:].transpose(0, 1).unsqueeze(0)
                        o = self._sdpa(qp, pre_k[i], pre_v[i], prior=p)
                        outs.append(o[0].transpose(0, 1).reshape(n, hq * d))
                    a = outs[0] if len(outs) == 1 else torch.cat(outs, 0)
                else:
                    a = fixed_attn
                o_out = mm(a, L["o"]) if lin else fixed_o
                if misc:
                    x, h = add_norm(x, o_out, L["ln2"])
                else:
                    h = o_out
                if "router" in L:
                    assert moe is not None
                    mlp = moe(h, L)
                else:
                    gu = mm(h, L["gate_up"]) if lin else fixed_gu
                    act = silu_mul(gu) if misc else gu[:, : s.intermediate]
                    mlp = mm(act, L["down"]) if lin else fixed_mlp
                if not misc:
                    x = mlp
            if misc:
                x = x + mlp
            last = F.rms_norm(x[sample_rows], (s.hidden,), self.final_ln, eps) if misc else x[sample_rows]
            return last @ self.lm_head.t() if lin else last

        return step

    def dispatch(self, assignment: Sequence[Sequence[int]]) -> Dispatch:
        """The device tensors that group ``assignment``'s (token, expert) pairs by expert."""
        torch, dev = self.torch, self.device
        order, counts = group_by_expert(assignment, self.s.experts)
        unsort = [0] * len(order)
        for row, pair in enumerate(order):
            unsort[pair] = row
        k = self.s.top_k
        return Dispatch(slots=torch.tensor([list(r) for r in assignment], dtype=torch.long, device=dev).view(-1, k),
                        rows=torch.tensor([pair // k for pair in order], dtype=torch.long, device=dev),
                        unsort=torch.tensor(unsort, dtype=torch.long, device=dev),
                        offs=torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device=dev),
                        counts=tuple(counts))

    def make_moe(self, num_tokens: int, parts: frozenset[str] = PARTS, assignment: Sequence[Sequence[int]] | None = None,
                 silu_mul: Callable[[Any], Any] | None = None) -> Callable[[Any, dict[str, Any]], Any]:
        """A function computing one MoE block on ``num_tokens`` normed hidden states ``h``:

        router logits (an FP32 GEMM, as vLLM's glm4_moe.py and transformers' Glm4MoeTopkRouter),
        sigmoid scores, top-k on the bias-corrected scores; the rows of
        ``h`` gathered by expert; one grouped GEMM for the experts' gate/up, SiLU-and-mul, one for
        their down projections; the outputs put back in token order and summed with the routing
        weights (the scores at the token's experts, renormalised, times ``ROUTED_SCALING``); plus
        the shared expert. The experts each token goes to are ``assignment``'s (default: a seeded
        `uniform_assignment`): the top-k runs, its choice is not used, so the groups have the sizes
        the CUDA graph was captured with. With ``assignment`` the router's own top-k (`route`), the
        block is GLM's MoE. ``parts`` as in `make_step`: ``moe`` runs it all."""
        torch = self.torch
        s, dev, t, k = self.s, self.device, num_tokens, self.s.top_k
        run_lin = "linear" in parts or "moe" in parts
        run_misc = "other" in parts or "moe" in parts
        d = self.dispatch(uniform_assignment(t, s.experts, k) if assignment is None else assignment)
        act_fn = self._elementwise()[2] if silu_mul is None else silu_mul
        ei, si, mm = s.expert_intermediate, s.shared_experts * s.expert_intermediate, self._mm

        def static(*shape: int, dtype: Any = torch.bfloat16) -> Any:
            return (torch.randn(*shape, device=dev) * 0.02).to(dtype)

        fixed_logits: Any = None if run_lin else static(t, s.experts, dtype=torch.float32)
        fixed_gu: Any = None if run_lin else static(t * k, 2 * ei)
        fixed_ys: Any = None if run_lin else static(t * k, s.hidden)
        fixed_sgu: Any = None if run_lin else static(t, 2 * si)
        fixed_shared: Any = None if run_lin else static(t, s.hidden)
        fixed_w: Any = None if run_misc else static(t, k)
        fixed_xs: Any = None if run_misc else static(t * k, s.hidden)

        def block(h: Any, L: dict[str, Any]) -> Any:
            logits = h.float() @ L["router"].t() if run_lin else fixed_logits
            if run_misc:
                scores = logits.sigmoid()
                torch.topk(scores + L["router_bias"], k, dim=-1)  # the choice; the dispatch is ``d``'s
                w = scores.gather(1, d.slots)
                w = (w / (w.sum(-1, keepdim=True) + 1e-20) * ROUTED_SCALING).to(torch.bfloat16)
                xs = h[d.rows]
            else:
                w, xs = fixed_w, fixed_xs
            gu = self._experts_mm("gate_up", xs, L["experts_gate_up"], d) if run_lin else fixed_gu
            act = act_fn(gu) if run_misc else gu[:, :ei]
            ys = self._experts_mm("down", act, L["experts_down"], d) if run_lin else fixed_ys
            sgu = mm(h, L["shared_gate_up"]) if run_lin else fixed_sgu
            shared = mm(act_fn(sgu) if run_misc else sgu[:, :si], L["shared_down"]) if run_lin else fixed_shared
            if not run_misc:
                return shared
            routed = torch.bmm(w.unsqueeze(1), ys[d.unsort].view(t, k, -1)).squeeze(1)
            return routed + shared

        return block


def _time_replays(torch: Any, fn: Callable[[], Any], budget_s: float) -> list[float]:
    """Per-call GPU times (CUDA events), after a warm-up call; as many calls as fit ``budget_s``
    (3..40)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-5)
    reps = int(min(40, max(3, budget_s / one)))
    times = []
    for _ in range(reps):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        z.record()
        z.synchronize()
        times.append(a.elapsed_time(z) / 1e3)
    return times


def _graphed(torch: Any, step: Callable[[], Any]) -> Callable[[], Any]:
    """Capture ``step`` in a CUDA graph (after warm-up on a side stream, as PyTorch requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def device_ceilings(torch: Any) -> dict[str, float]:
    """What this GPU reaches on a plain copy and a large BF16 GEMM (the roofline's 100 %)."""
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = statistics.median(_time_replays(torch, lambda: y.copy_(x), 0.5))
    bw = 2 * x.numel() / t
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    bm = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = statistics.median(_time_replays(torch, lambda: a @ bm, 0.5))
    out = {"copy_bytes_per_s": bw, "bf16_gemm_flops": 2 * 8192**3 / t}
    if _fp8_refusal(torch, "cuda") is None:
        aq, bq, one = a.to(torch.float8_e4m3fn), bm.to(torch.float8_e4m3fn), torch.ones((), device="cuda")
        t = statistics.median(_time_replays(
            torch, lambda: torch._scaled_mm(aq, bq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), 0.5))
        out["fp8_gemm_flops"] = 2 * 8192**3 / t
    return out


def hf_cross_check(torch: Any, model: ModelSpec, decoder: Decoder, cases: Iterable[Case],
                   device: str = "cuda") -> list[dict[str, Any]]:
    """The same model built by `transformers` (random weights, SDPA), timed eagerly on prefill
    cases, next to this benchmark's decoder timed eagerly on the same cases: the ratio says how
    far the hand-built layer is from the reference implementation of the architecture."""
    import transformers

    cfg_cls = transformers.Qwen3Config if model.name in QK_NORM_MODELS else transformers.Qwen2Config
    cfg = cfg_cls(vocab_size=model.vocab_size, hidden_size=model.hidden_size,
                  intermediate_size=model.intermediate_size, num_hidden_layers=model.num_layers,
                  num_attention_heads=model.num_q_heads, num_key_value_heads=model.num_kv_heads,
                  head_dim=model.head_dim, tie_word_embeddings=model.tie_embeddings,
                  max_position_embeddings=model.max_position)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        meta = transformers.AutoModelForCausalLM.from_config(cfg)
    hf_params = sum(p.numel() for p in meta.parameters())
    del meta
    free, _ = torch.cuda.mem_get_info() if device == "cuda" else (float("inf"), 0)
    if free < 1.2 * hf_params * 2:  # a second copy of the weights does not fit: count only
        return [{"model": model.name, "hf_params": hf_params, "spec_params": model.total_params}]
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for case in cases:
            ids = torch.randint(0, model.vocab_size, (1, case.prefill_tokens), device=device)
            def hf_forward(ids: Any = ids) -> Any:
                return hf(input_ids=ids, logits_to_keep=1, use_cache=False)

            t_hf = statistics.median(_time_replays(torch, hf_forward, 1.0))
            t_ours = statistics.median(_time_replays(torch, decoder.make_step(case), 1.0))
            rows.append({"case": case.name, "hf_eager_s": t_hf, "ours_eager_s": t_ours})
    return [{"model": model.name, "hf_params": hf_params, "spec_params": model.total_params, **r} for r in rows]


def check_against_transformers(device: str = "cpu", fused: bool = False) -> float:
    """Build a small Qwen3 (q/k norm, GQA, untied head) both ways with the same weights and
    return the largest difference between this decoder's logits and `transformers`' for the last
    token of a 40-token prompt: BF16 rounding (about 1e-2 at logits of order 1) when the layer is
    the architecture. Runs on the CPU too."""
    torch = _torch()
    import transformers

    spec = ModelSpec("Qwen3-32B", "tiny", 3, 256, 8, 2, 32, 512, 1000, False, 4096)  # Qwen3's layer, small
    shard = Shard.of(spec, 1)
    dec = Decoder(shard, device, fused=fused)
    cfg = transformers.Qwen3Config(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                                   intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
                                   num_attention_heads=spec.num_q_heads, num_key_value_heads=spec.num_kv_heads,
                                   head_dim=spec.head_dim, tie_word_embeddings=False, rms_norm_eps=1e-6,
                                   max_position_embeddings=spec.max_position, rope_theta=1e6)
    cfg._attn_implementation = "sdpa"
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device).eval()
    g = torch.Generator(device=device).manual_seed(1)
    q_out, kv_out = spec.num_q_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(dec.embed)
        hf.lm_head.weight.copy_(dec.lm_head)
        for L, H in zip(dec.layers, hf.model.layers, strict=True):
            for name in ("ln1", "ln2", "q_norm", "k_norm"):  # non-trivial norm weights
                L[name].normal_(1.0, 0.1, generator=g)
            q, k, v = L["qkv"].split([q_out, kv_out, kv_out])
            attn, mlp = H.self_attn, H.mlp
            for dst, src in ((attn.q_proj, q), (attn.k_proj, k), (attn.v_proj, v), (attn.o_proj, L["o"]),
                             (mlp.down_proj, L["down"]), (attn.q_norm, L["q_norm"]), (attn.k_norm, L["k_norm"]),
                             (H.input_layernorm, L["ln1"]), (H.post_attention_layernorm, L["ln2"])):
                dst.weight.copy_(src)
            gate, up = L["gate_up"].split([spec.intermediate_size, spec.intermediate_size])
            mlp.gate_proj.weight.copy_(gate)
            mlp.up_proj.weight.copy_(up)
        ids = torch.randint(0, spec.vocab_size, (40,), device=device, generator=g)
        step = dec.make_step(Case("check", prefill_tokens=40), ids=ids)
        ours = step()[0].float()
        ref = hf(input_ids=ids[None], logits_to_keep=1).logits[0, -1].float()
    return float((ours - ref).abs().max())


def route(torch: Any, h: Any, layer: dict[str, Any], top_k: int) -> list[tuple[int, ...]]:
    """The experts GLM's router picks for each row of ``h``: top-k of the sigmoid scores plus the
    correction bias (transformers' Glm4MoeTopkRouter with one group)."""
    scores = (h.float() @ layer["router"].t()).sigmoid()
    chosen = torch.topk(scores + layer["router_bias"], top_k, dim=-1).indices
    return [tuple(int(e) for e in row) for row in chosen.tolist()]


def naive_moe(torch: Any, h: Any, layer: dict[str, Any], top_k: int,
              assignment: Sequence[Sequence[int]] | None = None) -> Any:
    """One MoE block the plain way, a token and an expert at a time, in FP32 from the decoder's
    weights: the reference for `Decoder.make_moe`. The experts are the router's choice, or
    ``assignment``'s when given; the weights are the token's scores at them, renormalised and
    scaled (transformers' Glm4MoeTopkRouter), and the shared expert is added."""
    F = torch.nn.functional

    def real(w: Any) -> Any:
        return w.q.float() * w.scale if isinstance(w, Fp8Weight) else w.float()

    gate_up, down = real(layer["experts_gate_up"]), real(layer["experts_down"])
    shared_gate_up, shared_down = real(layer["shared_gate_up"]), real(layer["shared_down"])

    def mlp(x: Any, gu_w: Any, down_w: Any) -> Any:
        g, u = (gu_w @ x).chunk(2)
        return down_w @ (F.silu(g) * u)

    chosen = route(torch, h, layer, top_k) if assignment is None else assignment
    out = []
    for x, experts in zip(h.float(), chosen, strict=True):
        scores = (layer["router"].float() @ x).sigmoid()
        weights = scores[list(experts)]
        weights = weights / weights.sum() * ROUTED_SCALING
        y = mlp(x, shared_gate_up, shared_down)
        for wt, e in zip(weights, experts, strict=True):
            y = y + wt * mlp(x, gate_up[e], down[e])
        out.append(y)
    return torch.stack(out)


TINY_MOE = ModelSpec("GLM-4.7-FP8", "tiny", 2, 64, 4, 2, 16, 128, 100, False, 4096, num_dense_layers=1,
                     num_experts=8, experts_per_token=2, num_shared_experts=1, moe_intermediate_size=32)


def check_moe(device: str = "cpu", fp8: bool = False, tokens: int = 40) -> dict[str, Any]:
    """Run one MoE block of a small GLM-shaped model (8 experts, top-2, one shared) through
    `Decoder.make_moe` with the router's own choice of experts, and compare it with `naive_moe`
    and, where `transformers` has it, with its `Glm4MoeMoE` holding the same weights. Returns the
    largest differences relative to the largest output (BF16 rounding is ~1e-2; FP8 ~5e-2)."""
    torch = _torch()
    shard = Shard.of(TINY_MOE, 1)
    dec = Decoder(shard, device, fp8=fp8)
    layer = dec.layers[-1]
    g = torch.Generator(device=device).manual_seed(2)
    layer["router_bias"].normal_(0.0, 0.01, generator=g)
    h = torch.randn(tokens, shard.hidden, device=device, generator=g).to(torch.bfloat16)
    with torch.no_grad():
        ours = dec.make_moe(tokens, assignment=route(torch, h, layer, shard.top_k))(h, layer).float()
        ref = naive_moe(torch, h, layer, shard.top_k)
        out: dict[str, Any] = {"naive": float((ours - ref).abs().max() / ref.abs().max()),
                               "gemm_paths": sorted(dec.gemm_paths)}
        try:
            hf = _hf_moe_block(torch, shard, layer, device)
            out["transformers"] = float((ours - hf(h[None]).float()[0]).abs().max() / ref.abs().max())
        except (ImportError, AttributeError, TypeError) as exc:  # an older transformers: no Glm4MoeMoE
            out["transformers"] = None
            out["transformers_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def _hf_moe_block(torch: Any, shard: Shard, layer: dict[str, Any], device: str) -> Any:
    """transformers' GLM-4.x MoE block (router, experts, shared expert) with ``layer``'s weights."""
    from transformers import Glm4MoeConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeMoE

    def real(w: Any) -> Any:
        return (w.q.float() * w.scale).to(torch.bfloat16) if isinstance(w, Fp8Weight) else w

    cfg = Glm4MoeConfig(hidden_size=shard.hidden, moe_intermediate_size=shard.expert_intermediate,
                        n_routed_experts=shard.experts, num_experts_per_tok=shard.top_k,
                        n_shared_experts=shard.shared_experts, routed_scaling_factor=ROUTED_SCALING,
                        n_group=1, topk_group=1, norm_topk_prob=True)
    cfg._experts_implementation = "eager"  # transformers' plain loop over the experts
    block = Glm4MoeMoE(cfg).to(device=device, dtype=torch.bfloat16).eval()
    si = shard.shared_experts * shard.expert_intermediate
    shared_gate, shared_up = real(layer["shared_gate_up"]).split([si, si])
    with torch.no_grad():
        block.gate.weight.data = layer["router"].clone()  # FP32, as the router is
        block.gate.e_score_correction_bias.data = layer["router_bias"].clone()
        block.experts.gate_up_proj.copy_(real(layer["experts_gate_up"]))
        block.experts.down_proj.copy_(real(layer["experts_down"]))
        block.shared_experts.gate_proj.weight.copy_(shared_gate)
        block.shared_experts.up_proj.weight.copy_(shared_up)
        block.shared_experts.down_proj.weight.copy_(real(layer["shared_down"]))
    return block


def timed_parts(shard: Shard) -> list[tuple[str, frozenset[str]]]:
    """What is timed for each case: the whole step, then each component alone (`make_step`)."""
    parts = [("all", Decoder.PARTS), ("linear", frozenset({"linear"})), ("attention", frozenset({"attention"}))]
    return parts + ([("moe", frozenset({"moe"}))] if shard.is_moe else [])


EXPERT_TOKENS = (1, 8, 64, 256, 2048, 8192)


def touched_experts(num_tokens: int, experts: int, top_k: int) -> int:
    """Experts of a layer that ``num_tokens`` tokens touch under uniform routing, rounded: the
    engine model's E·(1 − (1 − k/E)^T) (step_time.py)."""
    return max(1, min(experts, round(experts * (1.0 - (1.0 - top_k / experts) ** num_tokens))))


def expert_gemms(target: Target, log: Callable[[str], None], tokens: Sequence[int] = EXPERT_TOKENS,
                 device: str = "cuda") -> dict[str, Any]:
    """How far a grouped expert GEMM is from dense GEMMs doing the same work, per MoE layer of one
    rank (``--expert-gemms``): for T tokens, the routed experts' gate/up and down projections as
    the step runs them (`Decoder._experts_mm` with a uniform assignment, activation quantisation
    included), the quantisation of the gate/up input alone, and then GEMMs alone on activations
    quantised beforehand: the same grouped GEMMs, one dense FP8 GEMM with the same FLOPs (all T·k rows against one expert's
    weight) and one with the same weight bytes (T rows against the touched experts' weights side by
    side; rows rounded up to 16), each captured in a CUDA graph. A fused MoE kernel (vLLM's) does the
    grouped work; the dense GEMMs bound what any kernel does with it on this GPU. The routed
    experts only: the router GEMM, the shared expert and the gather/scatter are not here."""
    torch = _torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark runs on a GPU machine")
    base = target.shard
    if not base.is_moe:
        raise SystemExit(f"{target.label}: not a mixture-of-experts model")
    shard = dataclasses.replace(base, num_layers=1, moe_layers=1)
    dec = Decoder(shard, device, fp8=target.profile.use_fp8_compute and device == "cuda")
    layer = dec.layers[0]
    k, e, h, ei = shard.top_k, shard.experts, shard.hidden, shard.expert_intermediate
    gate_up, down = layer["experts_gate_up"], layer["experts_down"]
    rows_out: list[dict[str, Any]] = []
    log(f"== {target.label}: one MoE layer's routed experts ({e} experts, top-{k}, {2 * ei}/{ei} wide per rank), "
        f"µs; {'; '.join(sorted(dec.gemm_paths))}")
    log(f"{'tokens':>7} {'touched':>7} {'grouped gate_up':>15} {'grouped down':>12} {'quantise':>8} "
        f"{'grouped GEMMs':>13} {'dense same FLOPs':>16} {'dense same bytes':>16}   (last three: GEMMs only)")

    def timed(fn: Callable[[], Any]) -> float:
        with torch.inference_mode():
            if device != "cuda":  # a dry run of the shapes (CPU): one call, wall time
                t0 = time.perf_counter()
                fn()
                return time.perf_counter() - t0
            return statistics.median(_time_replays(torch, _graphed(torch, fn), 0.3))

    def rows16(m: int) -> int:  # FP8 GEMMs take row counts in multiples of 16
        return -(-max(16, m) // 16) * 16

    def dense(m: int, w: Any) -> Callable[[], Any]:
        """The GEMM alone of ``m`` rows against the [out, in] weight ``w`` (FP8: the activation
        quantised beforehand, as a fused MoE kernel receives it)."""
        x = torch.randn(rows16(m), w.shape[-1], device=device, dtype=torch.bfloat16)
        return functools.partial(dec._gemm, *dec._quantised(x, w), w)

    def grouped(x: Any, w: Any, d: Dispatch) -> Callable[[], Any]:
        """The grouped GEMM alone (FP8: on an activation quantised beforehand)."""
        return functools.partial(dec._grouped_gemm, *dec._quantised(x, w), w, d)

    def side_by_side(w: Any, n: int) -> Any:
        """The first ``n`` experts' weights [n, out, in] as one [n·out, in] weight (same bytes)."""
        return w.experts(0, n) if isinstance(w, Fp8Weight) else w[:n].reshape(-1, w.shape[-1])

    for t in tokens:
        d = dec.dispatch(uniform_assignment(t, e, k))
        n = touched_experts(t, e, k)
        xs = torch.randn(t * k, h, device=device, dtype=torch.bfloat16)
        acts = torch.randn(t * k, ei, device=device, dtype=torch.bfloat16)
        row = {"tokens": t, "touched": n,
               "grouped_gate_up_s": timed(functools.partial(dec._experts_mm, "gate_up", xs, gate_up, d)),
               "grouped_down_s": timed(functools.partial(dec._experts_mm, "down", acts, down, d)),
               "quantise_s": timed(functools.partial(_quantize_act, torch, xs)) if dec.fp8 else 0.0,
               "grouped_gemms_s": timed(grouped(xs, gate_up, d)) + timed(grouped(acts, down, d)),
               "dense_flops_s": timed(dense(t * k, side_by_side(gate_up, 1))) + timed(dense(t * k, side_by_side(down, 1))),
               "dense_bytes_s": timed(dense(t, side_by_side(gate_up, n))) + timed(dense(t, side_by_side(down, n)))}
        rows_out.append(row)
        log(f"{t:7d} {n:7d} {row['grouped_gate_up_s'] * 1e6:15.1f} {row['grouped_down_s'] * 1e6:12.1f} "
            f"{row['quantise_s'] * 1e6:8.1f} {row['grouped_gemms_s'] * 1e6:13.1f} {row['dense_flops_s'] * 1e6:16.1f} "
            f"{row['dense_bytes_s'] * 1e6:16.1f}")
    log("kernels: " + "; ".join(sorted(dec.gemm_paths)))
    return {"label": target.label, "shard": shard.record(), "gemm_paths": sorted(dec.gemm_paths), "rows": rows_out}


def run(targets: list[Target], cases: list[Case], hf_check: bool, log: Callable[[str], None],
        save: Callable[[dict[str, Any]], None], fused: bool = False, attention: str = "flash",
        fp8: bool = True) -> dict[str, Any]:
    torch = _torch()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark runs on a GPU machine")
    props = torch.cuda.get_device_properties(0)
    out: dict[str, Any] = {"fused_elementwise": fused, "attention": attention, "fp8": fp8, "device": props.name,
                           "sms": props.multi_processor_count, "torch": torch.__version__,
                           "ceilings": device_ceilings(torch), "targets": []}
    c = out["ceilings"]
    log(f"device {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}: "
        f"copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 GEMM {c['bf16_gemm_flops'] / 1e12:.0f} TFLOP/s"
        + (f", fp8 GEMM {c['fp8_gemm_flops'] / 1e12:.0f} TFLOP/s" if "fp8_gemm_flops" in c else ""))
    for target in targets:
        shard = target.shard
        t0 = time.perf_counter()
        try:
            dec = Decoder(shard, "cuda", fused=fused, attention=attention, fp8=fp8 and target.profile.use_fp8_compute)
            torch.cuda.synchronize()
        except Exception as exc:  # e.g. out of memory: the other targets still run
            log(f"\n== {target.label}: build failed: {type(exc).__name__}: {str(exc)[:300]}")
            out["targets"].append({"label": target.label, "error": f"{type(exc).__name__}: {exc}"[:500]})
            torch.cuda.empty_cache()
            continue
        moe = shard.is_moe
        log(f"\n== {target.label}: {target.profile.model.name} tp={target.profile.tp} shard, "
            f"{dec.weight_bytes() / 1e9:.1f} GB of weights (built in {time.perf_counter() - t0:.1f} s)")
        log(f"{'':46} {'whole step (ms)':>25} {'linear (ms)':>19} {'attention (ms)':>19} {'other (ms)':>17} {'model':>8}"
            + (f" {'MoE blocks (ms)':>19}" if moe else ""))
        log(f"{'case':46} {'meas.':>9} {'model':>9} {'ratio':>5} {'meas.':>9} {'model':>9} {'meas.':>9} {'model':>9} "
            f"{'meas.':>8} {'model':>8} {'step ms':>8}" + (f" {'meas.':>9} {'model':>9}" if moe else ""))
        rows = []
        for case in cases:
            free, _ = torch.cuda.mem_get_info()
            if not fits(shard, case, free):
                log(f"{case.name:46} skipped: does not fit")
                continue
            fig = model_figures(target.profile, case)
            samples: dict[str, list[float]] = {}
            try:
                for label, parts in timed_parts(shard):
                    with torch.inference_mode():
                        step = dec.make_step(case, parts)
                        samples[label] = _time_replays(torch, _graphed(torch, step), 0.5)
                    del step
                    torch.cuda.empty_cache()
            except Exception as exc:  # one case failing must not lose the others
                log(f"{case.name:46} failed: {type(exc).__name__}: {str(exc)[:200]}")
                rows.append({"case": dataclasses.asdict(case), "error": f"{type(exc).__name__}: {exc}"[:500],
                             **{k: statistics.median(v) for k, v in samples.items()}})
                torch.cuda.empty_cache()
                continue
            timed = {k: statistics.median(v) for k, v in samples.items()}
            other = timed["all"] - timed["linear"] - timed["attention"]
            rows.append({"case": dataclasses.asdict(case), "measured_s": timed["all"], "min_s": min(samples["all"]),
                         "max_s": max(samples["all"]), "reps": len(samples["all"]), "linear_s": timed["linear"],
                         "attention_s": timed["attention"], "other_s": other, "model": fig}
                        | ({"moe_s": timed["moe"]} if moe else {}))
            log(f"{case.name:46} {timed['all'] * 1e3:9.2f} {fig['gpu_s'] * 1e3:9.2f} {fig['gpu_s'] / timed['all']:5.2f} "
                f"{timed['linear'] * 1e3:9.2f} {fig['linear_s'] * 1e3:9.2f} {timed['attention'] * 1e3:9.2f} "
                f"{fig['attention_s'] * 1e3:9.2f} {other * 1e3:8.2f} {fig['per_layer_s'] * 1e3:8.2f} {fig['step_s'] * 1e3:8.2f}"
                + (f" {timed['moe'] * 1e3:9.2f} {fig['moe_s'] * 1e3:9.2f}" if moe else ""))
        entry: dict[str, Any] = {"label": target.label, "profile": target.profile.name, "tp": target.profile.tp,
                                 "shard": shard.record(), "weight_bytes": dec.weight_bytes(),
                                 "attention_paths": sorted(dec.attn_paths), "gemm_paths": sorted(dec.gemm_paths),
                                 "rows": rows}
        log("kernels: " + "; ".join(sorted(dec.attn_paths | dec.gemm_paths)))
        if hf_check and target.profile.tp == 1 and not moe:
            try:
                entry["hf_cross_check"] = hf_cross_check(
                    torch, target.profile.model, dec, [c for c in cases if c.prefill_tokens and not c.decode_seqs and not c.prefill_prior][1:3])
                for r in entry["hf_cross_check"]:
                    note = (f" {r['case']}: eager {r['hf_eager_s'] * 1e3:.2f} ms vs ours eager {r['ours_eager_s'] * 1e3:.2f} ms"
                             if "case" in r else " (not timed: no room for a second copy)")
                    log(f"transformers {r['model']} ({r['hf_params'] / 1e9:.3f}B params, spec {r['spec_params'] / 1e9:.3f}B){note}")
            except Exception as exc:  # the cross-check is optional
                entry["hf_cross_check_error"] = f"{type(exc).__name__}: {exc}"[:500]
                log(f"transformers cross-check failed: {entry['hf_cross_check_error']}")
        out["targets"].append(entry)
        save(out)
        del dec
        torch.cuda.empty_cache()
    return out


# Largest differences `--check` accepts: BF16 rounding of logits of order 1 (~1e-2), and of an MoE
# block's output relative to its largest value (BF16 ~1e-2; FP8's 3-bit mantissa ~5e-2).
CHECK_LIMITS = {"logits": 0.05, "bf16": 0.03, "fp8": 0.15}


def run_checks(fused: bool = False, fp8: bool = True) -> int:
    """`--check`: the dense layer against transformers' Qwen3, the MoE block (BF16, and FP8 where the
    device runs it) against `naive_moe` and transformers' GLM-4 MoE. 0 when all are within limits."""
    torch = _torch()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    diff = check_against_transformers(device, fused=fused)
    print(f"max |logit difference| vs transformers' Qwen3 on {device}: {diff:.4f} (BF16 rounding is ~1e-2)")
    ok = diff < CHECK_LIMITS["logits"]
    for kind in ("bf16", "fp8") if fp8 and _fp8_refusal(torch, device) is None else ("bf16",):
        res = check_moe(device, fp8=kind == "fp8")
        hf = res["transformers"]
        vs_hf = (f"{hf:.4f} vs transformers' Glm4MoeMoE" if hf is not None
                 else f"transformers not compared ({res['transformers_error']})")
        print(f"MoE block ({kind}, {'; '.join(res['gemm_paths'])}) on {device}, max difference / max output: "
              f"{res['naive']:.4f} vs per-token reference, {vs_hf}")
        ok = ok and res["naive"] < CHECK_LIMITS[kind] and (hf is None or hf < CHECK_LIMITS[kind])
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine.gpu_forward", description=__doc__.split("\n\n")[0])
    known = [t.label for t in default_targets()]
    ap.add_argument("--targets", default=",".join(known), help=f"comma-separated, of: {', '.join(known)}")
    ap.add_argument("--cases", default="", help="comma-separated substrings: run the cases whose name holds one")
    ap.add_argument("--no-hf-check", action="store_true", help="skip the transformers cross-check")
    ap.add_argument("--fused", action="store_true",
                    help="compile the elementwise pieces (norms, rotary, SiLU-and-mul) with torch.compile")
    ap.add_argument("--attention", choices=("flash", "cudnn"), default="flash",
                    help="SDPA kernel family tried first: PyTorch's FlashAttention-2 / memory-efficient "
                         "kernels, or cuDNN's fused attention (Hopper-native)")
    ap.add_argument("--no-fp8", action="store_true",
                    help="run the FP8 profiles' GEMMs in BF16 (FP8 is used where the profile and GPU have it)")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    ap.add_argument("--check", action="store_true",
                    help="only compare the decoder's logits with transformers' on a small Qwen3, and its MoE "
                         "block with a plain per-token one and transformers' GLM-4 MoE (CPU is enough)")
    ap.add_argument("--expert-gemms", action="store_true",
                    help="only time one MoE layer's routed-expert GEMMs, grouped as the step runs them, next to "
                         "dense GEMMs with the same FLOPs and the same weight bytes (MoE targets)")
    args = ap.parse_args(argv)
    if args.check:
        return run_checks(fused=args.fused, fp8=not args.no_fp8)
    wanted = [s for s in args.targets.split(",") if s]
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {known}")
    targets = [t for t in default_targets() if t.label in wanted]
    if args.expert_gemms:
        found = [expert_gemms(t, print) for t in targets if t.shard.is_moe]
        if args.out:
            with open(args.out, "w") as f:
                json.dump(found, f, indent=1)
        return 0
    filters = [f for f in args.cases.split(",") if f] or [""]
    cases = [c for c in default_cases() if any(f in c.name for f in filters)]

    def log(line: str) -> None:
        print(line, flush=True)

    def save(result: dict[str, Any]) -> None:  # after each target, so a timeout keeps what ran
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    run(targets, cases, not args.no_hf_check, log, save, fused=args.fused, attention=args.attention, fp8=not args.no_fp8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
