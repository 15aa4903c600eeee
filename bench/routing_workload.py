"""The routing benchmark's workload: multi-tenant, shared prefix, multi-turn.

Every tenant has one long system prompt (deterministic English-like text,
distinct from the first words on), several users per tenant hold
conversations with it, and each turn of a conversation sends the whole
conversation so far: the system prompt, every earlier question and answer,
and a new question. The order of the turns is fixed by the seed: round by
round, every conversation that still has turns left takes one, in a shuffled
order, so consecutive requests come from different tenants.

No network and no tokenizer: the text is built from a fixed word list."""

from __future__ import annotations

import random
from dataclasses import dataclass

_WORDS = (
    "account access approval archive audit balance billing branch budget calendar campaign catalogue "
    "certificate channel claim client compliance contract coverage customer dashboard deadline delivery "
    "department deposit device discount dispatch document employee escalation estimate exception expense "
    "facility feedback filing forecast freight guarantee handover holiday incident inventory invoice "
    "ledger licence location maintenance manager meeting membership milestone network notice onboarding "
    "order outage package partner payment payroll pension permit policy portal premium procedure product "
    "project purchase quota rebate receipt record refund region release renewal report request reservation "
    "resource review risk roster schedule service shipment signature subscription supplier support survey "
    "team technician ticket timesheet training transfer upgrade vendor voucher warehouse warranty workflow"
).split()
_VERBS = (
    "check",
    "confirm",
    "record",
    "review",
    "approve",
    "escalate",
    "document",
    "verify",
    "update",
    "explain",
    "summarise",
    "schedule",
    "reject",
    "forward",
    "archive",
    "prioritise",
)
_QUALIFIERS = (
    "within two working days",
    "before the end of the month",
    "only after a written request",
    "unless a manager objects",
    "for every new customer",
    "in the regional office",
    "during the quarterly review",
    "as soon as possible",
    "with the standard form",
    "when the amount exceeds the limit",
    "for international orders",
    "on the first request",
)
_COMPANIES = (
    "Northwind Logistics",
    "Blue Harbor Insurance",
    "Cedar Valley Clinics",
    "Orion Retail Group",
    "Silverline Energy",
    "Maple Street Bank",
    "Quantum Freightways",
    "Redwood Learning",
)
_QUESTIONS = (
    "How do I {verb} a {a} for a {b}?",
    "What is the rule for a {a} when the {b} is late?",
    "Who should {verb} the {a} of my {b}?",
    "Can you {verb} my {a} and the {b} today?",
    "Why was my {a} refused by the {b} team?",
    "When will the {a} for my {b} be ready?",
)


@dataclass(frozen=True)
class WorkloadSpec:
    tenants: int = 4
    users_per_tenant: int = 4
    turns: int = 48  # turns (requests) in total, over all conversations
    system_words: int = 520  # per tenant's system prompt: 620-680 tokens with SmolLM2's tokenizer
    seed: int = 20261201

    def __post_init__(self) -> None:
        if min(self.tenants, self.users_per_tenant, self.turns, self.system_words) <= 0:
            raise ValueError("tenants, users_per_tenant, turns and system_words must be > 0")
        if self.tenants > len(_COMPANIES):
            raise ValueError(f"at most {len(_COMPANIES)} tenants")

    @property
    def conversations(self) -> int:
        return self.tenants * self.users_per_tenant


@dataclass(frozen=True)
class Turn:
    index: int  # its place in the request sequence
    tenant: str  # "t0"
    conversation: str  # "t0-u1": also the request's `user`
    turn: int  # 0-based, within its conversation
    question: str


@dataclass(frozen=True)
class Workload:
    spec: WorkloadSpec
    system_prompts: dict[str, str]  # tenant -> its system prompt
    turns: tuple[Turn, ...]

    def messages(self, turn: Turn, answers: list[str]) -> list[dict[str, str]]:
        """The chat request of `turn`: the conversation's earlier turns, each
        with the answer it got (`answers`, in order), then the new question."""
        previous = [t for t in self.turns if t.conversation == turn.conversation and t.turn < turn.turn]
        if len(answers) != len(previous):
            raise ValueError(
                f"{turn.conversation} turn {turn.turn}: {len(previous)} answers needed, got {len(answers)}"
            )
        messages = [{"role": "system", "content": self.system_prompts[turn.tenant]}]
        for earlier, answer in zip(previous, answers):
            messages += [{"role": "user", "content": earlier.question}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": turn.question})
        return messages


def system_prompt(tenant: int, words: int, seed: int) -> str:
    """About `words` words of rules for one tenant; different text per tenant
    from the first sentence on (its company name opens it)."""
    rng = random.Random(f"{seed}/system/{tenant}")
    company = _COMPANIES[tenant]
    sentences = [f"You are the support assistant of {company}. Answer briefly and follow these rules."]
    count = len(sentences[0].split())
    rule = 1
    while count < words:
        a, b = rng.sample(_WORDS, 2)
        sentence = (
            f"Rule {rule}: staff at {company} {rng.choice(_VERBS)} each {a} linked to a {b} "
            f"{rng.choice(_QUALIFIERS)}, and {rng.choice(_VERBS)} the {rng.choice(_WORDS)} "
            f"{rng.choice(_QUALIFIERS)}."
        )
        sentences.append(sentence)
        count += len(sentence.split())
        rule += 1
    return " ".join(sentences)


def make_workload(spec: WorkloadSpec) -> Workload:
    prompts = {f"t{t}": system_prompt(t, spec.system_words, spec.seed) for t in range(spec.tenants)}
    conversations = [(f"t{t}", f"t{t}-u{u}") for t in range(spec.tenants) for u in range(spec.users_per_tenant)]
    # the turns per conversation: as even as the total allows
    left = {
        c: spec.turns // len(conversations) + (i < spec.turns % len(conversations))
        for i, (_, c) in enumerate(conversations)
    }
    rng = random.Random(f"{spec.seed}/order")
    turns: list[Turn] = []
    done = dict.fromkeys(left, 0)
    while len(turns) < spec.turns:
        round_ = [pair for pair in conversations if done[pair[1]] < left[pair[1]]]
        rng.shuffle(round_)
        for tenant, conversation in round_:
            template = rng.choice(_QUESTIONS)
            a, b = rng.sample(_WORDS, 2)
            question = template.format(verb=rng.choice(_VERBS), a=a, b=b)
            turns.append(
                Turn(
                    len(turns),
                    tenant,
                    conversation,
                    done[conversation],
                    f"{question} (case {conversation}-{done[conversation]})",
                )
            )
            done[conversation] += 1
    return Workload(spec, prompts, tuple(turns))
