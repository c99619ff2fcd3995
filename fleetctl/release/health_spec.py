"""The health gates' part of a release spec (``health``): probes, warm-up, thresholds, canary.

Kept apart from ``spec.py`` (the rest of the spec), which re-exports these models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Strict(BaseModel):
    # A docstring under a field is its meaning: the release-spec reference is generated from them.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ProbeGate(Strict):
    symbol: str | None = None
    """A symbol that must be defined in ``package`` (``SpeculativeAlgorithm.DDTREE``)."""
    import_: str | None = Field(default=None, alias="import")
    """A module (``MODULE[:ATTR]``) that must import in the release's venv."""
    package: str = "sglang"
    """The installed package ``symbol`` is looked for in."""
    expect: Literal["present", "absent"] = "present"
    """Whether the symbol or import must be there or must not."""

    @model_validator(mode="after")
    def _one(self) -> ProbeGate:
        if (self.symbol is None) == (self.import_ is None):
            raise ValueError("a probe gate is either symbol: NAME or import: MODULE[:ATTR]")
        return self


class Threshold(Strict):
    """A bound on one number the server reports: a dotted ``field`` of a JSON answer, or a Prometheus
    ``metric`` of its ``/metrics`` (a gauge or counter as it is, a counter's ``rate`` or a histogram's
    ``quantile`` over a ``window``)."""

    field: str | None = None
    """A dotted field of the JSON answer (``internal_states.0.avg_spec_accept_length``); or give ``metric``."""
    metric: str | None = Field(default=None, pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
    """A sample name of the server's ``/metrics`` (``sglang:num_queue_reqs``); its matching series are summed."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Label matchers of ``metric``: only series with each of these labels equal are read."""
    rate: bool = False
    """``metric`` is a counter: its increase per second between two scrapes ``window`` seconds apart."""
    quantile: float | None = Field(default=None, ge=0, le=1)
    """``metric`` is a histogram: this quantile (0.99) of what it observed within ``window`` (or since start)."""
    window: float | None = Field(default=None, gt=0, le=3600)
    """Seconds between the two scrapes of ``rate`` or ``quantile``; read under live traffic, after the other gates."""
    path: str | None = None
    """The server path asked (``/server_info`` for ``field``, ``/metrics`` for ``metric``)."""
    min: float | None = None
    """The gate fails below this."""
    max: float | None = None
    """The gate fails above this."""
    timeout: float = Field(default=10.0, gt=0)
    """Seconds the server may take to answer; no answer by then fails the gate."""

    @model_validator(mode="after")
    def _field_or_metric(self) -> Threshold:
        if (self.field is None) == (self.metric is None):
            raise ValueError("a threshold reads either field: (a JSON answer) or metric: (/metrics), one of them")
        used = [k for k in ("labels", "rate", "quantile", "window") if getattr(self, k)]
        if self.field is not None and used:
            raise ValueError(f"{used[0]} is for a metric: threshold, not a field: one")
        if self.rate and self.quantile is not None:
            raise ValueError("rate (a counter) and quantile (a histogram): give one")
        if self.rate and self.window is None:
            raise ValueError("rate needs window: the seconds between the two scrapes")
        if self.window is not None and not self.rate and self.quantile is None:
            raise ValueError("window is for rate or quantile")
        return self

    @property
    def live(self) -> bool:
        """A metric over a window: read under live traffic, after the other gates (``live_canary.py``)."""
        return self.metric is not None and self.window is not None

    @property
    def asked(self) -> str:
        return self.path or ("/server_info" if self.field is not None else "/metrics")


class Warmup(Strict):
    """Generations sent once /health is 200, before the thresholds are read: a fresh SGLang has no
    acceptance length until it has served a speculative decode step."""

    requests: int = Field(default=3, ge=1, le=100)
    """Generations sent."""
    max_tokens: int = Field(default=64, ge=1, le=4096)
    """Tokens asked of each generation."""
    prompt: str = "Explain speculative decoding in one paragraph."
    """The prompt sent."""
    path: str = "/generate"
    """The server path (``/generate`` or ``/v1/completions``)."""
    timeout: float = Field(default=120.0, gt=0)
    """Seconds the whole warm-up may take (every request together); a server that has not answered
    by then fails the gate."""


class CanaryCheck(Strict):
    measure: Literal["ttft", "itl", "error_rate"]
    """``ttft`` (``sglang:time_to_first_token_seconds``), ``itl`` (``sglang:inter_token_latency_seconds``): a
    quantile of what each side observed in the window; ``error_rate``: ``sglang:num_aborted_requests_total``
    per ``sglang:num_requests_total``."""
    quantile: float | None = Field(default=None, gt=0, lt=1)
    """The quantile of ``ttft`` or ``itl`` compared (default 0.99)."""
    max_ratio: float = Field(ge=1)
    """The canary fails when its value is more than this times the baseline hosts' (1.5: 50% worse)."""

    @model_validator(mode="after")
    def _quantile_of_histogram(self) -> CanaryCheck:
        if self.measure == "error_rate" and self.quantile is not None:
            raise ValueError("quantile is for ttft or itl, not error_rate")
        return self


class CanaryBaseline(Strict):
    """Argo Rollouts' analysis with SGLang's own numbers: the canary host's ``/metrics`` and those of the
    rollout's hosts still on the release it replaced, scraped together twice ``window`` seconds apart
    under the same live traffic (behind a gateway the canary's worker goes back into rotation for it)."""

    window: float = Field(default=30.0, gt=0, le=3600)
    """Seconds between the two scrapes of every host."""
    min_requests: int = Field(default=1, ge=1)
    """Requests each side must have finished within the window; fewer and the canary fails (nothing to judge)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Label matchers applied to every metric read (``model_name``)."""
    checks: list[CanaryCheck] = Field(min_length=1)
    """What is compared, each with its allowed ratio."""


class Canary(Strict):
    """Canary analysis: the warm-up's numbers against the release that ran before on this host
    (``max_regression_percent``, the floors), and live ``/metrics`` against the hosts still on that
    release (``baseline``)."""

    max_regression_percent: float | None = Field(default=None, ge=0, le=100)
    """How much worse than the release that ran before (acceptance length, decode tokens/s) is allowed."""
    min_accept_length: float | None = Field(default=None, ge=0)
    """The lowest speculative acceptance length allowed."""
    min_decode_tps: float | None = Field(default=None, ge=0)
    """The lowest decode tokens/s allowed."""
    baseline: CanaryBaseline | None = None
    """Live comparison with the hosts still on the previous release (error rate, TTFT/ITL quantiles)."""

    @property
    def uses_warmup(self) -> bool:
        return any(v is not None for v in (self.max_regression_percent, self.min_accept_length,
                                            self.min_decode_tps))


class Health(Strict):
    path: str = "/health"
    """The path that must answer 200 after a restart."""
    timeout: float = Field(default=300.0, gt=0)
    """Seconds to wait for it (a model's load included)."""
    interval: float = Field(default=1.0, gt=0)
    """Seconds between two asks."""
    probes: list[ProbeGate] = Field(default_factory=list)
    """Probes of the installed release that must pass."""
    warmup: Warmup | None = None
    """Generations sent before the thresholds are read (needed by ``canary``)."""
    thresholds: list[Threshold] = Field(default_factory=list)
    """Bounds on fields of the server's JSON answers or on metrics of its ``/metrics``."""
    canary: Canary | None = None
    """The warm-up's numbers compared with the release that ran before on the host; live ``/metrics``
    compared with the rollout's hosts still on that release (``baseline``)."""

    @model_validator(mode="after")
    def _canary_measures(self) -> Health:
        if self.canary is not None and self.canary.uses_warmup and self.warmup is None:
            raise ValueError("canary compares the warm-up's numbers: give health.warmup too")
        return self
