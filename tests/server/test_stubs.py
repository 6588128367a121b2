"""The API contract: committed stubs match the .proto, every element is documented, one name per option."""
from __future__ import annotations

import dataclasses

from google.protobuf import descriptor_pb2

from seqserve import protogen
from seqserve.engine.request import SamplingParams
from seqserve.v1 import seqserve_pb2 as pb


def test_committed_stubs_are_what_the_proto_generates(tmp_path):
    fresh = protogen.generate(tmp_path)
    for path, generated in zip((protogen.PROTO_ROOT / g for g in protogen.GENERATED), fresh):
        assert path.read_bytes() == generated.read_bytes(), f"{path} is stale: run `make protos`"


def test_every_message_field_enum_value_and_method_has_a_comment(tmp_path):
    files = descriptor_pb2.FileDescriptorSet.FromString(protogen.descriptor_set(tmp_path / "d.pb").read_bytes())
    (proto,) = files.file
    assert proto.package == "seqserve.v1"
    documented = {tuple(loc.path) for loc in proto.source_code_info.location if loc.leading_comments.strip()}
    missing = []
    for i, message in enumerate(proto.message_type):  # FileDescriptorProto field 4; DescriptorProto.field is 2
        missing += [message.name] * ((4, i) not in documented)
        missing += [f"{message.name}.{f.name}" for j, f in enumerate(message.field) if (4, i, 2, j) not in documented]
    for i, enum in enumerate(proto.enum_type):  # field 5; EnumDescriptorProto.value is 2
        missing += [f"{enum.name}.{v.name}" for j, v in enumerate(enum.value) if (5, i, 2, j) not in documented]
        assert enum.value[0].number == 0 and enum.value[0].name.endswith("_UNSPECIFIED")
    for i, service in enumerate(proto.service):  # field 6; ServiceDescriptorProto.method is 2
        missing += [f"{service.name}.{m.name}" for j, m in enumerate(service.method) if (6, i, 2, j) not in documented]
    assert not missing, f"undocumented: {missing}"


def test_decoding_options_have_one_name_everywhere():
    from seqserve.cli.main import build_parser
    from seqserve.client.client import OPTION_NAMES

    proto = [f.name for f in pb.DecodingOptions.DESCRIPTOR.fields]
    assert set(proto) == {f.name for f in dataclasses.fields(SamplingParams)}
    assert list(OPTION_NAMES) == proto
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    assert set(proto) <= {a.dest for a in generate._actions}
