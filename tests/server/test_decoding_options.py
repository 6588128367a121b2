"""Decoding options (server/options.py): every float option has a range, reported by GetModelInfo; unset options take
the model's defaults; GetModelInfo's config values are typed (issue 16, items 1 and 17)."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import grpc
import pytest
from grpc_harness import request

from seqserve.client.client import Client
from seqserve.contract.decoding import FLOAT_RANGES
from seqserve.engine.limits import InvalidOption, Limits
from seqserve.engine.request import SamplingParams
from seqserve.server.options import sampling_params
from seqserve.v1 import seqserve_pb2 as pb

LIMITS = Limits(max_input_tokens=64, max_new_tokens=32, default_max_new_tokens=16, max_stop_strings=8,
                max_batch_inputs=64, max_batch_size=32, max_waiting=256, max_stop_string_bytes=256, max_stop_bytes=1024,
                max_receive_message_bytes=1 << 18, max_inflight_bytes=1 << 25, max_num_beams=8, max_top_logprobs=20)
# Extreme finite values of every float option (float32 on the wire), each just outside its range.
OUTSIDE = [("temperature", 100.5), ("temperature", 3.4e38), ("temperature", -1e-30),
           ("top_p", 1.0000001), ("top_p", -3.4e38), ("repetition_penalty", 100.5), ("repetition_penalty", -1e-30),
           ("repetition_penalty", 3.4e38), ("length_penalty", 10.5), ("length_penalty", -10.5),
           ("length_penalty", 1000.0), ("length_penalty", 1e30), ("length_penalty", -3.4e38)]
INSIDE = [("temperature", 100.0), ("temperature", 1e-30), ("top_p", 1e-30), ("repetition_penalty", 100.0),
          ("repetition_penalty", 1e-30), ("length_penalty", 10.0), ("length_penalty", -10.0)]


@pytest.mark.parametrize("name, value", OUTSIDE)
def test_every_float_option_outside_its_range_is_refused_naming_it(name, value):
    with pytest.raises(InvalidOption) as err:
        sampling_params(pb.DecodingOptions(**{name: value}), LIMITS)
    assert str(err.value).startswith(f"options.{name} must be") and str(FLOAT_RANGES[name]) in str(err.value)


@pytest.mark.parametrize("name, value", INSIDE)
def test_every_float_option_at_its_extremes_is_accepted(name, value):
    params = sampling_params(pb.DecodingOptions(**{name: value}), LIMITS)
    assert math.isclose(getattr(params, name), value, rel_tol=1e-6)


def test_unset_options_take_the_models_defaults_and_set_ones_win():
    defaults = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.2, min_new_tokens=2,
                              length_penalty=0.6, num_beams=1, early_stopping=True)
    got = sampling_params(pb.DecodingOptions(), LIMITS, defaults)
    assert (got.temperature, got.top_k, got.top_p, got.repetition_penalty, got.min_new_tokens, got.length_penalty,
            got.early_stopping) == (0.7, 40, pytest.approx(0.9), 1.2, 2, 0.6, True)
    assert got.max_new_tokens == LIMITS.default_max_new_tokens and got.seed is None
    greedy = sampling_params(pb.DecodingOptions(temperature=0, top_k=0, min_new_tokens=0, early_stopping=False),
                             LIMITS, defaults)
    assert (greedy.temperature, greedy.top_k, greedy.min_new_tokens, greedy.early_stopping) == (0.0, 0, 0, False)
    assert sampling_params(pb.DecodingOptions(), LIMITS) == SamplingParams(max_new_tokens=16, seed=None)


def test_an_unset_request_is_the_models_defaults_in_every_field_and_takes_the_given_seed():
    """sampling_params names every SamplingParams field: none falls back to the class's own default instead."""
    defaults = SamplingParams(max_new_tokens=LIMITS.default_max_new_tokens, min_new_tokens=1, temperature=0.5,
                              top_k=3, top_p=0.5, repetition_penalty=1.5, stop=("zz",), seed=None, num_beams=1,
                              num_return_sequences=1, length_penalty=0.5, early_stopping=True)
    assert sampling_params(pb.DecodingOptions(), LIMITS, defaults) == defaults
    assert sampling_params(pb.DecodingOptions(), LIMITS, defaults, seed=7) == dataclasses.replace(defaults, seed=7)
    assert sampling_params(pb.DecodingOptions(seed=9), LIMITS, defaults, seed=7).seed == 9  # a set seed wins


