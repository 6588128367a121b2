"""Service-level objectives a load test can be held to: each is a flag, and a missed one fails the command."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from seqserve.client.flags import flag as _flag
from seqserve.loadtest.summary import Summary


def _slo(help: str, measure, upper: bool):
    """upper: the limit is a ceiling (max_*), else a floor (min_*)."""
    return field(default=None, metadata={"help": help, "measure": measure, "upper": upper})


@dataclass(frozen=True)
class Slo:
    """None = not checked. A limit that has nothing to measure (no calls, no streams) counts as missed."""

    max_p50_ms: float | None = _slo("p50 latency of whole calls, ms", lambda s: s.latency_ms["p50"], True)
    max_p99_ms: float | None = _slo("p99 latency of whole calls, ms", lambda s: s.latency_ms["p99"], True)
    max_ttft_p99_ms: float | None = _slo("p99 time to first token of streams, ms",
                                         lambda s: s.time_to_first_token_ms["p99"], True)
    max_failure_rate: float | None = _slo("failed calls / calls, in [0, 1]",
                                          lambda s: s.failure_rate if s.requests else None, True)
    min_rps: float | None = _slo("completed calls per second", lambda s: s.requests_per_s, False)
    min_tokens_per_s: float | None = _slo("generated tokens per second", lambda s: s.generated_tokens_per_s, False)

    @classmethod
    def from_args(cls, args) -> Slo:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    @classmethod
    def add_arguments(cls, parser) -> None:
        group = parser.add_argument_group("SLOs (a missed one makes the command exit 1 and names it)")
        for f in fields(cls):
            bound = "most" if f.metadata["upper"] else "least"
            group.add_argument(_flag(f.name), type=float, help=f"at {bound}: {f.metadata['help']}")

    def check(self, summary: Summary) -> dict[str, dict]:
        """flag -> {limit, value, met} for every SLO that is set."""
        verdicts = {}
        for f in fields(self):
            limit = getattr(self, f.name)
            if limit is None:
                continue
            value = f.metadata["measure"](summary)
            met = value is not None and (value <= limit if f.metadata["upper"] else value >= limit)
            verdicts[_flag(f.name)] = {"limit": limit, "value": value, "met": met}
        return verdicts

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


def missed(verdicts: dict[str, dict]) -> list[str]:
    """One line per missed SLO, naming its flag."""
    return [f"SLO missed: {flag} {v['limit']:g} (measured {_value(v['value'])})"
            for flag, v in verdicts.items() if not v["met"]]


def _value(value: float | None) -> str:
    return "nothing" if value is None else f"{value:g}"
