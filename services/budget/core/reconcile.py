"""Moving caps toward targets without breaking the budget invariants.

Both policies compute *targets* (where the caps should go); ``transfer`` moves toward them
under rules that hold for every policy. Two numbers per tenant (see ``model``): ``caps``
(slots held) and ``limits`` (admission ceilings). Invariants of every allocation:

1. ``sum(caps) == sum(limits) == B`` — slots only move between tenants.
2. ``caps[t] >= floor[t]`` and ``limits[t] >= floor[t]`` — floors are never lent out, so a
   tenant that turns busy can admit ``floor`` requests at once.
3. No preemption: a cap drops only by slots its tenant is not using,
   ``caps_new >= min(caps_old, max(floor, in_flight))``; after every tick
   ``caps[t] >= in_flight[t]`` (a tenant that used vacated slots is settled first).
4. A donor that is *using* slots above its target is drained: its limit drops below its cap
   (never below its target) so it stops refilling; the receiver's limit rises by the same
   amount (``limits[r] - caps[r]`` slots are *promised* to it). The router lets a receiver
   exceed its cap only into slots its donors have already vacated:
   ``sum_r max(0, in_flight[r] - caps[r]) < sum_d max(0, caps[d] - max(in_flight[d], limits[d]))``,
   so the in-flight total never exceeds B and nobody's own slots are borrowed, while a freed
   slot reaches the receiver the moment a request ends instead of at the next tick.
5. Bounded step: per tick a receiver's limit grows by at most ``step`` slots over what it
   could already admit (``max(previous limit, cap)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.budget.core.model import Allocation, BudgetConfig, Decision, TenantObservation
from services.budget.core.split import water_fill


def unused_slots(cap: int, floor: int, obs: TenantObservation | None) -> int:
    """Slots a tenant holds above its floor and above what it has in flight (0 when its
    in-flight count is unknown: only slots known to be free may move)."""
    if obs is None:
        return 0
    return max(0, cap - max(floor, obs.in_flight))


def unobserved_in_transit(previous: Allocation | None, observed: Mapping[str, TenantObservation]) -> list[str]:
    """Tenants with slots in transit (limit != cap: promised or draining) whose report is
    missing. Their in-flight count decides what may be settled, so the tick must hold."""
    if previous is None:
        return []
    return sorted(n for n, cap in previous.caps.items() if previous.limits[n] != cap and n not in observed)


def normalise(
    config: BudgetConfig,
    previous: Allocation | None,
    observed: Mapping[str, TenantObservation],
    initial: Mapping[str, int],
) -> tuple[dict[str, int], list[Decision]]:
    """Caps over ``config``'s tenants that sum to ``config.total`` and respect floors.

    With no previous allocation: ``initial``. With an unchanged configuration: the previous
    caps. After a reconfiguration (total, tenant set or floors changed): previous caps kept
    where possible, raised to floors, new slots split by weight over current caps, excess
    slots taken first where unused, then from the tenants furthest above their floor — the
    one case where a cap may fall below in-flight (the operator shrank the budget); the
    tenant then drains by waiting, nothing is preempted.
    """
    names = config.names
    floors = {t.name: t.floor for t in config.tenants}
    if previous is None:
        return dict(initial), [Decision("hold", f"initial split {_fmt(initial)}")]
    caps = {n: max(previous.caps.get(n, 0), floors[n]) for n in names}
    if previous.total == config.total and set(previous.caps) == set(names) and caps == dict(previous.caps):
        return caps, []
    weights = {t.name: t.weight for t in config.tenants}
    surplus = sum(caps.values()) - config.total
    if surplus < 0:
        caps = water_fill(config.total, weights, caps, {n: config.total for n in names})
        surplus = 0
    for name in sorted(names, key=lambda n: (-unused_slots(caps[n], floors[n], observed.get(n)), n)):
        take = min(surplus, unused_slots(caps[name], floors[name], observed.get(name)))
        caps[name] -= max(0, take)
        surplus -= max(0, take)
    while surplus > 0:
        name = max((n for n in names if caps[n] > floors[n]), key=lambda n: (caps[n] / weights[n], n))
        caps[name] -= 1
        surplus -= 1
    added = sorted(set(names) - set(previous.caps))
    removed = sorted(set(previous.caps) - set(names))
    reason = (
        f"reconfigured: total {previous.total}->{config.total}, added {added or 'none'}, "
        f"removed {removed or 'none'}; caps {_fmt(caps)}"
    )
    return caps, [Decision("hold", reason)]


def transfer(
    config: BudgetConfig,
    caps: Mapping[str, int],
    prev_limits: Mapping[str, int],
    observed: Mapping[str, TenantObservation],
    targets: Mapping[str, int],
    receivers: Sequence[str],
    step: int,
    receiver_why: Mapping[str, str],
) -> tuple[dict[str, int], dict[str, int], list[Decision]]:
    """Settle slots receivers already use, move unused slots from tenants above target to
    ``receivers`` (in the given priority order), then drain busy donors for what is still
    missing. Returns (caps, limits, decisions). Donors: idle ones first, then the furthest
    above target."""
    floors = {t.name: t.floor for t in config.tenants}
    new = dict(caps)
    decisions: list[Decision] = []
    free = {n: unused_slots(new[n], floors[n], observed.get(n)) for n in config.names}

    # 1. settlement: slots a receiver already uses (vacated by its donors) become its own. A
    # draining donor vacated only the slots between its limit and its cap (the router's rule,
    # ``may_admit``), so those are settled first, each donor's from its own; only an overdraft
    # they do not explain (in-flight counts reported between two admissions) takes other unused
    # slots. Settling from the donor with the most free slots instead took more than a donor owed:
    # a tenant draining one slot to its target lost two, below its target.
    vacated = {n: max(0, new[n] - max(floors[n], prev_limits.get(n, new[n]),
                                      observed[n].in_flight if n in observed else new[n]))
               for n in config.names}
    for r in config.names:
        over = (observed[r].in_flight - new[r]) if r in observed else 0
        for pool in (vacated, free):
            for d in sorted(config.names, key=lambda n: (prev_limits.get(n, new[n]) >= new[n], -pool[n], n)):
                k = min(over, pool[d], free[d]) if d != r else 0
                if k <= 0:
                    continue
                new[r] += k
                new[d] -= k
                free[d] -= k
                vacated[d] = max(0, vacated[d] - k)
                over -= k
                decisions.append(Decision("move", f"settle: {r} already runs {k} requests in slots {d} vacated",
                                          to_tenant=r, from_tenant=d, slots=k))

    excess = {n: max(0, new[n] - targets[n]) for n in config.names}

    def idle_first(n: str) -> tuple[bool, int, str]:
        obs = observed.get(n)
        return (obs is None or obs.demand > 0, -excess[n], n)

    donors = sorted((n for n in config.names if excess[n] > 0), key=idle_first)
    give = {d: min(free[d], excess[d]) for d in donors}
    want = {r: min(targets[r], max(prev_limits.get(r, caps[r]), caps[r]) + step) for r in receivers}
    # 2. moves of unused slots
    for r in receivers:
        for d in donors:
            k = min(want[r] - new[r], give[d])
            if k <= 0:
                continue
            new[r] += k
            new[d] -= k
            give[d] -= k
            decisions.append(Decision("move", f"{receiver_why[r]}; {_donor_why(d, new[d] + k, targets[d], observed.get(d))}",
                                      to_tenant=r, from_tenant=d, slots=k))
    # 3. drains: promise a donor's busy slots above its target to the receiver
    limits = dict(new)
    for r in receivers:
        for d in donors:
            k = min(want[r] - limits[r], limits[d] - max(targets[d], floors[d]))
            if k <= 0:
                continue
            limits[d] -= k
            limits[r] += k
            obs = observed.get(d)
            busy = obs.in_flight if obs is not None else new[d]
            decisions.append(Decision(
                "drain",
                f"{receiver_why[r]}; {d} is using its slots (in flight {busy}, cap {new[d]}, target {targets[d]}): "
                f"its limit {limits[d] + k}->{limits[d]}, {r} takes the slots as {d}'s requests finish",
                to_tenant=r, from_tenant=d, slots=k,
            ))
    return new, limits, decisions


def _donor_why(name: str, cap: int, target: int, obs: TenantObservation | None) -> str:
    if obs is None:
        return f"{name} unobserved"
    if obs.demand == 0:
        return f"{name} idle (cap {cap}, target {target})"
    return f"{name} above target (in flight {obs.in_flight}, cap {cap}, target {target})"


def _fmt(caps: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{n}: {caps[n]}" for n in sorted(caps)) + "}"
