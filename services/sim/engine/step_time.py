"""Step time of one mixed prefill+decode batch: a per-component roofline.

For one engine step on one TP rank (all ranks run in lock-step):

    t = t_linear + t_attention + t_allreduce + step_overhead + layers * per_layer_overhead
        + per_seq_overhead * seqs

- ``t_linear = max(weight_bytes_read / (HBM * bw_eff), linear_flops / (peak * compute_eff))``
  where linear FLOPs are ``2 * active_params * tokens`` plus the LM head for the sequences that
  sample this step (vLLM computes logits only at sampled positions). For an MoE the weight bytes
  a step reads are the dense part plus the routed experts its tokens touch: with T tokens each
  picking k of E experts uniformly, a layer touches ``E * (1 - (1 - k/E)^T)`` experts.
- ``t_attention = max(kv_bytes_read / (HBM * attn_bw_eff), attn_flops / (peak * attn_eff))``:
  a sequence with ``p`` computed tokens that processes ``n`` new ones reads ``p + n`` tokens of KV
  and does ``4 * q_heads * head_dim * layers`` FLOPs per query-key pair, with
  ``n * p + n * (n + 1) / 2`` causal pairs.
- ``t_allreduce``: two all-reduces per layer (after attention and after the MLP) of
  ``tokens * hidden * 2`` bytes, ring cost ``2 (tp - 1) / tp`` of that over NVLink, plus latency.

Everything is divided by ``tp`` where the work is sharded. Constants live in ``Profile``.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.sim.engine.profiles import Profile


@dataclass(frozen=True, slots=True)
class UnitCosts:
    """The step time's constants per unit of work, for bounds that sum them over many steps:
    a step costs ``fixed_s`` + L3(≥ ``weights_s``, tokens·``flop_token_s`` + sampled·
    ``flop_sample_s``) + L3(KV tokens·``kv_token_s``, pairs·``pair_s``) + tokens·``ar_token_s``
    + seqs·``seq_s`` (L3(a, b) = (a³ + b³)^⅓); ``weights_s`` is one token's weight read (an MoE
    step with more tokens reads more experts)."""

    fixed_s: float
    weights_s: float
    flop_token_s: float
    flop_sample_s: float
    kv_token_s: float
    pair_s: float
    ar_token_s: float
    seq_s: float


class StepTimeModel:
    """Precomputed per-profile constants; ``step_time_s`` is called once per engine step."""

    __slots__ = ("_ar_bytes_per_token", "_ar_fixed_s", "_attn_fl", "_attn_flops_per_pair", "_bw",
                 "_bw_attn", "_dense_weight_bytes", "_experts", "_fl", "_head_flops", "_kv_bytes",
                 "_lin_flops_per_token", "_miss_prob", "_per_seq_s", "_routed_weight_bytes",
                 "_step_overhead_s", "profile")

    def __init__(self, profile: Profile) -> None:
        m = profile.model
        tp = profile.tp
        self.profile = profile
        peak = profile.gpu.fp8_flops if profile.use_fp8_compute else profile.gpu.bf16_flops
        self._bw = profile.gpu.hbm_bytes_per_s * profile.bw_efficiency
        self._bw_attn = profile.gpu.hbm_bytes_per_s * profile.attn_bw_efficiency
        self._fl = peak * profile.compute_efficiency
        # Attention math runs in BF16 even for FP8 weights (BF16 KV cache).
        self._attn_fl = profile.gpu.bf16_flops * profile.attn_compute_efficiency
        wb = m.weight_bytes_per_param
        self._dense_weight_bytes = (m.body_dense_params * wb + m.lm_head_params * 2.0) / tp
        self._routed_weight_bytes = m.routed_params * wb / tp
        self._experts = m.num_experts
        self._miss_prob = 1.0 - m.experts_per_token / m.num_experts if m.is_moe else 1.0
        self._lin_flops_per_token = 2.0 * m.active_params_per_token / tp
        self._head_flops = 2.0 * m.lm_head_params / tp
        self._kv_bytes = profile.kv_bytes_per_token_per_gpu
        self._attn_flops_per_pair = 4.0 * m.num_q_heads * m.head_dim * m.num_layers / tp
        if tp > 1:
            n_ar = 2 * m.num_layers
            self._ar_fixed_s = n_ar * profile.allreduce_latency_s
            self._ar_bytes_per_token = n_ar * m.hidden_size * 2.0 * 2.0 * (tp - 1) / tp / profile.gpu.nvlink_bytes_per_s
        else:
            self._ar_fixed_s = 0.0
            self._ar_bytes_per_token = 0.0
        self._step_overhead_s = profile.step_overhead_s + profile.per_layer_overhead_s * m.num_layers
        self._per_seq_s = profile.per_seq_overhead_s

    def unit_costs(self) -> UnitCosts:
        return UnitCosts(
            fixed_s=self._step_overhead_s + self._ar_fixed_s,
            weights_s=self.weight_bytes_read(1) / self._bw,
            flop_token_s=self._lin_flops_per_token / self._fl,
            flop_sample_s=self._head_flops / self._fl,
            kv_token_s=self._kv_bytes / self._bw_attn,
            pair_s=self._attn_flops_per_pair / self._attn_fl,
            ar_token_s=self._ar_bytes_per_token,
            seq_s=self._per_seq_s,
        )

    def weight_bytes_read(self, num_tokens: int) -> float:
        if self._experts == 0 or num_tokens <= 0:
            return self._dense_weight_bytes + (self._routed_weight_bytes if num_tokens > 0 else 0.0)
        touched = 1.0 - self._miss_prob**num_tokens
        return self._dense_weight_bytes + self._routed_weight_bytes * touched

    def linear_time_s(self, num_tokens: int, num_sampled: int) -> float:
        """Time of all linear layers (incl. LM head) for ``num_tokens`` tokens on one rank."""
        mem = self.weight_bytes_read(num_tokens) / self._bw
        comp = (self._lin_flops_per_token * num_tokens + self._head_flops * num_sampled) / self._fl
        return (mem**3 + comp**3) ** (1.0 / 3.0)

    def attention_time_s(self, kv_tokens_read: int, attn_pairs: float) -> float:
        mem = kv_tokens_read * self._kv_bytes / self._bw_attn
        comp = attn_pairs * self._attn_flops_per_pair / self._attn_fl
        return (mem**3 + comp**3) ** (1.0 / 3.0)

    def allreduce_time_s(self, num_tokens: int) -> float:
        return self._ar_fixed_s + self._ar_bytes_per_token * num_tokens

    def step_time_s(
        self, num_tokens: int, num_seqs: int, num_sampled: int, kv_tokens_read: int, attn_pairs: float
    ) -> float:
        """Duration of one step; zero tokens means an idle engine (0 s)."""
        if num_tokens <= 0:
            return 0.0
        return (
            self.linear_time_s(num_tokens, num_sampled)
            + self.attention_time_s(kv_tokens_read, attn_pairs)
            + self._ar_fixed_s + self._ar_bytes_per_token * num_tokens
            + self._step_overhead_s
            + self._per_seq_s * num_seqs
        )

    def decode_step_time_s(self, batch: int, context_tokens: int) -> float:
        """Convenience: a pure decode step of ``batch`` sequences of ``context_tokens`` each."""
        pairs = float(batch * (context_tokens + 1))
        return self.step_time_s(batch, batch, batch, batch * (context_tokens + 1), pairs)
