"""`python -m bench.engine.gpu_forward [--targets ...] [--out FILE]`: real forward passes of the
engine profiles' model shapes on the local GPU, next to the engine model's step times.

The engine model (`services/sim/engine/step_time.py`) prices one vLLM step with a per-component
roofline whose efficiencies were fitted to published points (Vidur's CodeLlama-34B/H100 linear
layers, a 32B decode floor, a ShareGPT throughput run). This benchmark checks those constants
against the GPU itself: it builds each model's decoder (the shapes of `ModelSpec`, random BF16
weights), times one step of the batches the scheduler forms (pure decode, prefill chunks with and
without a cached prefix, a mixed chunked-prefill step) and prints the time next to the model's.

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

Not a dependency of the package: it needs `torch` with CUDA (and `transformers` for the
cross-check), which the GPU machine has. The pure part (cases, shard shapes, the model's figures)
imports neither and is unit-tested.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from services.sim.engine.profiles import H200_SXM, QWEN3_32B_H100X2, QWEN25_3B_H200, ModelSpec, Profile
from services.sim.engine.step_time import StepTimeModel

# Models whose attention normalises q and k per head (HF Qwen3Attention's q_norm/k_norm); Qwen2.5
# has biases on q/k/v instead (HF Qwen2Attention), negligible next to the GEMMs and left out.
QK_NORM_MODELS = frozenset({"Qwen3-32B"})


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


@dataclass(frozen=True, slots=True)
class Shard:
    """The tensors one tensor-parallel rank holds (vLLM's column/row-parallel split)."""

    num_layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    qk_norm: bool

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> Shard:
        if model.is_moe:
            raise ValueError(f"{model.name}: MoE layers are not built by this benchmark")
        if model.num_q_heads % tp or model.intermediate_size % tp:
            raise ValueError(f"{model.name}: heads or MLP width not divisible by tp={tp}")
        return cls(model.num_layers, model.hidden_size, model.num_q_heads // tp,
                   max(1, model.num_kv_heads // tp), model.head_dim, model.intermediate_size // tp,
                   -(-model.vocab_size // tp), model.tie_embeddings, model.name in QK_NORM_MODELS)

    @property
    def params(self) -> int:
        attn = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim + self.q_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        emb = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.num_layers * (attn + mlp) + emb

    def kv_bytes(self, tokens: int) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * 2 * tokens  # K and V, BF16


@dataclass(frozen=True, slots=True)
class Target:
    """A profile to measure, and the shard of it this GPU runs."""

    label: str
    profile: Profile

    @property
    def shard(self) -> Shard:
        return Shard.of(self.profile.model, self.profile.tp)


def default_targets() -> list[Target]:
    """Profiles whose model fits one H200. The engine model is priced on the GPU it runs on, so
    the 32B targets use the H200's figures (same tensor cores as the H100, 4.8 vs 3.35 TB/s HBM)
    with the efficiencies of the shipped profiles unchanged: those efficiencies are what is
    checked. ``qwen3-32b/tp2-rank`` is one rank of the TAO paper's TP=2 deployment."""
    return [
        Target("qwen2.5-3b-h200", QWEN25_3B_H200),
        Target("qwen3-32b-h200x1", dataclasses.replace(QWEN3_32B_H100X2, name="qwen3-32b-h200x1", gpu=H200_SXM, tp=1)),
        Target("qwen3-32b-h200x2/tp2-rank", dataclasses.replace(QWEN3_32B_H100X2, name="qwen3-32b-h200x2", gpu=H200_SXM)),
    ]


def model_figures(profile: Profile, case: Case) -> dict[str, float]:
    """The engine model's time for ``case`` on ``profile``, by component, in seconds.

    ``gpu_s`` is what a CUDA-graph replay of the forward pass is compared with: linear layers,
    attention and the per-layer floor of small kernels. ``step_s`` is the full step the engine
    model charges, which adds the all-reduces (not measured on one GPU), the per-step CPU
    overhead (scheduler, input preparation) and the per-sequence overhead (bookkeeping, sampler)."""
    m = StepTimeModel(profile)
    linear = m.linear_time_s(case.num_tokens, case.num_sampled)
    attention = m.attention_time_s(case.kv_tokens_read, case.attn_pairs)
    per_layer = profile.per_layer_overhead_s * profile.model.num_layers
    step = m.step_time_s(case.num_tokens, case.num_seqs, case.num_sampled, case.kv_tokens_read, case.attn_pairs)
    return {"linear_s": linear, "attention_s": attention, "per_layer_s": per_layer,
            "gpu_s": linear + attention + per_layer, "allreduce_s": m.allreduce_time_s(case.num_tokens),
            "step_s": step}


def fits(shard: Shard, case: Case, free_bytes: float) -> bool:
    """Whether the case's KV cache and activations fit in the GPU memory left (20 % headroom)."""
    act = case.num_tokens * (shard.hidden * 8 + 2 * shard.intermediate * 3 + (shard.q_heads + 2 * shard.kv_heads) * shard.head_dim * 4)
    need = shard.kv_bytes(case.kv_tokens_read) + act + case.num_sampled * shard.vocab * 4  # the KV it reads is resident
    return need * 1.2 < free_bytes


# --------------------------------------------------------------------------- torch part (GPU only)


def _torch() -> Any:
    import torch  # optional: only the GPU machine has it

    return torch


class Decoder:
    """Random BF16 weights of one shard and a forward pass for one ``Case``."""

    def __init__(self, shard: Shard, device: str, seed: int = 0, fused: bool = False,
                 attention: str = "flash") -> None:
        torch = _torch()
        self.torch = torch
        self.fused = fused
        self.attention = attention
        self._paths = self._path_list()
        self.s = shard
        self.device = device
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*shape: int) -> Any:
            t = torch.empty(*shape, dtype=torch.bfloat16, device=device)
            return t.normal_(0.0, 0.02, generator=g)

        s = shard
        qkv_out = (s.q_heads + 2 * s.kv_heads) * s.head_dim
        self.layers = []
        for _ in range(s.num_layers):
            layer = {
                "ln1": torch.ones(s.hidden, dtype=torch.bfloat16, device=device),
                "qkv": w(qkv_out, s.hidden),
                "o": w(s.hidden, s.q_heads * s.head_dim),
                "ln2": torch.ones(s.hidden, dtype=torch.bfloat16, device=device),
                "gate_up": w(2 * s.intermediate, s.hidden),
                "down": w(s.hidden, s.intermediate),
            }
            if s.qk_norm:
                layer["q_norm"] = torch.ones(s.head_dim, dtype=torch.bfloat16, device=device)
                layer["k_norm"] = torch.ones(s.head_dim, dtype=torch.bfloat16, device=device)
            self.layers.append(layer)
        self.embed = w(s.vocab, s.hidden)
        self.lm_head = self.embed if s.tie_embeddings else w(s.vocab, s.hidden)
        self.final_ln = torch.ones(s.hidden, dtype=torch.bfloat16, device=device)
        self.attn_paths: set[str] = set()
        self._chosen: dict[str, int] = {}

    def weight_bytes(self) -> int:
        return self.s.params * 2

    # -- attention ---------------------------------------------------------------------------

    def _first_that_runs(self, key: str, attempts: Sequence[tuple[str, Callable[[], Any]]]) -> Any:
        """Run the first of ``attempts`` (label, call) that the kernels accept, and keep it for
        ``key``: later calls (a CUDA-graph capture among them) run only that one, so a capture
        never meets a refusal. The kept path is reported in ``attn_paths``."""
        chosen = self._chosen.get(key)
        order = [chosen] if chosen is not None else range(len(attempts))
        err: Exception | None = None
        for i in order:
            label, call = attempts[i]
            try:
                out = call()
            except RuntimeError as exc:
                err = exc
                continue
            if chosen is None:
                self._chosen[key] = i
                self.attn_paths.add(f"{key}: {label}")
            return out
        raise RuntimeError(f"no attention path ran for {key}: {err}")

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

        def silu_mul(gu: Any) -> Any:
            return F.silu(gu[:, : s.intermediate]) * gu[:, s.intermediate:]

        if not self.fused:
            return add_norm, qk_rope, silu_mul
        c = torch.compile
        return c(add_norm, dynamic=True), c(qk_rope, dynamic=True), c(silu_mul, dynamic=True)

    def make_step(self, case: Case, parts: frozenset[str] = PARTS, ids: Any = None) -> Callable[[], Any]:
        """Allocate the case's inputs and KV cache; return a function running one forward step.

        ``parts`` leaves components out so that each can be timed alone: ``linear`` (every GEMM,
        the LM head included), ``attention`` (KV-cache write and attention) and ``other`` (embedding,
        norms, rotary, activation, residual adds). A part left out takes its output from a
        preallocated tensor of the right shape, so the others see the same shapes."""
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
                qkv = h @ L["qkv"].t() if lin else fixed_qkv
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
                o_out = a @ L["o"].t() if lin else fixed_o
                if misc:
                    x, h = add_norm(x, o_out, L["ln2"])
                else:
                    h = o_out
                gu = h @ L["gate_up"].t() if lin else fixed_gu
                act = silu_mul(gu) if misc else gu[:, : s.intermediate]
                mlp = act @ L["down"].t() if lin else fixed_mlp
                if not misc:
                    x = mlp
            if misc:
                x = x + mlp
            last = F.rms_norm(x[sample_rows], (s.hidden,), self.final_ln, eps) if misc else x[sample_rows]
            return last @ self.lm_head.t() if lin else last

        return step


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
    return {"copy_bytes_per_s": bw, "bf16_gemm_flops": 2 * 8192**3 / t}


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


def run(targets: list[Target], cases: list[Case], hf_check: bool, log: Callable[[str], None],
        save: Callable[[dict[str, Any]], None], fused: bool = False, attention: str = "flash") -> dict[str, Any]:
    torch = _torch()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark runs on a GPU machine")
    props = torch.cuda.get_device_properties(0)
    out: dict[str, Any] = {"fused_elementwise": fused, "attention": attention, "device": props.name, "sms": props.multi_processor_count,
                           "torch": torch.__version__, "ceilings": device_ceilings(torch), "targets": []}
    c = out["ceilings"]
    log(f"device {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}: "
        f"copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 GEMM {c['bf16_gemm_flops'] / 1e12:.0f} TFLOP/s")
    for target in targets:
        shard = target.shard
        t0 = time.perf_counter()
        dec = Decoder(shard, "cuda", fused=fused, attention=attention)
        torch.cuda.synchronize()
        log(f"\n== {target.label}: {target.profile.model.name} tp={target.profile.tp} shard, "
            f"{dec.weight_bytes() / 1e9:.1f} GB of weights (built in {time.perf_counter() - t0:.1f} s)")
        log(f"{'':46} {'whole step (ms)':>25} {'linear (ms)':>19} {'attention (ms)':>19} {'other (ms)':>17} {'model':>8}")
        log(f"{'case':46} {'meas.':>9} {'model':>9} {'ratio':>5} {'meas.':>9} {'model':>9} {'meas.':>9} {'model':>9} "
            f"{'meas.':>8} {'model':>8} {'step ms':>8}")
        rows = []
        for case in cases:
            free, _ = torch.cuda.mem_get_info()
            if not fits(shard, case, free):
                log(f"{case.name:46} skipped: does not fit")
                continue
            fig = model_figures(target.profile, case)
            samples: dict[str, list[float]] = {}
            try:
                for label, parts in (("all", Decoder.PARTS), ("linear", frozenset({"linear"})),
                                     ("attention", frozenset({"attention"}))):
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
                         "attention_s": timed["attention"], "other_s": other, "model": fig})
            log(f"{case.name:46} {timed['all'] * 1e3:9.2f} {fig['gpu_s'] * 1e3:9.2f} {fig['gpu_s'] / timed['all']:5.2f} "
                f"{timed['linear'] * 1e3:9.2f} {fig['linear_s'] * 1e3:9.2f} {timed['attention'] * 1e3:9.2f} "
                f"{fig['attention_s'] * 1e3:9.2f} {other * 1e3:8.2f} {fig['per_layer_s'] * 1e3:8.2f} {fig['step_s'] * 1e3:8.2f}")
        entry: dict[str, Any] = {"label": target.label, "profile": target.profile.name, "tp": target.profile.tp,
                                 "shard": dataclasses.asdict(shard), "weight_bytes": dec.weight_bytes(),
                                 "attention_paths": sorted(dec.attn_paths), "rows": rows}
        if hf_check and target.profile.tp == 1:
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
    ap.add_argument("--out", default="", help="write the results as JSON here")
    ap.add_argument("--check", action="store_true",
                    help="only compare the decoder's logits with transformers' on a small Qwen3 (CPU is enough)")
    args = ap.parse_args(argv)
    if args.check:
        device = "cuda" if _torch().cuda.is_available() else "cpu"
        diff = check_against_transformers(device, fused=args.fused)
        print(f"max |logit difference| vs transformers' Qwen3 on {device}: {diff:.4f} (BF16 rounding is ~1e-2)")
        return 0 if diff < 0.05 else 1
    wanted = [s for s in args.targets.split(",") if s]
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {known}")
    targets = [t for t in default_targets() if t.label in wanted]
    filters = [f for f in args.cases.split(",") if f] or [""]
    cases = [c for c in default_cases() if any(f in c.name for f in filters)]

    def log(line: str) -> None:
        print(line, flush=True)

    def save(result: dict[str, Any]) -> None:  # after each target, so a timeout keeps what ran
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    run(targets, cases, not args.no_hf_check, log, save, fused=args.fused, attention=args.attention)
    return 0


if __name__ == "__main__":
    sys.exit(main())