def test_a_huge_length_penalty_is_invalid_argument_and_the_ranges_are_in_model_info(served, heldout):
    for options in (dict(num_beams=2, length_penalty=1000), dict(return_logprobs=True, length_penalty=1e30)):
        with pytest.raises(grpc.RpcError) as err:
            served.stub.Generate(request(heldout[0][0], **options), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith("options.length_penalty must be finite and in [-10, 10], got 1")
    info = served.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    ranges = {k: (r.min, r.max, r.min_exclusive) for k, r in info.option_ranges.items()}
    assert ranges == {"temperature": (0, 100, False), "top_p": (0, 1, True), "repetition_penalty": (0, 100, True),
                      "length_penalty": (-10, 10, False)}
    for lp in (-10.0, 10.0):  # the extremes serve
        for options in (dict(num_beams=3), dict(return_logprobs=True)):
            r = served.stub.Generate(request(heldout[0][0], length_penalty=lp, **options), timeout=30)
            assert r.sequences[0].HasField("score") and math.isfinite(r.sequences[0].score)


def test_model_info_config_values_are_typed(served):
    info = served.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    kinds = {k: v.WhichOneof("kind") for k, v in info.config.items()}
    assert kinds["d_model"] == kinds["vocab_size"] == kinds["eos_id"] == "int_value"
    assert kinds["dropout"] == "double_value" and kinds["norm_first"] == "bool_value"
    manifest = served.model.manifest.model
    unset = {k for k, v in manifest.items() if v is None}  # d_kv of a model whose heads split d_model
    with Client(served.address) as client:
        config = client.model_info()["config"]
    set_ = {k: v for k, v in manifest.items() if k not in unset}
    assert config == set_ and all(type(config[k]) is type(v) for k, v in set_.items())
    assert not unset & set(config), "an unset option reached GetModelInfo"


# -- the model's defaults (server/model_defaults.py) as unset fields: a set value wins, an error names a set field --

SAMPLING = {"decoder_start_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.5, "top_k": 0,
            "top_p": 0.9}
EDGES = [  # a model's defaults at the limits of their ranges (contract/decoding.py), as the manifest accepts them
    {"length_penalty": 10.0}, {"length_penalty": -10.0}, {"repetition_penalty": 100.0},
    {"repetition_penalty": 1e-30}, {**SAMPLING, "temperature": 100.0, "top_p": 1e-30},
    {"num_beams": 4, "num_return_sequences": 4, "early_stopping": True, "min_new_tokens": 30, "max_new_tokens": 30},
]


def _defaults(**generation) -> SamplingParams:
    from seqserve.contract.generation import GenerationDefaults
    from seqserve.server.model_defaults import request_defaults

    full = GenerationDefaults.from_dict({"decoder_start_token_id": 1, "eos_token_id": 2, **generation}).to_dict()
    return request_defaults(full, LIMITS.default_max_new_tokens, LIMITS.max_num_beams)


def test_a_beam_request_on_a_sampling_model_gets_beam_search():
    """transformers' generate(num_beams=4): beams, not "temperature must be 0 ... got 0.5" about an unset field."""
    defaults = _defaults(**SAMPLING)
    unset = sampling_params(pb.DecodingOptions(), LIMITS, defaults)
    assert (unset.num_beams, unset.temperature, unset.top_k) == (1, 0.5, 0)  # the model samples
    beams = sampling_params(pb.DecodingOptions(num_beams=4, num_return_sequences=2), LIMITS, defaults)
    assert (beams.num_beams, beams.num_return_sequences, beams.temperature) == (4, 2, 0.0)
    with pytest.raises(InvalidOption, match=r"^options\.temperature must be 0 with num_beams > 1"):
        sampling_params(pb.DecodingOptions(num_beams=4, temperature=0.5), LIMITS, defaults)  # both set


def test_a_beam_request_on_a_model_with_a_repetition_penalty_names_what_it_set():
    defaults = _defaults(repetition_penalty=1.2)
    with pytest.raises(InvalidOption) as err:
        sampling_params(pb.DecodingOptions(num_beams=4), LIMITS, defaults)
    assert str(err.value).startswith("options.num_beams must be 1 with this model's repetition_penalty (1.2)")
    ok = sampling_params(pb.DecodingOptions(num_beams=4, repetition_penalty=1), LIMITS, defaults)
    assert (ok.num_beams, ok.repetition_penalty) == (4, 1.0)


@pytest.mark.parametrize("generation", EDGES, ids=[",".join(sorted(g)) for g in EDGES])
def test_no_request_fails_on_a_field_it_left_unset(generation):
    """Whatever in-range defaults a model has, a request that sets one valid field (or none) is accepted."""
    defaults = _defaults(**generation)
    requests = [{}, {"num_beams": 1}, {"num_beams": 4}, {"num_beams": 4, "repetition_penalty": 1.0},
                {"temperature": 0.7}, {"temperature": 0.0}, {"max_new_tokens": 1}, {"min_new_tokens": 0},
                {"length_penalty": 0.0}, {"early_stopping": False}, {"num_return_sequences": 1}, {"stop": ["x"]}]
    for fields in requests:
        try:
            sampling_params(pb.DecodingOptions(**fields), LIMITS, defaults)
        except InvalidOption as exc:  # only a rule of a field the request set may fail
            named = str(exc).split()[0].removeprefix("options.")
            assert named in fields, (fields, str(exc))


def test_a_set_value_wins_over_the_models_default_zero_and_false_included():
    defaults = _defaults(num_beams=4, early_stopping=True, min_new_tokens=3, length_penalty=2.0)
    assert (defaults.num_beams, defaults.early_stopping, defaults.min_new_tokens, defaults.length_penalty) == \
        (4, True, 3, 2.0)
    got = sampling_params(pb.DecodingOptions(early_stopping=False, min_new_tokens=0, length_penalty=0.0), LIMITS,
                          defaults)
    assert (got.num_beams, got.early_stopping, got.min_new_tokens, got.length_penalty) == (4, False, 0, 0.0)


def test_a_sampling_model_serves_a_beam_request_as_a_model_without_defaults(make_server, served, tiny_bundle,
                                                                            tmp_path, heldout):
    """Over gRPC: the same beams as the bundle without generation defaults (the oracle), not INVALID_ARGUMENT."""
    import hashlib
    import json
    import shutil

    from seqserve.contract.generation import GenerationDefaults
    from seqserve.contract.manifest import DIGEST, MANIFEST

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle, ignore=shutil.ignore_patterns("verified.json"))
    data = json.loads((bundle / MANIFEST).read_text())
    data["generation"] = GenerationDefaults(decoder_start_token_id=1, eos_token_id=2, do_sample=True,
                                            temperature=0.5, max_new_tokens=12).to_dict()
    blob = json.dumps(data, indent=2).encode()
    (bundle / MANIFEST).write_bytes(blob)
    (bundle / DIGEST).write_text(f"{hashlib.sha256(blob).hexdigest()}  {MANIFEST}\n")
    sampling = make_server(bundle=bundle)
    for source, _ in heldout[:5]:
        got = sampling.stub.Generate(request(source, num_beams=4, num_return_sequences=2, max_new_tokens=12),
                                     timeout=60)
        want = served.stub.Generate(request(source, num_beams=4, num_return_sequences=2, max_new_tokens=12),
                                    timeout=60)
        assert [list(s.token_ids) for s in got.sequences] == [list(s.token_ids) for s in want.sequences]


