"""Server settings: one typed dataclass, filled from flags and SEQSERVE_* environment variables (flags win).

Every field is a flag (`--max-batch-size`) and an environment variable (`SEQSERVE_MAX_BATCH_SIZE`); both are
validated at start, before anything is loaded, with errors that name the flag and the variable.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from seqserve.contract.devices import DEVICES
from seqserve.contract.manifest import VARIANTS

ENV_PREFIX = "SEQSERVE_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_MAX_NEW_TOKENS = 64  # used when a request leaves max_new_tokens unset (clipped to the cap)


class SettingsError(ValueError):
    """A setting that cannot work: the message names its flag and environment variable."""


def _opt(default, help: str, **extra):
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class Settings:
    bundle: Path | None = _opt(None, "bundle directory written by `seqserve export` (required)", type=Path)
    host: str = _opt("0.0.0.0", "address the gRPC server binds")
    port: int = _opt(50051, "gRPC port (0 picks a free one and logs it)", type=int)
    metrics_port: int = _opt(9090, "Prometheus /metrics HTTP port (0 picks a free one; -1 disables)", type=int)
    variant: str = _opt("fp32", "precision variant of the bundle to serve", choices=VARIANTS)
    device: str = _opt("auto", "onnxruntime execution provider: auto = CUDA when it works, else CPU",
                       choices=DEVICES)
    intra_op_threads: int = _opt(0, "onnxruntime intra-op threads (0 = one per core)", type=int)
    inter_op_threads: int = _opt(1, "onnxruntime inter-op threads", type=int)
    allow_spinning: bool = _opt(True, "let idle onnxruntime threads spin (off helps on shared cores)", type=bool)
    cuda_tf32: bool = _opt(False, "CUDA: TF32 tensor-core matmuls for fp32 (faster, ~1e-2 logit error)", type=bool)
    max_batch_size: int = _opt(32, "rows in one decoder step", type=int)
    max_waiting: int = _opt(256, "queued requests beyond which calls get RESOURCE_EXHAUSTED", type=int)
    max_kv_tokens: int = _opt(65_536, "KV-cache budget in token slots: rows x (longest source + largest "
                                      "max_new_tokens) stays within it", type=int)
    max_input_tokens: int | None = _opt(None, "longest input in tokens (default: the model's max_positions)",
                                        type=int)
    max_new_tokens: int | None = _opt(None, "largest max_new_tokens a request may ask (default: the bundle's)",
                                      type=int)
    default_max_new_tokens: int | None = _opt(None, f"max_new_tokens of requests that leave it unset "
                                              f"(default: {DEFAULT_MAX_NEW_TOKENS}, at most the cap)", type=int)
    max_stop_strings: int = _opt(8, "most stop strings in one request", type=int)
    max_batch_inputs: int = _opt(64, "most inputs in one GenerateBatch call", type=int)
    grace_seconds: float = _opt(20.0, "on SIGTERM/SIGINT, how long in-flight requests may take to finish",
                                type=float)
    log_level: str = _opt("INFO", "logging level", choices=LOG_LEVELS)

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise SettingsError("; ".join(problems))

    def _problems(self):
        if self.bundle is None:
            yield f"the bundle is required: --bundle or {env_name('bundle')}"
        elif not (Path(self.bundle) / "manifest.json").is_file():
            yield f"bundle {self.bundle}: no manifest.json there (--bundle / {env_name('bundle')})"
        for name, lo, hi in (("port", 0, 65535), ("metrics_port", -1, 65535), ("intra_op_threads", 0, None),
                             ("inter_op_threads", 0, None), ("max_batch_size", 1, None), ("max_waiting", 1, None),
                             ("max_kv_tokens", 1, None), ("max_input_tokens", 1, None), ("max_new_tokens", 1, None),
                             ("default_max_new_tokens", 1, None), ("max_stop_strings", 0, None),
                             ("max_batch_inputs", 1, None), ("grace_seconds", 0, None)):
            value = getattr(self, name)
            if value is not None and (value < lo or (hi is not None and value > hi)):
                yield f"{_names(name)} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}"
        if self.max_batch_inputs > self.max_waiting:
            yield (f"{_names('max_batch_inputs')} ({self.max_batch_inputs}) exceeds {_names('max_waiting')} "
                   f"({self.max_waiting}): such a batch could never be queued")
        for name, choices in (("variant", VARIANTS), ("device", DEVICES), ("log_level", LOG_LEVELS)):
            if getattr(self, name) not in choices:
                yield f"{_names(name)} must be one of {choices}, got {getattr(self, name)!r}"

    def limits(self, model_max_positions: int, bundle_max_new_tokens: int) -> Limits:
        """The request limits once the bundle is known; refuses caps beyond what the model supports."""
        max_input = self.max_input_tokens or model_max_positions
        if max_input > model_max_positions:
            raise SettingsError(f"{_names('max_input_tokens')} {max_input} exceeds the model's max_positions "
                                f"({model_max_positions})")
        cap = self.max_new_tokens or bundle_max_new_tokens
        if cap > bundle_max_new_tokens:
            raise SettingsError(f"{_names('max_new_tokens')} {cap} exceeds the bundle's max_new_tokens "
                                f"({bundle_max_new_tokens})")
        default = self.default_max_new_tokens or min(DEFAULT_MAX_NEW_TOKENS, cap)
        if default > cap:
            raise SettingsError(f"{_names('default_max_new_tokens')} {default} exceeds the cap ({cap})")
        return Limits(max_input, cap, default, self.max_stop_strings, self.max_batch_inputs,
                      self.max_batch_size, self.max_waiting)


@dataclass(frozen=True)
class Limits:
    """What a request may ask for, resolved against the bundle (GetModelInfo reports these)."""

    max_input_tokens: int
    max_new_tokens: int
    default_max_new_tokens: int
    max_stop_strings: int
    max_batch_inputs: int
    max_batch_size: int
    max_waiting: int


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _names(name: str) -> str:
    return f"{_flag(name)} / {env_name(name)}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field; unset flags stay absent so the environment and the defaults can fill them."""
    for f in fields(Settings):
        meta = dict(f.metadata)
        default = "" if f.default is None else f"; default {f.default}"
        help_text = f"{meta.pop('help')} [env {env_name(f.name)}{default}]"
        kind = meta.pop("type", str)
        if kind is bool:
            parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
        else:
            parser.add_argument(_flag(f.name), type=kind, default=argparse.SUPPRESS, help=help_text, **meta)


def _parse_env(f, raw: str):
    kind = f.metadata.get("type", str)
    try:
        if kind is bool:
            if raw.strip().lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(raw)
            return raw.strip().lower() in ("1", "true", "yes", "on")
        return kind(raw)
    except ValueError:
        raise SettingsError(f"{env_name(f.name)}={raw!r} is not a valid {kind.__name__}") from None


def load(flags: dict | argparse.Namespace | None = None, environ: dict | None = None) -> Settings:
    """Flags (only those given) override SEQSERVE_* variables, which override the defaults."""
    flags = vars(flags) if isinstance(flags, argparse.Namespace) else dict(flags or {})
    environ = os.environ if environ is None else environ
    values = {}
    for f in fields(Settings):
        if f.name in flags and flags[f.name] is not None:
            values[f.name] = flags[f.name]
        elif environ.get(env_name(f.name), "") != "":
            values[f.name] = _parse_env(f, environ[env_name(f.name)])
    if values.get("bundle") is not None:
        values["bundle"] = Path(values["bundle"])
    return Settings(**values)
