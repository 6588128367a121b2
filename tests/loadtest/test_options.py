"""Decoding options have one name from the proto to the client, `seqserve generate` and `seqserve loadtest`."""
from __future__ import annotations

import pytest

from seqserve.cli.main import build_parser
from seqserve.client.client import OPTION_NAMES, decoding_from_args
from seqserve.loadtest.driver import LoadTest, parse_duration


def _flags(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return {flag for action in sub._actions for flag in action.option_strings}


def test_generate_and_loadtest_take_the_protos_option_names():
    proto_flags = {"--" + name.replace("_", "-") for name in OPTION_NAMES}
    assert proto_flags <= _flags("generate") and proto_flags <= _flags("loadtest")
    args = build_parser().parse_args(["loadtest", "--max-new-tokens", "5", "--stop", "a", "--stop", "b",
                                      "--temperature", "0.5", "--num-beams", "4", "--length-penalty", "0.6",
                                      "--no-early-stopping", "--return-logprobs", "--top-logprobs", "2"])
    assert decoding_from_args(args) == {"max_new_tokens": 5, "min_new_tokens": None, "temperature": 0.5,
                                        "top_k": None, "top_p": None, "repetition_penalty": None,
                                        "stop": ["a", "b"], "seed": None, "num_beams": 4,
                                        "num_return_sequences": None, "length_penalty": 0.6,
                                        "early_stopping": False, "return_logprobs": True, "top_logprobs": 2}


def test_web_ui_strings_become_typed_options():
    class Form:  # locust's web UI hands custom parameters back as strings, "" when left empty
        max_new_tokens, min_new_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed = \
            "7", "", "0.5", "", "", "", "END", ""
        num_beams, num_return_sequences, length_penalty, early_stopping, return_logprobs, top_logprobs = \
            "3", "", "", "false", "true", ""

    assert {k: v for k, v in decoding_from_args(Form).items() if v is not None} == \
        {"max_new_tokens": 7, "temperature": 0.5, "stop": ["END"], "num_beams": 3, "early_stopping": False,
         "return_logprobs": True}
    Form.return_logprobs = "maybe"
    with pytest.raises(ValueError, match="not a boolean"):
        decoding_from_args(Form)


def test_locust_command_line_carries_the_options(tmp_path):
    decoding = {"max_new_tokens": 4, "stop": ["-", "x"], "seed": None, "num_beams": 2, "early_stopping": True,
                "return_logprobs": False}
    test = LoadTest(target="h:1", heldout=tmp_path / "heldout.tsv", users=2, duration_s=parse_duration("1m5s"),
                    decoding=decoding)
    argv = test.locust_argv(tmp_path)
    assert argv[argv.index("--run-time") + 1] == "65s"
    assert {"--max-new-tokens=4", "--stop=-", "--stop=x", "--num-beams=2", "--early-stopping",
            "--no-return-logprobs"} <= set(argv) and not any("seed" in a for a in argv)
    flags = argv[argv.index("--tags") + 1 + len(test.methods):]  # what locust parses back into options
    back = decoding_from_args(build_parser().parse_args(["loadtest", *flags]))
    assert {k: v for k, v in back.items() if v is not None} == {k: v for k, v in decoding.items() if v is not None}
    with pytest.raises(ValueError, match="duration"):
        parse_duration("5 minutes")


def test_seqserve_loadtest_hands_its_connection_flags_to_locust(tmp_path):
    """`seqserve loadtest --ca-file ... --token-file ...` reaches the locust users (they open the channels)."""
    from seqserve.loadtest.driver import LoadTest

    args = build_parser().parse_args(["loadtest", "--heldout", str(tmp_path), "--ca-file", "ca.pem", "--token-file",
                                      "token.txt", "--tls-server-name", "seqserve.test"])
    (tmp_path / "heldout.tsv").write_text("a\tb\n")
    argv = LoadTest.from_args(args).locust_argv(tmp_path)
    for flag, value in (("--ca-file", "ca.pem"), ("--token-file", "token.txt"), ("--tls-server-name", "seqserve.test")):
        assert argv[argv.index(flag) + 1] == value
    assert "--cert-file" not in argv and "--tls" not in argv  # unset flags are not passed


def test_a_language_mix_reaches_locust_and_cycles_call_by_call(tmp_path):
    """`seqserve loadtest --source-language en_XX --languages fr_XX,de_DE`: locust gets both flags, and the
    workload's calls ask for the target languages in turn."""
    import random

    from seqserve.loadtest.workload import Workload, target_languages

    (tmp_path / "heldout.tsv").write_text("a\tb\n")
    args = build_parser().parse_args(["loadtest", "--heldout", str(tmp_path), "--source-language", "en_XX",
                                      "--languages", "fr_XX, de_DE"])
    argv = LoadTest.from_args(args).locust_argv(tmp_path)
    assert argv[argv.index("--source-language") + 1] == "en_XX"
    assert argv[argv.index("--languages") + 1] == "fr_XX,de_DE"
    assert "--languages" not in LoadTest(target="h:1", heldout=tmp_path / "heldout.tsv").locust_argv(tmp_path)
    workload = Workload(["a"], source_language="en_XX", target_languages=target_languages("fr_XX,de_DE"))
    calls = [workload.request(random.Random(0)) for _ in range(3)]
    assert [(c.source_language, c.target_language) for c in calls] == [("en_XX", "fr_XX"), ("en_XX", "de_DE"),
                                                                       ("en_XX", "fr_XX")]
    assert Workload(["a"]).request(random.Random(0)).target_language == ""
    assert {"--source-language", "--target-language"} <= _flags("generate")
