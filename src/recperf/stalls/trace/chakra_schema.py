"""Chakra's execution-trace schema and framing: the message classes built at run time from a
descriptor with Chakra's package, message names and field numbers (``schema/protobuf/et_def.proto``
of github.com/mlcommons/chakra), so Chakra's tools read what recperf writes and no protoc step is
needed; each message is prefixed by its varint length; and plain-value nodes (``EtNode``)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recperf.core.errors import ConfigError

# protobuf ships no type hints: its modules are Any here, and only plain values leave this file.
descriptor_pb2: Any = importlib.import_module("google.protobuf.descriptor_pb2")
descriptor_pool: Any = importlib.import_module("google.protobuf.descriptor_pool")
message_factory: Any = importlib.import_module("google.protobuf.message_factory")

SCHEMA_VERSION = "1.0.0"
"""``GlobalMetadata.version`` written: Chakra's schema version whose generator writes it."""
NODE_TYPES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE",
              "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")  # fmt: skip
COMM_TYPES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST",
              "ALL_TO_ALL", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")  # fmt: skip
COMP_NODE = NODE_TYPES.index("COMP_NODE")
COMM_COLL_NODE = NODE_TYPES.index("COMM_COLL_NODE")
ALL_REDUCE = COMM_TYPES.index("ALL_REDUCE")

AttrValue = bool | int | float | str
AttrRead = AttrValue | bytes | list[AttrValue | bytes] | None
"""An attribute as read back: any of Chakra's scalar kinds, a ``<kind>_list``'s values, or None
when no value is set."""
LIST_KINDS = ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
              "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes")  # fmt: skip
"""AttributeProto's value kinds in field order: ``<kind>_val`` is field 3 + 2i, ``<kind>_list``
field 4 + 2i."""


def _file_descriptor() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="et_def.proto", package="ChakraProtoMsg", syntax="proto3"
    )
    f = descriptor_pb2.FieldDescriptorProto
    opt, rep = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    scalar = {k: getattr(f, f"TYPE_{k.upper()}") for k in LIST_KINDS}

    def message(name: str, fields: Sequence[tuple[str, int, int, int, str]]) -> Any:
        msg = fdp.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            field = msg.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                field.type_name = type_name
        return msg

    attr = message("AttributeProto", [("name", 1, opt, f.TYPE_STRING, ""),
                                      ("doc_string", 2, opt, f.TYPE_STRING, "")])  # fmt: skip
    attr.oneof_decl.add(name="value")
    for i, kind in enumerate(LIST_KINDS):
        list_name = f"{kind.capitalize()}List"
        message(list_name, [("values", 1, rep, scalar[kind], "")])
        attr.field.add(name=f"{kind}_val", number=3 + 2 * i, label=opt, type=scalar[kind],
                       oneof_index=0)  # fmt: skip
        attr.field.add(name=f"{kind}_list", number=4 + 2 * i, label=opt, type=f.TYPE_MESSAGE,
                       type_name=f".ChakraProtoMsg.{list_name}", oneof_index=0)  # fmt: skip
    attr_type = ".ChakraProtoMsg.AttributeProto"
    message("GlobalMetadata", [("version", 1, opt, f.TYPE_STRING, ""),
                               ("attr", 2, rep, f.TYPE_MESSAGE, attr_type)])  # fmt: skip
    for enum_name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COMM_TYPES)):
        enum = fdp.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    io = ".ChakraProtoMsg.IOInfo"
    message("Node", [
        ("id", 1, opt, f.TYPE_UINT64, ""), ("name", 2, opt, f.TYPE_STRING, ""),
        ("type", 3, opt, f.TYPE_ENUM, ".ChakraProtoMsg.NodeType"),
        ("ctrl_deps", 4, rep, f.TYPE_UINT64, ""), ("data_deps", 5, rep, f.TYPE_UINT64, ""),
        ("start_time_micros", 6, opt, f.TYPE_UINT64, ""),
        ("duration_micros", 7, opt, f.TYPE_UINT64, ""),
        ("inputs", 8, opt, f.TYPE_MESSAGE, io), ("outputs", 9, opt, f.TYPE_MESSAGE, io),
        ("attr", 10, rep, f.TYPE_MESSAGE, attr_type),
    ])  # fmt: skip
    message("IOInfo", [(n, i, opt, f.TYPE_STRING, "")
                       for i, n in enumerate(("values", "shapes", "types"), start=1)])  # fmt: skip
    message("Tensor", [(n, i, opt, f.TYPE_UINT64 if n != "device" else f.TYPE_STRING, "")
                       for i, n in enumerate(("tensor_id", "storage_id", "offset", "num_elem",
                                              "elem_bytes", "device"), start=1)])  # fmt: skip
    return fdp


@functools.cache
def message_class(name: str) -> Any:
    """Chakra's message class ``name`` (GlobalMetadata, Node, AttributeProto, ...), built once
    in a private descriptor pool (no clash with Chakra's own generated module)."""
    pool = _pool()
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ChakraProtoMsg.{name}"))


