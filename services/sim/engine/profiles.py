"""Hardware + model profiles for the engine model, with the sources of every constant.

A ``Profile`` fixes a model, a GPU type, the tensor-parallel degree, vLLM's scheduler limits and
the roofline constants of ``services.sim.engine.step_time``. Default ``num_gpu_blocks`` follows vLLM's
sizing: per GPU, ``total_memory * gpu_memory_utilization - weights/tp - non-KV reserve`` bytes go
to the KV cache; blocks = that * tp / (KV bytes per token * block_size). The non-KV reserve
(peak activations of the profiling run at ``max_num_batched_tokens``, CUDA graphs, NCCL and
allocator overheads) is an approximation per profile; vLLM measures it at start-up.

Scheduler defaults are vLLM V1's for the OpenAI server on GPUs with >= 70 GiB that are not
A100 (``EngineArgs`` batch defaults in vllm/engine/arg_utils.py):
max_num_batched_tokens = 8192, max_num_seqs = 1024; gpu_memory_utilization = 0.9.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.sim.engine.tokens import BLOCK_SIZE

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_bytes: int  # as reported by torch.cuda.mem_get_info (slightly below the marketing GB)
    hbm_bytes_per_s: float
    bf16_flops: float  # dense (no sparsity) peak
    fp8_flops: float
    nvlink_bytes_per_s: float  # per direction


# NVIDIA H100 SXM5 datasheet: 989.4 TFLOP/s BF16 dense (1979 with sparsity), 1979 TFLOP/s FP8
# dense, 3.35 TB/s HBM3, NVLink 4 at 900 GB/s bidirectional. torch sees ~79.2 GiB of the 80 GB.
H100_SXM = GpuSpec("H100-SXM5-80GB", int(79.2 * GIB), 3.35e12, 989.4e12, 1978.9e12, 450e9)
# NVIDIA H200 SXM datasheet: same tensor cores as H100, "141 GB" HBM3e at 4.8 TB/s; nvidia-smi
# reports 143771 MiB, of which torch sees ~139.8 GiB.
H200_SXM = GpuSpec("H200-SXM-141GB", int(139.8 * GIB), 4.8e12, 989.4e12, 1978.9e12, 450e9)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Transformer shape. Parameter counts are derived from the shape (checked in tests)."""

    name: str
    hf_id: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (dense layers of an MoE)
    vocab_size: int
    tie_embeddings: bool
    max_position: int
    weight_bytes_per_param: float = 2.0  # BF16
    kv_bytes_per_elem: float = 2.0  # BF16 KV cache
    # MoE (zero for dense models)
    num_dense_layers: int = -1  # -1: all layers dense
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attn_params_per_layer(self) -> int:
        q = self.num_q_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return self.hidden_size * (q + 2 * kv) + q * self.hidden_size

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # SwiGLU: gate, up, down

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def n_dense(self) -> int:
        return self.num_layers if self.num_dense_layers < 0 else self.num_dense_layers

    @property
    def n_moe(self) -> int:
        return self.num_layers - self.n_dense

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def body_dense_params(self) -> int:
        """Params every token touches, excluding embeddings, LM head and routed experts."""
        shared = self.n_moe * self.num_shared_experts * self.expert_params
        router = self.n_moe * self.hidden_size * self.num_experts
        return self.num_layers * self.attn_params_per_layer + self.n_dense * self.dense_mlp_params + shared + router

    @property
    def routed_params(self) -> int:
        return self.n_moe * self.num_experts * self.expert_params

    @property
    def total_params(self) -> int:
        emb = self.embedding_params * (1 if self.tie_embeddings else 2)
        return self.body_dense_params + self.routed_params + emb

    @property
    def active_params_per_token(self) -> int:
        """Params whose FLOPs a non-final token pays (no embedding lookup, no LM head)."""
        return self.body_dense_params + self.n_moe * self.experts_per_token * self.expert_params

    @property
    def weight_bytes(self) -> float:
        # Embeddings / LM head stay BF16 in FP8 checkpoints.
        emb = self.embedding_params * (1 if self.tie_embeddings else 2)
        return (self.body_dense_params + self.routed_params) * self.weight_bytes_per_param + emb * 2.0

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes_per_elem


# Qwen3-32B (HF Qwen/Qwen3-32B config.json / model card): 64 layers, hidden 5120, 64 Q / 8 KV
# heads of 128, MLP 25600, vocab 151936, untied; 32.8B params. Native 32K context, 131072 with
# YaRN (factor 4) as the model card documents; agent traces need > 40K so the profile uses it.
QWEN3_32B = ModelSpec("Qwen3-32B", "Qwen/Qwen3-32B", 64, 5120, 64, 8, 128, 25600, 151936, False, 131072)
# Qwen2.5-3B-Instruct (HF config.json / model card): 36 layers, hidden 2048, 16 Q / 2 KV heads,
# MLP 11008, vocab 151936, tied embeddings; 3.09B params; 32768 context.
QWEN25_3B = ModelSpec("Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-3B-Instruct", 36, 2048, 16, 2, 128, 11008,
                      151936, True, 32768)
# CodeLlama-34B (HF codellama/CodeLlama-34b-hf config.json): 48 layers, hidden 8192, 64 Q / 8 KV
# heads, MLP 22016, vocab 32000. Used only for the Vidur calibration point.
CODELLAMA_34B = ModelSpec("CodeLlama-34B", "codellama/CodeLlama-34b-hf", 48, 8192, 64, 8, 128, 22016,
                          32000, False, 16384)