# Every option a model's generation_config.json gives a default for: one wording for "unset" everywhere.
WITH_MODEL_DEFAULTS = ("max_new_tokens", "min_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty",
                       "num_beams", "num_return_sequences", "length_penalty", "early_stopping")
WORDING = "unset = the model's default"


def _generate_parser():
    from seqserve.cli.main import build_parser

    return build_parser()._subparsers._group_actions[0].choices["generate"]


def test_help_proto_and_docs_say_unset_is_the_models_default(tmp_path):
    helps = {a.dest: " ".join(a.help.split()) for a in _generate_parser()._actions if a.dest in WITH_MODEL_DEFAULTS}
    assert sorted(helps) == sorted(WITH_MODEL_DEFAULTS)
    assert all(WORDING in text for text in helps.values()), helps
    from google.protobuf import descriptor_pb2

    from seqserve import protogen

    (proto,) = descriptor_pb2.FileDescriptorSet.FromString(
        protogen.descriptor_set(tmp_path / "d.pb").read_bytes()).file
    index = [m.name for m in proto.message_type].index("DecodingOptions")
    fields = [f.name for f in proto.message_type[index].field]
    comments = {fields[loc.path[3]]: " ".join(loc.leading_comments.split()).lower()
                for loc in proto.source_code_info.location
                if list(loc.path[:3]) == [4, index, 2] and len(loc.path) == 4}
    assert all(WORDING in comments[name] for name in WITH_MODEL_DEFAULTS), comments
    import_md = (Path(__file__).resolve().parents[2] / "docs" / "import.md").read_text()
    assert "0/false there means" not in import_md and "--no-early-stopping` overrides" in import_md


def test_the_cli_sends_an_option_only_when_given_zero_and_false_included():
    from seqserve.client.client import decoding_from_args, options

    parser = _generate_parser()
    none = options(**decoding_from_args(parser.parse_args(["x"])))
    assert none.ListFields() == []
    given = options(**decoding_from_args(parser.parse_args(
        ["x", "--no-early-stopping", "--min-new-tokens", "0", "--length-penalty", "0", "--temperature", "0"])))
    assert {f.name: v for f, v in given.ListFields()} == {"early_stopping": False, "min_new_tokens": 0,
                                                           "length_penalty": 0.0, "temperature": 0.0}
    # on the wire too: a server reads presence, so a model's early_stopping true is overridden
    assert pb.DecodingOptions.FromString(given.SerializeToString()).HasField("early_stopping")
