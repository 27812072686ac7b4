"""vLLM V1 engine model: scheduler + KV block pool + step-time model, in virtual time.

Scheduling follows ``vllm/v1/core/sched/scheduler.py`` (FCFS policy, chunked prefill on):

1. Running requests in order, while token budget remains: each gets
   ``min(num_tokens - num_computed, budget, max_model_len - 1 - num_computed)`` tokens (1 for a
   decode, the rest of its prompt or a chunk for a partial prefill). If its blocks cannot be
   allocated, the *newest* running request is preempted by recompute (blocks freed, cached
   hashes kept, request pushed to the front of the waiting queue, computed tokens reset to 0)
   and allocation is retried; if the request itself was the newest, scheduling stops.
2. Only if nothing was preempted this step: waiting requests FCFS while the budget lasts and
   fewer than ``max_num_seqs`` run. Each looks up its prefix-cache hit, is allocated blocks for
   ``min(remaining, budget)`` tokens (chunked prefill) and, when allocation fails, stops the loop.
3. The batch runs for ``StepTimeModel.step_time_s``; every request whose computed tokens reach
   its token count samples one output token; finished requests free their blocks.

The engine holds no clock: drivers add up ``StepResult.duration_s``.
"""

from __future__ import annotations

from collections import deque

from services.common.kv_events import KVEvent
from services.sim.engine.kv_cache import BlockPool, KVRequest
from services.sim.engine.profiles import Profile
from services.sim.engine.step_time import StepTimeModel
from services.sim.engine.tokens import TokenContent
from services.sim.engine.types import FINISH_ABORT, FINISH_LENGTH, EngineRequest, FinishedRequest, StepResult


def default_max_model_len(profile: Profile, num_gpu_blocks: int) -> int:
    """The engine's ``max_model_len`` when none is given: the profile's, shrunk to what the KV
    cache holds (vLLM refuses to start when one max-length request cannot fit; one block is
    vLLM's null block), as its error message suggests."""
    return min(profile.max_model_len, (num_gpu_blocks - 1) * profile.block_size)


