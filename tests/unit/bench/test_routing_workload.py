"""The routing benchmark's workload: reproducible, the system prompt shared
within a tenant and distinct across tenants, turns in conversation order."""

from __future__ import annotations

import os

import pytest

from bench.routing_workload import WorkloadSpec, make_workload


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def test_same_seed_same_workload_other_seed_other_workload() -> None:
    spec = WorkloadSpec(turns=40, seed=7)
    assert make_workload(spec) == make_workload(spec)
    other = make_workload(WorkloadSpec(turns=40, seed=8))
    assert other.system_prompts != make_workload(spec).system_prompts
    assert [t.question for t in other.turns] != [t.question for t in make_workload(spec).turns]


def test_prefix_shared_within_a_tenant_distinct_across_tenants() -> None:
    workload = make_workload(WorkloadSpec(tenants=4, users_per_tenant=3, turns=36))
    first_turns = [t for t in workload.turns if t.turn == 0]
    systems: dict[str, set[str]] = {}
    for turn in first_turns:
        messages = workload.messages(turn, [])
        assert messages[0]["role"] == "system" and messages[-1] == {"role": "user", "content": turn.question}
        systems.setdefault(turn.tenant, set()).add(messages[0]["content"])
    # every user of a tenant sends the very same system prompt
    assert sorted(systems) == ["t0", "t1", "t2", "t3"]
    assert all(len(texts) == 1 for texts in systems.values())
    prompts = [next(iter(texts)) for texts in systems.values()]
    # long (the router hashes 256-character blocks), and apart from the first
    # block on: no two tenants share a prefix block
    assert all(len(p) > 2500 for p in prompts)
    assert max(_common_prefix(a, b) for i, a in enumerate(prompts) for b in prompts[i + 1 :]) < 64


def test_turns_in_order_and_histories_grow() -> None:
    spec = WorkloadSpec(tenants=2, users_per_tenant=2, turns=11)
    workload = make_workload(spec)
    assert len(workload.turns) == 11 and [t.index for t in workload.turns] == list(range(11))
    by_conversation: dict[str, list[int]] = {}
    for turn in workload.turns:
        by_conversation.setdefault(turn.conversation, []).append(turn.turn)
    assert all(turns == list(range(len(turns))) for turns in by_conversation.values())
    assert sorted(len(t) for t in by_conversation.values()) == [2, 3, 3, 3]  # as even as 11 / 4 allows
    # the first round has every conversation, so both tenants, interleaved
    assert len({t.tenant for t in workload.turns[:4]}) == 2
    last = max(workload.turns, key=lambda t: t.turn)
    answers = [f"answer {i}" for i in range(last.turn)]
    messages = workload.messages(last, answers)
    assert len(messages) == 1 + 2 * last.turn + 1
    assert [m["content"] for m in messages if m["role"] == "assistant"] == answers
    # turn k's request starts with turn k-1's request (the cacheable prefix)
    earlier = next(t for t in workload.turns if t.conversation == last.conversation and t.turn == last.turn - 1)
    assert messages[:-2] == workload.messages(earlier, answers[:-1])
    with pytest.raises(ValueError):
        workload.messages(last, answers[:-1])


def test_bad_spec_refused() -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(turns=0)
    with pytest.raises(ValueError):
        WorkloadSpec(tenants=99)
