"""Server settings: one typed dataclass, filled from flags and SEQSERVE_* environment variables (flags win).

Every field is a flag (`--max-batch-size`) and an environment variable (`SEQSERVE_MAX_BATCH_SIZE`); both are
validated at start, before anything is loaded, with errors that name the flag and the variable.
docs/security.md describes every limit and security setting.
"""
from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from seqserve.client.flags import DEFAULT_PORT, parse_bool
from seqserve.client.flags import flag as _flag
from seqserve.contract.decoding import MAX_NUM_BEAMS
from seqserve.contract.devices import DEVICES
from seqserve.contract.manifest import VARIANTS
from seqserve.contract.names import KV_CACHES
from seqserve.engine.limits import Limits
from seqserve.engine.remote.cpus import cpu_problem
from seqserve.engine.remote.engine_watch import NOT_READY_SECONDS, RESTART_SECONDS
from seqserve.engine.request import SamplingParams
from seqserve.engine.step.scheduler import SchedulerConfig as _Sched

ENV_PREFIX = "SEQSERVE_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_MAX_NEW_TOKENS = SamplingParams.max_new_tokens  # when a request leaves it unset (clipped to the cap)
DEFAULT_METRICS_PORT = 50052  # beside gRPC's; 9090-9999 are Prometheus's and its exporters' (docs/deploy.md#ports)
MIN_TOKEN_CHARS = 16  # shorter bearer tokens are refused at start: they could be guessed
KiB, MiB = 1 << 10, 1 << 20
EMPTY_IS_SET = ("auth_tokens", "auth_token_file")  # set but empty is refused, not unset: it would turn auth off
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a model's name: a health service and label value too


class SettingsError(ValueError):
    """A setting that cannot work: the message names its flag and environment variable."""


def _opt(default, help: str, repr: bool = True, **extra):
    return field(default=default, repr=repr, metadata={"help": help, **extra})