@functools.cache
def _pool() -> Any:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    return pool


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_message(message: Any) -> bytes:
    """``message`` serialized and prefixed with its length as a varint (Chakra's framing)."""
    data: bytes = message.SerializeToString()
    return _varint(len(data)) + data


def split_messages(data: bytes, source: str = "<bytes>") -> Iterator[bytes]:
    """The framed messages of a ``.et`` file's bytes; a truncated frame is one ConfigError."""
    pos = 0
    while pos < len(data):
        size, shift = 0, 0
        while True:
            if pos >= len(data) or shift > 63:
                raise ConfigError(f"{source}: truncated length prefix at byte {pos}")
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if pos + size > len(data):
            raise ConfigError(f"{source}: message at byte {pos} runs past the end of the file")
        yield data[pos : pos + size]
        pos += size


@dataclass(kw_only=True, slots=True, frozen=True)
class EtNode:
    """One Chakra node, as plain values."""

    id: int
    name: str
    type: str
    """A NodeType name, e.g. COMP_NODE or COMM_COLL_NODE."""
    data_deps: tuple[int, ...] = ()
    """Nodes that must finish before this one starts (what simulators schedule by)."""
    ctrl_deps: tuple[int, ...] = ()
    """The node issued just before this one by the same thread (program order)."""
    start_time_micros: int = 0
    duration_micros: int = 0
    attrs: Mapping[str, Any] | None = None
    """Attributes by name (comm_type, comm_size, is_cpu_op, iteration, ...): written from
    AttrValue; read back as any of Chakra's kinds (lists as lists)."""


def _attr(name: str, value: AttrValue) -> Any:
    cls = message_class("AttributeProto")
    if isinstance(value, bool):
        return cls(name=name, bool_val=value)
    if isinstance(value, int):
        return cls(name=name, int64_val=value)  # Chakra's feeder reads comm_size etc. as int64
    if isinstance(value, float):
        return cls(name=name, double_val=value)
    return cls(name=name, string_val=value)


def node_message(node: EtNode) -> Any:
    """``node`` as a Chakra Node message."""
    msg = message_class("Node")(
        id=node.id, name=node.name, type=NODE_TYPES.index(node.type),
        data_deps=list(node.data_deps), ctrl_deps=list(node.ctrl_deps),
        start_time_micros=node.start_time_micros, duration_micros=node.duration_micros,
    )  # fmt: skip
    msg.attr.extend(_attr(k, v) for k, v in (node.attrs or {}).items())
    return msg


def encode_trace(metadata: Mapping[str, AttrValue], nodes: Sequence[EtNode]) -> bytes:
    """A whole ``.et`` file: GlobalMetadata (version + ``metadata`` attributes), then nodes."""
    meta = message_class("GlobalMetadata")(version=SCHEMA_VERSION)
    meta.attr.extend(_attr(k, v) for k, v in metadata.items())
    return encode_message(meta) + b"".join(encode_message(node_message(n)) for n in nodes)


@dataclass(kw_only=True, slots=True, frozen=True)
class EtTrace:
    """A decoded ``.et`` file (ours or Chakra's)."""

    version: str
    """``GlobalMetadata.version``."""
    metadata: Mapping[str, AttrRead]
    """``GlobalMetadata``'s attributes by name."""
    nodes: tuple[EtNode, ...]


def _attr_values(attrs: Any) -> dict[str, AttrRead]:
    out: dict[str, AttrRead] = {}
    for a in attrs:
        kind: str | None = a.WhichOneof("value")
        value: Any = getattr(a, kind) if kind else None
        out[a.name] = list(value.values) if kind and kind.endswith("_list") else value
    return out


def _plain(m: Any) -> EtNode:
    return EtNode(
        id=m.id, name=m.name, type=NODE_TYPES[m.type] if m.type < len(NODE_TYPES) else "?",
        data_deps=tuple(m.data_deps), ctrl_deps=tuple(m.ctrl_deps),
        start_time_micros=m.start_time_micros, duration_micros=m.duration_micros,
        attrs=_attr_values(m.attr),
    )  # fmt: skip


def decode_trace(data: bytes, source: str = "<bytes>") -> EtTrace:
    """The version, metadata attributes and nodes of a ``.et`` file's bytes (ours or Chakra's)."""
    frames = list(split_messages(data, source))
    if not frames:
        raise ConfigError(f"{source}: empty: no GlobalMetadata message")
    try:
        meta = message_class("GlobalMetadata").FromString(frames[0])
        msgs = [message_class("Node").FromString(f) for f in frames[1:]]
    except Exception as exc:  # protobuf's DecodeError has no stable import path
        raise ConfigError(f"{source}: not a Chakra execution trace: {exc}") from None
    nodes = tuple(_plain(m) for m in msgs)
    return EtTrace(version=str(meta.version), metadata=_attr_values(meta.attr), nodes=nodes)


def read_trace(path: Path) -> EtTrace:
    """``decode_trace`` of the file at ``path``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return decode_trace(data, str(path))