def length_violation(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> str | None:
    """Which field of a request vLLM's API server refuses with a 400 before the engine sees it,
    or None: ``"prompt"`` when the prompt alone reaches ``max_model_len``, ``"max_tokens"`` when
    prompt + ``max_tokens`` exceeds it ("'max_tokens' or 'max_completion_tokens' is too large").
    vLLM's ``OpenAIServing._validate_input`` (vllm/entrypoints/openai/serving_engine.py). One rule
    for both worlds: the emulated replica answers its 400 with it (``vllm_sim.protocol.check_length``)
    and the cluster simulator ends the session there as the live driver does."""
    if prompt_tokens >= max_model_len:
        return "prompt"
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        return "max_tokens"
    return None


class _Req(KVRequest):
    __slots__ = ("cached_tokens", "finish_reason_at_max", "max_output_tokens", "num_output_tokens",
                 "num_preemptions", "prompt_tokens", "request_id")

    def __init__(self, er: EngineRequest) -> None:
        super().__init__(er.content, er.prompt_tokens)
        self.request_id = er.request_id
        self.prompt_tokens = er.prompt_tokens
        self.max_output_tokens = er.max_output_tokens
        self.finish_reason_at_max = er.finish_reason_at_max
        self.num_output_tokens = 0
        self.cached_tokens = -1
        self.num_preemptions = 0


class _Batch:
    """What one step has scheduled so far."""

    __slots__ = ("budget", "counts", "kv_read", "pairs", "preempted", "reqs")

    def __init__(self, budget: int) -> None:
        self.reqs: list[_Req] = []
        self.counts: list[int] = []  # tokens scheduled per request
        self.preempted: list[str] = []
        self.budget = budget  # tokens left
        self.kv_read = 0  # KV tokens the batch's attention reads
        self.pairs = 0.0  # causal query-key pairs


class Engine:
    """One vLLM replica's engine core. Not thread-safe; drive it from one task."""

    def __init__(
        self,
        profile: Profile,
        *,
        num_gpu_blocks: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.profile = profile
        self.block_size = profile.block_size
        self.num_gpu_blocks = profile.default_num_gpu_blocks if num_gpu_blocks is None else num_gpu_blocks
        if self.num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2, got {self.num_gpu_blocks}")
        self.max_num_seqs = profile.max_num_seqs if max_num_seqs is None else max_num_seqs
        self.max_num_batched_tokens = (
            profile.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
        )
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        usable_tokens = (self.num_gpu_blocks - 1) * self.block_size
        if max_model_len is None:
            self.max_model_len = default_max_model_len(profile, self.num_gpu_blocks)
        else:
            if max_model_len > usable_tokens:
                raise ValueError(
                    f"max_model_len {max_model_len} needs more KV cache than {self.num_gpu_blocks} blocks "
                    f"({usable_tokens} tokens) hold; the largest that fits is {usable_tokens}"
                )
            self.max_model_len = max_model_len
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(self.num_gpu_blocks, self.block_size)
        self.cost = StepTimeModel(profile)
        self._running: list[_Req] = []
        self._waiting: deque[_Req] = deque()
        self._by_id: dict[str, _Req] = {}
        # Counters (monotonic), named after the vLLM metrics they feed.
        self.prefix_cache_queries = 0  # tokens looked up by first-time requests
        self.prefix_cache_hits = 0
        self.preempted_prefix_cache_queries = 0  # lookups by previously preempted requests
        self.preempted_prefix_cache_hits = 0
        self.num_preemptions_total = 0
        self.num_steps = 0
        self.busy_time_s = 0.0
        self.prefill_tokens_total = 0  # tokens computed in prefill (incl. recompute, excl. hits)
        self.generation_tokens_total = 0

    # --------------------------------------------------------------- accessors
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_cache_usage(self) -> float:
        return self.pool.usage

    @property
    def capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def used_tokens(self) -> int:
        """KV slots held by running requests (blocks with ref count > 0, in tokens)."""
        usable = self.num_gpu_blocks - 1
        return (usable - self.pool.num_free_blocks) * self.block_size

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._by_id

    def running_ids(self) -> list[str]:
        return [r.request_id for r in self._running]

    def waiting_ids(self) -> list[str]:
        return [r.request_id for r in self._waiting]

    def cached_prefix_tokens(self, content: TokenContent, prompt_tokens: int) -> int:
        """Tokens of a prompt the prefix cache would serve now (no LRU touch, no counters)."""
        if not self.enable_prefix_caching:
            return 0
        max_blocks = (prompt_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return 0
        return self.pool.content_hit_count(content, max_blocks) * self.block_size

    def resident_prefix_blocks(self, content: TokenContent, num_tokens: int) -> int:
        """Leading full blocks of the first ``num_tokens`` tokens of ``content`` held in the
        prefix cache now: what a KV-event subscriber (Dynamo's radix-tree indexer) knows of
        this replica — a block counts from its ``stored`` event until its ``removed`` event
        (eviction), whether or not a running request still references it. Read-only: no LRU
        touch, no counters; unlike ``cached_prefix_tokens`` the last full block counts too
        (the router matches every full block of the request, the scheduler recomputes one)."""
        if not self.enable_prefix_caching:
            return 0
        num_blocks = num_tokens // self.block_size
        if num_blocks <= 0:
            return 0
        return self.pool.content_hit_count(content, num_blocks)

    # --------------------------------------------------------------- KV events
    def enable_kv_events(self) -> None:
        """Record vLLM KV-cache events from now on (``BlockPool.enable_kv_events``)."""
        self.pool.enable_kv_events()

    def take_kv_events(self) -> list[KVEvent]:
        """KV events since the last call (vLLM publishes one batch per step)."""
        return self.pool.take_events()

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: False (nothing changes) while any block is in use."""
        return self.pool.reset_prefix_cache()

    # ---------------------------------------------------------------- requests
    def add_request(self, request: EngineRequest) -> None:
        if request.request_id in self._by_id:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.prompt_tokens < 1:
            raise ValueError("prompt_tokens must be >= 1")
        if request.max_output_tokens < 1:
            raise ValueError("max_output_tokens must be >= 1")
        if request.prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt of {request.prompt_tokens} tokens does not fit max_model_len {self.max_model_len}"
            )
        r = _Req(request)
        self._by_id[r.request_id] = r
        self._waiting.append(r)

    def abort(self, request_id: str) -> FinishedRequest | None:
        """Remove a request wherever it is, freeing its blocks. None if unknown."""
        r = self._by_id.pop(request_id, None)
        if r is None:
            return None
        if r in self._waiting:
            self._waiting.remove(r)
        else:
            self._running.remove(r)
        self.pool.free(r)
        return self._finished(r, FINISH_ABORT)

    @staticmethod
    def _finished(r: _Req, reason: str) -> FinishedRequest:
        return FinishedRequest(r.request_id, r.prompt_tokens, r.num_output_tokens, max(r.cached_tokens, 0),
                               r.num_preemptions, reason)

    def _preempt(self, r: _Req) -> None:
        self.pool.free(r)
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        self.num_preemptions_total += 1
        self._waiting.appendleft(r)

    # -------------------------------------------------------------------- step
    def step(self) -> StepResult:
        """Schedule one batch, account its time, advance every scheduled request."""
        batch = _Batch(self.max_num_batched_tokens)
        self._schedule_running(batch)
        if not batch.preempted:  # vLLM skips the waiting queue in a step that preempted
            self._schedule_waiting(batch)
        if not batch.reqs:
            if self.has_work() and not batch.preempted:
                raise RuntimeError("engine stalled: work queued but nothing schedulable")
            return StepResult(0.0, 0, 0, 0, {}, (), (), tuple(batch.preempted))
        return self._advance(batch)

    def _schedule_running(self, batch: _Batch) -> None:
        bs = self.block_size
        pool = self.pool
        running = self._running
        max_len_m1 = self.max_model_len - 1
        caching = self.enable_prefix_caching
        reqs, counts, preempted = batch.reqs, batch.counts, batch.preempted
        budget, kv_read, pairs = batch.budget, 0, 0.0
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            p = r.num_computed_tokens
            n = r.num_tokens - p
            if n > budget:
                n = budget
            if n > max_len_m1 - p:
                n = max_len_m1 - p
            if n <= 0:
                i += 1
                continue
            total = p + n
            if total <= len(r.blocks) * bs:  # fast path: no new block needed
                if caching:
                    num_full = (total if total < r.num_tokens else r.num_tokens) // bs
                    if num_full > r.num_cached_blocks:
                        pool.cache_full_blocks(r, num_full)
            elif not self._allocate(r, n, 0):
                scheduled = False
                while True:  # preempt the newest running request until r fits
                    victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim.request_id)
                    if victim is r:
                        break
                    if self._allocate(r, n, 0):
                        scheduled = True
                        break
                if not scheduled:
                    break
            reqs.append(r)
            counts.append(n)
            budget -= n
            kv_read += total
            pairs += n * p + n * (n + 1) * 0.5
            i += 1
        batch.budget, batch.kv_read, batch.pairs = budget, kv_read, pairs

    def _schedule_waiting(self, batch: _Batch) -> None:
        bs = self.block_size
        pool = self.pool
        running = self._running
        waiting = self._waiting
        caching = self.enable_prefix_caching
        max_seqs = self.max_num_seqs
        budget, kv_read, pairs = batch.budget, batch.kv_read, batch.pairs
        while waiting and budget > 0 and len(running) < max_seqs:
            r = waiting[0]
            hit = pool.get_computed_blocks(r) if caching else 0
            hit_tokens = hit * bs
            n = r.num_tokens - hit_tokens
            if n > budget:
                n = budget
            if not self._allocate(r, n, hit):
                break
            waiting.popleft()
            running.append(r)
            if r.num_preemptions:
                self.preempted_prefix_cache_queries += r.num_tokens
                self.preempted_prefix_cache_hits += hit_tokens
            else:
                self.prefix_cache_queries += r.num_tokens
                self.prefix_cache_hits += hit_tokens
            if r.cached_tokens < 0:
                r.cached_tokens = hit_tokens
            r.num_computed_tokens = hit_tokens
            batch.reqs.append(r)
            batch.counts.append(n)
            budget -= n
            kv_read += hit_tokens + n
            pairs += n * hit_tokens + n * (n + 1) * 0.5
        batch.budget, batch.kv_read, batch.pairs = budget, kv_read, pairs

    def _advance(self, batch: _Batch) -> StepResult:
        new_tokens: dict[str, int] = {}
        first: list[str] = []
        finished: list[FinishedRequest] = []
        prefill_tokens = 0
        max_len = self.max_model_len
        for r, n in zip(batch.reqs, batch.counts, strict=True):
            c = r.num_computed_tokens + n
            r.num_computed_tokens = c
            if c < r.num_tokens:
                prefill_tokens += n  # partial prefill chunk: nothing sampled
                continue
            if r.num_output_tokens == 0 or n > 1:
                prefill_tokens += n
            r.num_tokens += 1
            r.num_output_tokens += 1
            new_tokens[r.request_id] = 1
            if r.num_output_tokens == 1:
                first.append(r.request_id)
            if r.num_output_tokens >= r.max_output_tokens:
                finished.append(self._finished(r, r.finish_reason_at_max))
            elif r.num_tokens >= max_len:
                finished.append(self._finished(r, FINISH_LENGTH))
        num_tokens = self.max_num_batched_tokens - batch.budget
        num_sampled = len(new_tokens)
        duration = self.cost.step_time_s(num_tokens, len(batch.reqs), num_sampled, batch.kv_read, batch.pairs)
        if finished:
            by_id = self._by_id
            for f in finished:
                self.pool.free(by_id.pop(f.request_id))
            done = {f.request_id for f in finished}
            self._running = [r for r in self._running if r.request_id not in done]
        self.num_steps += 1
        self.busy_time_s += duration
        self.prefill_tokens_total += prefill_tokens
        self.generation_tokens_total += num_sampled
        return StepResult(duration, num_tokens, prefill_tokens, len(batch.reqs), new_tokens, tuple(first),
                          tuple(finished), tuple(batch.preempted))

    def _allocate(self, r: _Req, n: int, hit: int) -> bool:
        if self.enable_prefix_caching:
            return self.pool.allocate_slots(r, n, hit)
        # Without prefix caching nothing is hashed: only reserve the blocks.
        bs = self.block_size
        need = -(-(r.num_computed_tokens + n) // bs) - len(r.blocks)
        if need > self.pool.num_free_blocks:
            return False
        if need > 0:
            r.blocks.extend(self.pool.pop_free(need))
        return True