@dataclass(frozen=True)
class Settings:
    bundle: Path | tuple[str, ...] | None = _opt(
        None, "a bundle directory written by `seqserve export`, served under the directory's name; NAME=DIR names "
              "it. Repeat it to serve several models (the variable: comma-separated). This or --model-repository is "
              "required", type=str, action="append")
    model_repository: Path | None = _opt(None, "a directory whose every verified bundle subdirectory is a model named "
                                               "after it (hidden ones are skipped); SIGHUP re-reads it: new and "
                                               "changed bundles are loaded, removed ones drain", type=Path)
    memory_budget_bytes: int = _opt(0, "host memory all served models may take together (GetModelInfo.memory_bytes "
                                       "each); a model beyond it is refused at load. 0 = no budget", type=int)
    bind: str = _opt("127.0.0.1", "address the gRPC server binds: 127.0.0.1 = this machine only; containers set "
                                  "0.0.0.0")
    port: int = _opt(DEFAULT_PORT, "gRPC port (0 picks a free one and logs it)", type=int)
    metrics_bind: str = _opt("127.0.0.1", "address the Prometheus /metrics endpoint binds (its own, so it can stay "
                                          "private while gRPC is public)")
    metrics_port: int = _opt(DEFAULT_METRICS_PORT, "Prometheus /metrics HTTP port (0 picks a free one; -1 disables)",
                             type=int)
    tls_cert_file: Path | None = _opt(None, "PEM certificate chain: gRPC serves TLS only (needs --tls-key-file)",
                                      type=Path)
    tls_key_file: Path | None = _opt(None, "PEM private key of --tls-cert-file", type=Path)
    tls_client_ca_file: Path | None = _opt(None, "PEM CA certificates: mutual TLS, every client must present a "
                                                 "certificate they signed (needs --tls-cert-file)", type=Path)
    auth_token_file: Path | None = _opt(None, "file of accepted bearer tokens, one per line (# comments; "
                                              "surrounding whitespace is stripped): calls without one get "
                                              "UNAUTHENTICATED", type=Path)
    auth_tokens: str | None = _opt(None, "accepted bearer tokens, comma-separated (surrounding whitespace is "
                                         "stripped); set the variable rather than the flag, which other users can "
                                         "read in the process list", repr=False)
    auth_exempt_health: bool = _opt(True, "health checks answer without a token (probes, load balancers)", type=bool)
    max_health_watches: int = _opt(256, "health Watch streams open at once (they need no token by default); more "
                                        "get RESOURCE_EXHAUSTED", type=int)
    reflection: bool = _opt(True, "serve gRPC reflection (grpcurl list/describe); needs a token when auth is on",
                            type=bool)
    variant: str = _opt("fp32", "precision variant of the bundle to serve", choices=VARIANTS)
    kv_cache: str = _opt("auto", "decoder graph and KV cache: inplace (decoder_inplace.onnx, K/V written in place), "
                                 "concat (plain decoder.onnx), auto = inplace when the bundle has it on the CPU, "
                                 "or on CUDA with float16 buffers (the fp16 variant)",
                         choices=KV_CACHES)
    device: str = _opt("auto", "onnxruntime execution provider: auto = CUDA when it works, else CPU",
                       choices=DEVICES)
    intra_op_threads: int = _opt(0, "onnxruntime intra-op threads (0 = one per core)", type=int)
    inter_op_threads: int = _opt(1, "onnxruntime inter-op threads", type=int)
    allow_spinning: bool = _opt(True, "let idle onnxruntime threads spin (off helps on shared cores)", type=bool)
    cuda_tf32: bool = _opt(False, "CUDA: TF32 tensor-core matmuls for fp32 (faster, ~1e-2 logit error)", type=bool)
    cuda_graphs: bool = _opt(False, "CUDA with the in-place cache: capture the decoder step as one CUDA graph per "
                                    "batch bucket at warm-up and replay it (ignored on the CPU)", type=bool)
    engine_process: bool = _opt(False, "run each model's engine in a process of its own, reached over ZeroMQ: a "
                                       "crash there ends its calls UNAVAILABLE and restarts it, the gRPC process "
                                       "lives on", type=bool)
    front_ends: int = _opt(1, "with --engine-process: gRPC front-end processes sharing --port and each model's engine "
                              "process; /metrics of front end i on --metrics-port + i", type=int)
    engine_cpus: str = _opt("", "with --engine-process: the CPUs the engine processes run on, as taskset -c writes "
                                "them (0 or 0,2-3); empty: the server's own")
    engine_not_ready_seconds: float = _opt(NOT_READY_SECONDS, "with --engine-process: an engine process that answers "
                                                              "nothing (no step report, no heartbeat) this long "
                                                              "makes its model not ready (health NOT_SERVING, new "
                                                              "calls UNAVAILABLE)", type=float)
    engine_restart_seconds: float = _opt(RESTART_SECONDS, "with --engine-process: an engine process silent this long "
                                                          "is killed and started again; its calls end UNAVAILABLE",
                                         type=float)
    max_batch_size: int = _opt(_Sched.max_batch_size, "rows in one decoder step", type=int)
    max_waiting: int = _opt(_Sched.max_waiting, "queued requests beyond which calls get RESOURCE_EXHAUSTED",
                            type=int)
    max_kv_tokens: int = _opt(_Sched.max_kv_tokens, "KV-cache budget in token slots: rows x (longest source + "
                                                     "largest max_new_tokens) stays within it", type=int)
    stream_interval: int = _opt(1, "GenerateStream sends a message every this many tokens (and at the end): 1 = "
                                   "every token; more cuts the per-message gRPC cost when many streams run at once",
                                type=int)
    encode_batch: int = _opt(_Sched.encode_batch, "encode-ahead: most waiting sources one encoder call takes when a "
                                                   "joining row has no encoder output yet", type=int)
    max_encoded_bytes: int = _opt(_Sched.max_encoded_bytes, "encode-ahead: cross-attention K/V bytes held for "
                                                             "waiting requests", type=int)
    max_input_tokens: int | None = _opt(None, "longest input in tokens (default: the model's max_positions)",
                                        type=int)
    max_new_tokens: int | None = _opt(None, "largest max_new_tokens a request may ask (default: the bundle's)",
                                      type=int)
    default_max_new_tokens: int | None = _opt(None, f"max_new_tokens of requests that leave it unset "
                                              f"(default: {DEFAULT_MAX_NEW_TOKENS}, at most the cap)", type=int)
    max_stop_strings: int = _opt(8, "most stop strings in one request", type=int)
    max_stop_string_bytes: int = _opt(256, "longest stop string in UTF-8 bytes", type=int)
    max_stop_bytes: int = _opt(1024, "all stop strings of one request together, in UTF-8 bytes", type=int)
    max_receive_message_bytes: int = _opt(256 * KiB, "largest request message gRPC accepts (larger ones get "
                                                     "RESOURCE_EXHAUSTED before they are decoded); it bounds what "
                                                     "each concurrent call can make the server hold", type=int)
    max_inflight_bytes: int = _opt(32 * MiB, "request payload bytes held by all calls in flight, queued or running "
                                             "(a running row keeps its request too); a call beyond it gets "
                                             "RESOURCE_EXHAUSTED", type=int)
    max_pending_calls: int = _opt(10_000, "calls gRPC may hold before the event loop takes them (a burst arrives "
                                          "faster than it is taken); each then gets the service's answer, e.g. "
                                          "RESOURCE_EXHAUSTED when the queue is full. Beyond it gRPC itself ends "
                                          "calls CANCELLED, uncounted", type=int)
    max_batch_inputs: int = _opt(64, "most inputs in one GenerateBatch call", type=int)
    max_num_beams: int = _opt(8, "largest num_beams a request may ask; each beam is a row of the running batch, "
                                 "so the cap is also at most --max-batch-size", type=int)
    max_top_logprobs: int = _opt(20, "largest top_logprobs a request may ask", type=int)
    grace_seconds: float = _opt(20.0, "on SIGTERM/SIGINT, how long in-flight requests may take to finish; calls "
                                      "still in flight then get UNAVAILABLE", type=float)
    drain_backlog_seconds: float = _opt(2.0, "on SIGTERM/SIGINT, once the calls in flight have ended: how long at most "
                                             "the server holds new calls, waiting for a 0.1 s pause in their arrival, "
                                             "before it stops and answers them UNAVAILABLE; time the machine stalls "
                                             "the process is not counted, up to as much again", type=float)
    log_level: str = _opt("INFO", "logging level", choices=LOG_LEVELS)

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise SettingsError("; ".join(problems))

    def _problems(self):
        specs = [self.bundle] if isinstance(self.bundle, (str, Path)) else list(self.bundle or ())
        if len(specs) == 1 and not _named(str(specs[0])):  # one plain directory stays a Path
            object.__setattr__(self, "bundle", Path(specs[0]))
        elif specs:  # NAME=DIR specs, or several directories
            object.__setattr__(self, "bundle", tuple(map(str, specs)))
        if not self.bundle and self.model_repository is None:
            yield f"the bundle is required: --bundle or {env_name('bundle')} (or --model-repository)"
        elif self.bundle and self.model_repository is not None:
            yield f"{_names('bundle')} and {_names('model_repository')} exclude each other"
        elif self.model_repository is not None and not Path(self.model_repository).is_dir():
            yield f"{_names('model_repository')}: no directory at {self.model_repository}"
        else:
            try:
                for name, path in self.bundles().items():
                    if not (path / "manifest.json").is_file():
                        yield f"bundle {path}: no manifest.json there (model {name!r}; --bundle / {env_name('bundle')})"
            except SettingsError as exc:
                yield str(exc)
        for name, lo, hi in (("port", 0, 65535), ("metrics_port", -1, 65535), ("intra_op_threads", 0, None),
                             ("inter_op_threads", 0, None), ("max_batch_size", 1, None), ("max_waiting", 1, None),
                             ("max_kv_tokens", 1, None), ("encode_batch", 1, None), ("stream_interval", 1, None),
                             ("max_encoded_bytes", 0, None), ("max_input_tokens", 1, None), ("max_new_tokens", 1, None),
                             ("default_max_new_tokens", 1, None), ("max_stop_strings", 0, None),
                             ("max_batch_inputs", 1, None), ("max_num_beams", 1, MAX_NUM_BEAMS),
                             ("max_top_logprobs", 0, None), ("max_health_watches", 0, None),
                             ("max_pending_calls", 1, None), ("memory_budget_bytes", 0, None), ("front_ends", 1, 64),
                             ("grace_seconds", 0, None), ("drain_backlog_seconds", 0, None),
                             ("engine_not_ready_seconds", 1, 86400), ("engine_restart_seconds", 2, 86400),
                             ("max_stop_string_bytes", 1, None), ("max_stop_bytes", 1, None),
                             ("max_receive_message_bytes", 1024, None), ("max_inflight_bytes", 1024, None)):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and lo <= value and (hi is None or value <= hi)):
                yield f"{_names(name)} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}"
        for small, large, why in (("max_batch_inputs", "max_waiting", "such a batch could never be queued"),
                                  ("max_receive_message_bytes", "max_inflight_bytes",
                                   "a call of the largest accepted size could never be admitted"),
                                  ("engine_not_ready_seconds", "engine_restart_seconds",
                                   "a silent engine is restarted only after it is marked not ready")):
            if getattr(self, small) > getattr(self, large):
                yield (f"{_names(small)} ({getattr(self, small)}) exceeds {_names(large)} ({getattr(self, large)}): "
                       f"{why}")
        if self.front_ends > 1 and not self.engine_process:
            yield f"{_names('front_ends')} {self.front_ends} needs {_names('engine_process')}: the front ends share " \
                  "each model's engine process"
        if self.engine_cpus and (problem := cpu_problem(self.engine_cpus)):
            yield f"{_names('engine_cpus')}: {problem}"
        yield from self._security_problems()
        for name, choices in (("variant", VARIANTS), ("kv_cache", KV_CACHES), ("device", DEVICES),
                              ("log_level", LOG_LEVELS)):
            if getattr(self, name) not in choices:
                yield f"{_names(name)} must be one of {choices}, got {getattr(self, name)!r}"

    def _security_problems(self):
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            yield f"TLS needs both {_names('tls_cert_file')} and {_names('tls_key_file')}"
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            yield f"{_names('tls_client_ca_file')} (mutual TLS) needs {_names('tls_cert_file')} as well"
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "auth_token_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                yield f"{_names(name)}: no file at {path}"
        try:
            self.tokens()
        except SettingsError as exc:
            yield str(exc)

    def bundles(self) -> dict[str, Path]:
        """The --bundle models by name, in the order given (empty with --model-repository: repository.scan)."""
        models: dict[str, Path] = {}
        for spec in [self.bundle] if isinstance(self.bundle, Path) else self.bundle or ():
            name, path = bundle_spec(str(spec))
            if name in models:
                raise SettingsError(f"model {name!r} is named twice ({_names('bundle')}): name them apart with "
                                    "NAME=DIR")
            models[name] = path
        return models

    def tokens(self) -> frozenset[str]:
        """The accepted bearer tokens (empty: authentication is off), from the file and the variable together."""
        tokens = [t.strip() for t in (self.auth_tokens or "").split(",") if t.strip()]
        if self.auth_tokens is not None and not tokens:  # "", " " or "," must not quietly turn authentication off
            raise SettingsError(f"{_names('auth_tokens')} holds no token (it is empty, or only commas or "
                                "whitespace); unset it to turn authentication off")
        path = self.auth_token_file
        if path is not None and Path(path).is_file():
            lines = [line.strip() for line in Path(path).read_text().splitlines()]
            from_file = [line for line in lines if line and not line.startswith("#")]
            if not from_file:
                raise SettingsError(f"{_names('auth_token_file')}: {path} holds no token")
            tokens += from_file
        short = sum(len(t) < MIN_TOKEN_CHARS for t in tokens)
        if short:
            raise SettingsError(f"{short} bearer token(s) shorter than {MIN_TOKEN_CHARS} characters "
                                f"({_names('auth_tokens')}, {_names('auth_token_file')}): use random ones, e.g. "
                                "`openssl rand -hex 32`")
        return frozenset(tokens)

    def limits(self, model_max_positions: int, bundle_max_new_tokens: int, model_default: int | None = None) -> Limits:
        """The request limits once the bundle is known; refuses caps beyond what the model supports. model_default:
        the model's own max_new_tokens default (generation_config's max_length - 1), used unless this sets one."""
        max_input = self.max_input_tokens or model_max_positions
        if max_input > model_max_positions:
            raise SettingsError(f"{_names('max_input_tokens')} {max_input} exceeds the model's max_positions "
                                f"({model_max_positions})")
        cap = self.max_new_tokens or bundle_max_new_tokens
        if cap > bundle_max_new_tokens:
            raise SettingsError(f"{_names('max_new_tokens')} {cap} exceeds the bundle's max_new_tokens "
                                f"({bundle_max_new_tokens})")
        default = self.default_max_new_tokens or min(model_default or DEFAULT_MAX_NEW_TOKENS, cap)
        if default > cap:
            raise SettingsError(f"{_names('default_max_new_tokens')} {default} exceeds the cap ({cap})")
        return Limits(max_input_tokens=max_input, max_new_tokens=cap, default_max_new_tokens=default,
                      max_stop_strings=self.max_stop_strings, max_batch_inputs=self.max_batch_inputs,
                      max_batch_size=self.max_batch_size, max_waiting=self.max_waiting,
                      max_stop_string_bytes=self.max_stop_string_bytes, max_stop_bytes=self.max_stop_bytes,
                      max_receive_message_bytes=self.max_receive_message_bytes,
                      max_inflight_bytes=self.max_inflight_bytes,
                      max_num_beams=min(self.max_num_beams, self.max_batch_size),
                      max_top_logprobs=self.max_top_logprobs)