# GLM-4.7 (zai-org; Glm4MoeForCausalLM, same shape as GLM-4.5/4.6 per the GLM-4.5 technical
# report and config.json): 92 layers (first 3 dense, MLP 12288; 89 MoE), hidden 5120, 96 Q / 8 KV
# heads of 128, 160 routed experts (top-8) + 1 shared, expert MLP 1536, vocab 151552; ~355B total,
# ~32B active. FP8 checkpoint (zai-org/GLM-4.7-FP8): 1 byte per linear weight. The MTP layer is
# ignored (no speculative decoding), as are QK-norm and bias params (< 0.1 %). 200K context.
GLM47_FP8 = ModelSpec("GLM-4.7-FP8", "zai-org/GLM-4.7-FP8", 92, 5120, 96, 8, 128, 12288, 151552, False,
                      202752, weight_bytes_per_param=1.0, num_dense_layers=3, num_experts=160,
                      experts_per_token=8, num_shared_experts=1, moe_intermediate_size=1536)


@dataclass(frozen=True, slots=True)
class Profile:
    """Everything the engine needs about one replica."""

    name: str
    model: ModelSpec
    gpu: GpuSpec
    tp: int
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    gpu_memory_utilization: float = 0.9
    non_kv_reserve_bytes_per_gpu: float = 4.0 * GIB
    # Roofline constants (sim.engine.step_time). Calibrated in tests/unit/engine/test_calibration.py:
    # linear layers reach 81 % of HBM bandwidth when memory-bound and 66 % of dense peak when
    # compute-bound (Vidur CodeLlama-34B/H100 points); attention kernels 75 % / 45 % (decode
    # attention on long contexts streams KV near bandwidth; prefill FlashAttention ~45 % of peak).
    bw_efficiency: float = 0.81
    compute_efficiency: float = 0.66
    attn_bw_efficiency: float = 0.75
    attn_compute_efficiency: float = 0.45
    use_fp8_compute: bool = False
    step_overhead_s: float = 0.0010  # scheduler + input prep + sampling per step (V1, CUDA graphs)
    # Floor time of the ~10-20 small kernels of one layer (norms, rotary, cache write, routing):
    # they do not shrink with batch size, even with CUDA graphs removing launch gaps.
    per_layer_overhead_s: float = 10e-6
    # Per scheduled sequence per step: V1 CPU bookkeeping, sampler, and the short-context
    # inefficiency of attention kernels (fitted with the ShareGPT throughput point).
    per_seq_overhead_s: float = 60e-6
    allreduce_latency_s: float = 8e-6  # one NVLink all-reduce of a small message (custom AR)
    block_size: int = BLOCK_SIZE
    served_model_name: str = field(default="")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.hf_id

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        # KV heads are split across TP ranks (each rank keeps at least one head).
        heads = max(1, self.model.num_kv_heads // self.tp)
        return 2 * self.model.num_layers * heads * self.model.head_dim * self.model.kv_bytes_per_elem

    @property
    def kv_bytes_available_per_gpu(self) -> float:
        return (self.gpu.memory_bytes * self.gpu_memory_utilization - self.model.weight_bytes / self.tp
                - self.non_kv_reserve_bytes_per_gpu)

    @property
    def default_num_gpu_blocks(self) -> int:
        per_block = self.kv_bytes_per_token_per_gpu * self.block_size
        blocks = int(self.kv_bytes_available_per_gpu // per_block)
        if blocks <= 0:
            raise ValueError(f"profile {self.name}: weights do not fit in GPU memory")
        return blocks


# Two H100s, TP=2: the TAO paper's Qwen deployment (2xH100 per node).
QWEN3_32B_H100X2 = Profile("qwen3-32b-h100x2", QWEN3_32B, H100_SXM, tp=2, max_model_len=131072)
# One H100, TP=1: the stock-vLLM throughput calibration point. Its KV cache holds only ~25k
# tokens, so vLLM would refuse the native 40960 context; serve with --max-model-len 16384.
QWEN3_32B_H100X1 = Profile("qwen3-32b-h100x1", QWEN3_32B, H100_SXM, tp=1, max_model_len=16384)
# One H200 serving Qwen2.5-3B-Instruct: the budget-controller study's setup.
QWEN25_3B_H200 = Profile("qwen2.5-3b-h200", QWEN25_3B, H200_SXM, tp=1, max_model_len=32768,
                         non_kv_reserve_bytes_per_gpu=2.5 * GIB)
# One 8xH100 node serving GLM-4.7-FP8 with TP=8 (the TAO paper's GLM setup). Approximations: expert
# weights are TP-sharded (no expert parallelism); the weight bytes a step reads count only the
# experts its tokens touch (uniform routing); FP8 GEMMs at 50 % of FP8 peak; KV cache BF16.
GLM47_FP8_H100X8 = Profile("glm-4.7-fp8-h100x8", GLM47_FP8, H100_SXM, tp=8, max_model_len=202752,
                           non_kv_reserve_bytes_per_gpu=6.0 * GIB, use_fp8_compute=True,
                           compute_efficiency=0.50, per_layer_overhead_s=40e-6)

PROFILES: dict[str, Profile] = {
    p.name: p for p in (QWEN3_32B_H100X2, QWEN3_32B_H100X1, QWEN25_3B_H200, GLM47_FP8_H100X8)
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
