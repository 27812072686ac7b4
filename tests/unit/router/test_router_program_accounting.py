"""``CoreConfig.accounting`` "program": the router core counts a ThunderAgent session as
ThunderAgent counts a program (vLLM's prompt + completion of its last request, the held prompt,
a running request's prompt plus its expected output), against the whole KV cache; the
``thunderagent-reserved`` baseline keeps TAO's reservations against the deployment's fraction."""

from __future__ import annotations

import pytest

from services.planner.core.registry import make_policy
from services.router.core.footprint import footprint_tokens, program_tokens
from services.router.core.model import CoreConfig, NewRequest, Replica, Usage
from services.router.core.state import RouterCore, admissible_fraction, core_config


def core_for(policy_name: str, kv: int = 10_000, configured: float = 0.95) -> RouterCore:
    c = RouterCore(core_config(make_policy(policy_name), configured))
    c.upsert_replica(Replica(id="r0", url="http://r0", kv_capacity_tokens=kv, healthy=True, models=("m",)), 0.0)
    return c


def ask(rid: str, sid: str, prompt: int, max_tokens: int = 100) -> NewRequest:
    return NewRequest(rid, sid, "A", False, prompt, max_tokens, "m")


def test_an_unknown_accounting_is_refused() -> None:
    with pytest.raises(ValueError, match="accounting"):
        CoreConfig(accounting="optimistic")


def test_thunderagent_counts_what_a_program_holds_and_tao_what_it_will_need() -> None:
    program = CoreConfig(accounting="program")
    reservation = CoreConfig()
    c = core_for("thunderagent", kv=100_000)
    assert c.arrive(0.0, ask("q0", "s0", 1000)) is not None
    s = c.sessions["s0"]
    # running: its prompt plus the output it is expected to reach (min(max_tokens, 256) before
    # any request has completed)
    assert program_tokens(s, program) == 1000 + 100
    assert c.used["r0"] == 1100
    c.finish(1.0, "q0", Usage(1000, 80, cached_tokens=0))
    c.arrive(5.0, ask("q1", "s0", 1500))
    c.finish(6.0, "q1", Usage(1500, 60, cached_tokens=0))
    s = c.sessions["s0"]
    # between requests: vLLM's prompt + completion of the last request, nothing reserved for the
    # next append (420 tokens last time) or the next output
    assert program_tokens(s, program) == 1560
    assert footprint_tokens(s, reservation) > 1560 + 400
    assert c.used["r0"] == 1560
    # a held request: its prompt (the driver's next turn, before it runs)
    c._put(c._unadmit(s, 7.0))
    c.arrive(8.0, ask("q2", "s0", 2400))
    assert program_tokens(c.sessions["s0"], program) == 2400


def test_thunderagent_admits_into_the_whole_cache_and_the_reserved_variant_into_its_fraction() -> None:
    assert admissible_fraction(make_policy("thunderagent"), 0.9) == 1.0
    assert admissible_fraction(make_policy("thunderagent-reserved"), 0.9) == 0.9
    assert admissible_fraction(make_policy("tao"), 0.9) == 0.9
    # 9,350 prompt tokens + 100 of output on a 10,000-token replica: ThunderAgent's arrival rule
    # needs its tokens plus one 100-token buffer free (9,550 ≤ 10,000, but not ≤ 9,500, 95 %)
    published = core_for("thunderagent")
    assert published.capacity("r0") == 10_000
    grant = published.arrive(0.0, ask("q0", "s0", 9_350))
    assert grant is not None and grant.replica == "r0"
    reserved = core_for("thunderagent-reserved")
    assert reserved.capacity("r0") == 9_500
    assert reserved.arrive(0.0, ask("q0", "s0", 9_350)) is None
    assert reserved.sessions["s0"].footprint_tokens == 9_350 + 100