def bundle_spec(spec: str) -> tuple[str, Path]:
    """`NAME=DIR` or `DIR` -> (name, path). A bare directory is named after itself, as a model repository names its
    subdirectories (Triton's convention), so `--bundle artifacts/bundle` serves the model `bundle`."""
    name, _, path = spec.partition("=")
    if not _named(spec):
        name, path = os.path.basename(os.path.abspath(spec)), spec
    if not MODEL_NAME.fullmatch(name):
        either = f" (and no directory {spec} exists)" if _named(spec) and "/" in name else ""
        raise SettingsError(f"model name {name!r} ({_names('bundle')}: {spec}): use letters, digits, '.', '_' and "
                            f"'-', starting with a letter or digit{either}")
    return name, Path(path)


def _named(spec: str) -> bool:
    """Whether a --bundle value is NAME=DIR: it holds "=" and is not itself an existing path (a directory whose name
    holds "="), so a bad NAME (`bad/name=DIR`) is refused with the naming rule rather than looked for as a path."""
    return "=" in spec and not os.path.exists(spec)


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


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
            return parse_bool(raw)
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
        elif f.name in EMPTY_IS_SET and env_name(f.name) in environ:
            raise SettingsError(f"{env_name(f.name)} is set but empty: unset it to turn authentication off")
    if isinstance(values.get("bundle"), str):  # the variable: comma-separated specs
        values["bundle"] = tuple(spec.strip() for spec in values["bundle"].split(",") if spec.strip())
    if values.get("model_repository") is not None:
        values["model_repository"] = Path(values["model_repository"])
    return Settings(**values)
