"""The router's KV block index (``services/router/core/kv_index.py``) against the engine model's
true block residency (``services/sim/engine``), over random workloads: after every step the index's
resident hashes (with reference counts) equal the engine's cached blocks, and the prefix a
session's prompt tokens match equals ``Engine.resident_prefix_blocks`` — also after a run of
dropped batches has been detected as a gap and refilled from a replay buffer."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from services.router.core.kv_index import KVBlockIndex, PrefixTracker, block_digests
from services.sim.engine import Engine, EngineRequest, get_profile
from services.sim.engine.tokens import ChainCache, SyntheticContent

PROFILE = get_profile("qwen3-32b-h100x2")
BS = PROFILE.block_size


def _batch(events: list) -> KVEventBatch:  # type: ignore[type-arg]
    return decode_batch(encode_batch(KVEventBatch(0.0, events)))  # through the wire form


def _check(index: KVBlockIndex, engine: Engine, contents: Sequence[tuple[SyntheticContent, int]],
           tracker: PrefixTracker | None = None) -> None:
    assert index.resident("r") == engine.pool.cached_hash_counts()
    if tracker is not None:
        tracker.sync()
    for k, (content, tokens) in enumerate(contents):
        digests = block_digests(content.token_ids(0, tokens), BS)
        want = engine.resident_prefix_blocks(content, tokens)
        if "r" not in index.replicas:  # no event yet: unknown, not "nothing"
            assert index.prefix_blocks("r", digests) is None and want == 0
        else:
            assert index.prefix_blocks("r", digests) == want
            if tracker is not None:  # the incremental matcher agrees
                if str(k) not in tracker.chains:
                    tracker.set_chain(str(k), digests)
                assert tracker.matched(str(k), "r") == want


workloads = st.lists(
    st.tuples(
        st.integers(0, 5),  # session
        st.sampled_from([None, "sysA", "sysB"]),  # shared system prompt
        st.integers(1, 700),  # prompt tokens
        st.integers(1, 60),  # output tokens
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(work=workloads, blocks=st.integers(40, 160), drop=st.tuples(st.integers(0, 200), st.integers(1, 30)),
       concurrency=st.integers(1, 6))
def test_index_matches_engine_residency_with_a_replayed_gap(
    work: list[tuple[int, str | None, int, int]], blocks: int, drop: tuple[int, int], concurrency: int
) -> None:
    engine = Engine(PROFILE, num_gpu_blocks=blocks, max_model_len=(blocks - 1) * BS)
    engine.enable_kv_events()
    chains = ChainCache()
    index = KVBlockIndex()
    tracker = PrefixTracker(index)
    buffer: list[KVEventBatch] = []  # the publisher's replay buffer
    drop_from, drop_len = drop
    expected_gap = False
    contents: list[tuple[SyntheticContent, int]] = []
    pending = list(enumerate(work))
    while pending or engine.has_work():
        while pending and engine.num_running + engine.num_waiting < concurrency:
            i, (sess, shared, prompt, out) = pending.pop(0)
            prompt = min(prompt, engine.max_model_len - out - 1)
            if prompt < 1:
                continue
            content = chains.synthetic(f"s{sess}", shared, 64 if shared else 0)
            engine.add_request(EngineRequest(f"q{i}", content, prompt, out))
            contents.append((content, prompt + out))
        engine.step()
        events = engine.take_kv_events()
        if not events:
            continue
        seq = len(buffer)
        buffer.append(_batch(events))
        if drop_from <= seq < drop_from + drop_len:
            expected_gap = True  # lost on the way: the index must notice at the next batch
            continue
        offer = index.offer("r", seq, buffer[seq])
        if offer.outcome == "gap":
            assert expected_gap and offer.expected == drop_from
            for s in range(offer.expected, len(buffer)):  # replay from the first missing seq
                index.offer("r", s, buffer[s], live=False)
            expected_gap = False
        else:
            assert offer.outcome == "applied"
        if not expected_gap:
            _check(index, engine, contents, tracker)
    if expected_gap:  # the drop was the tail: a replay at the end still catches up
        for s in range(index.expected("r"), len(buffer)):
            index.offer("r", s, buffer[s], live=False)
    _check(index, engine, contents, tracker)
    # A replay of everything again changes nothing (duplicates).
    for s, b in enumerate(buffer):
        assert index.offer("r", s, b, live=False).outcome == "duplicate"
    _check(index, engine, contents)


def test_shared_system_prompt_counts_for_every_session() -> None:
    engine = Engine(PROFILE, num_gpu_blocks=400)
    engine.enable_kv_events()
    chains = ChainCache()
    a = chains.synthetic("a", "sys", 256)
    engine.add_request(EngineRequest("q0", a, 300, 4))
    while engine.has_work():
        engine.step()
    index = KVBlockIndex()
    index.offer("r", 0, _batch(engine.take_kv_events()))
    b = chains.synthetic("b", "sys", 256)  # never ran: only the shared 256 tokens are resident
    digests = block_digests(b.token_ids(0, 400), BS)
    assert index.prefix_blocks("r", digests) == 256 // BS == engine.resident_prefix_blocks(b, 400)


def test_sequence_rules() -> None:
    index = KVBlockIndex()
    stored = _batch([BlockStored([1, 2], None, list(range(32)), 16, None)])
    assert index.prefix_blocks("r", [1]) is None  # nothing known yet
    first = index.offer("r", 3, stored)
    assert (first.outcome, first.expected) == ("gap", 0)  # must start from seq 0
    assert index.offer("r", 0, stored, live=False).outcome == "applied"  # replayed from 0
    assert index.synced("r")
    assert index.resident("r") == {1: 1, 2: 1}
    assert index.offer("r", 0, stored, live=False).outcome == "duplicate"
    gap = index.offer("r", 5, _batch([BlockRemoved([1])]))
    assert (gap.outcome, gap.expected) == ("gap", 1)
    assert index.resident("r") == {1: 1, 2: 1}  # nothing applied past a gap
    # replay could not supply 1..4: give up, follow from 5, blocks unknown until a clear
    index.resync("r", 5)
    assert not index.synced("r") and index.prefix_blocks("r", [1]) is None
    assert index.offer("r", 5, _batch([BlockRemoved([1])]), live=False).outcome == "applied"  # the held batch
    assert index.offer("r", 6, _batch([AllBlocksCleared()])).outcome == "applied"
    assert index.synced("r") and index.resident("r") == {}
    # a live batch a replay already delivered is a duplicate, not a restart
    index.offer("r", 7, _batch([]), live=False)
    assert index.offer("r", 7, _batch([])).outcome == "duplicate"
    assert index.resident("r") == {}
    # a live seq going backwards: the publisher restarted, counting from 0 again
    restart = index.offer("r", 0, stored)
    assert restart.outcome == "applied" and restart.restarted
    assert index.resident("r") == {1: 1, 2: 1}
    with pytest.raises(ValueError):
        index.offer("r", -1, stored)
    # a replay socket with nothing buffered: nothing was ever published, the cache is known empty
    index.start_empty("fresh")
    assert index.synced("fresh") and index.prefix_blocks("fresh", [1]) == 0
    assert index.offer("fresh", 0, stored).outcome == "applied" and index.resident("fresh") == {1: 1, 2: 1}
    index.start_empty("fresh")  # too late to mean anything: ignored
    assert index.resident("fresh") == {1: 1, 2: 1}


def test_duplicate_hash_needs_two_removals() -> None:
    index = KVBlockIndex()
    toks = list(range(16))
    index.offer("r", 0, _batch([BlockStored([7], None, toks, 16, None), BlockStored([7], None, toks, 16, None)]))
    d = block_digests(toks, 16)
    index.offer("r", 1, _batch([BlockRemoved([7])]))
    assert index.prefix_blocks("r", d) == 1
    index.offer("r", 2, _batch([BlockRemoved([7])]))
    assert index.prefix_blocks("r", d) == 0 and index.resident("r") == {}


def test_block_digests_are_chained_and_reject_bad_block_size() -> None:
    a = block_digests(list(range(40)), 16)
    assert len(a) == 2
    assert block_digests(list(range(32)), 16) == a
    assert block_digests([0] * 16 + list(range(16, 32)), 16)[1] != a[1]  # parent content matters
    with pytest.raises(ValueError):
        block_digests([1], 0)


def test_observe_kv_sets_replaces_and_withdraws_only_kv_evidence() -> None:
    from services.common.core.evidence import CacheEvidence
    from services.router.core.cache import observe_kv

    usage = CacheEvidence("r0", "cached_tokens", 900, 800, 0, 900, 1.0)
    ev = observe_kv((usage,), "r0", 320, 2.0)
    assert ev is not None and ev[0] is usage and (ev[1].kind, ev[1].resident_tokens, ev[1].observed_at_s) == (
        "kv_events", 320, 2.0)
    assert observe_kv(ev, "r0", 320, 3.0) is None  # unchanged: nothing to write
    ev2 = observe_kv(ev, "r0", 0, 3.0)
    assert ev2 is not None and [e.resident_tokens for e in ev2 if e.kind == "kv_events"] == [0]
    assert observe_kv(ev2, "r0", None, 4.0) == (usage,)  # stream lost: back to the usage estimate
    assert observe_kv((usage,), "r1", None, 4.0) is None


def test_explain_shows_kv_events_credit_undecayed() -> None:
    from services.router.core.explain import explain_session
    from services.router.core.model import CoreConfig, NewRequest, PlanDecision, Replica, Usage
    from services.router.core.state import RouterCore

    core = RouterCore(CoreConfig())
    for rid in ("r0", "r1"):
        core.upsert_replica(Replica(id=rid, url=f"http://{rid}", kv_capacity_tokens=10_000, healthy=True), 0.0)
    core.arrive(0.0, NewRequest("q0", "s1", "A", False, 1000, 100))
    core.apply_plan(0.1, PlanDecision((("s1", "r1"),), (), 0.1, "planner rev 1"))
    (g,) = core.dispatch(0.1)
    core.finish(2.0, g.request_id, Usage(1000, 100, 0))
    assert core.observe_kv_residency(2.0, "s1", "r0", 256)  # a shared prefix on the other replica
    assert core.observe_kv_residency(2.0, "s1", "r1", 992)
    assert not core.observe_kv_residency(3.0, "s1", "r1", 992)  # unchanged
    assert not core.observe_kv_residency(3.0, "s1", "r9", 16)  # unknown replica
    credit = {c.replica: c for c in explain_session(core, "s1", 12.0, 1012.0).credits}
    assert (credit["r0"].evidence, credit["r0"].credit_tokens) == ("kv_events", 256)
    assert (credit["r1"].evidence, credit["r1"].credit_tokens) == ("kv_events", 992)  # 10 s later: not decayed
    core.upsert_replica(Replica(id="r0", url="http://r0", kv_capacity_tokens=10_000, healthy=False), 12.0)
    assert not any(e.replica == "r0" for e in core.sessions["s1"].cache)  # a failed replica's evidence goes
    assert not core.observe_kv_residency(12.0, "s1", "r0", 256)  # and its events do not bring it back
    assert core.observe_kv_residency(12.0, "s1", "r1", None)  # stream lost: back to the usage estimate
    credit = {c.replica: c for c in explain_session(core, "s1", 12.0, 1012.0).credits}
    assert (credit["r1"].evidence, credit["r1"].credit_tokens) == ("cached_tokens", 550)
