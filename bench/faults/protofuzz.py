"""Hypothesis strategies that build arbitrary (often hostile) protobuf messages from their
descriptors: huge and non-ASCII strings, out-of-range numbers, NaN/inf, oversize repeated
fields, unknown enum values, deep nesting."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

_INT64 = (-(2**63), 2**63 - 1)
_INT32 = (-(2**31), 2**31 - 1)

_small_strings = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "../../etc/passwd", "s" * 5000, "é" * 300, "\u202e", "null", "-1"]),
)
#: top-level only: oversize strings (up to 300 kB)
_strings = st.one_of(_small_strings, st.builds(lambda n: "x" * n, st.integers(min_value=60_000, max_value=300_000)))
_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, -1.0, 1e308, -1e308, 1e-320]))


def _scalar(field: Any, big: bool = True) -> st.SearchStrategy[Any]:
    t = field.type
    if t in (FieldDescriptor.TYPE_STRING,):
        return _strings if big else _small_strings
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return _floats if t == FieldDescriptor.TYPE_DOUBLE else st.floats(width=32, allow_nan=True)
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return st.one_of(st.integers(*_INT64), st.sampled_from([0, -1, _INT64[0], _INT64[1]]))
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 2**64 - 1]))
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return st.integers(*_INT32)
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-5, 50))
    raise TypeError(f"unsupported field type {t}")


def messages(descriptor: Any, cls: type[Message], depth: int = 0) -> st.SearchStrategy[Message]:
    """Arbitrary instances of ``cls``; repeated fields up to 20 (or occasionally 2,000) items."""

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        for field in descriptor.fields:
            if not draw(st.booleans()):
                continue
            is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
            if field.type == FieldDescriptor.TYPE_MESSAGE and not is_map:
                if depth >= 3:
                    continue
                sub_cls = type(getattr(cls(), field.name)) if not _repeated(field) else None
                if _repeated(field):
                    container = getattr(msg, field.name)
                    n = draw(st.one_of(st.integers(0, 5), st.just(2000))) if depth == 0 else draw(st.integers(0, 3))
                    sample = draw(messages(field.message_type, _message_class(msg, field), depth + 1))
                    for _ in range(n):
                        container.add().CopyFrom(sample)
                else:
                    assert sub_cls is not None
                    getattr(msg, field.name).CopyFrom(draw(messages(field.message_type, sub_cls, depth + 1)))
            elif is_map:
                key_f = field.message_type.fields_by_name["key"]
                val_f = field.message_type.fields_by_name["value"]
                if val_f.type == FieldDescriptor.TYPE_MESSAGE:
                    continue
                entries = draw(st.dictionaries(_scalar(key_f, False), _scalar(val_f, False), max_size=5))
                target = getattr(msg, field.name)
                for k, v in entries.items():
                    target[k] = v
            elif _repeated(field):
                getattr(msg, field.name).extend(draw(st.lists(_scalar(field, False), max_size=20)))
            else:
                setattr(msg, field.name, draw(_scalar(field, depth == 0)))
        return msg

    return build()


def _repeated(field: Any) -> bool:
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(getattr(field, "label", None) == FieldDescriptor.LABEL_REPEATED)


def _message_class(parent: Message, field: Any) -> type[Message]:
    container = getattr(type(parent)(), field.name)
    return type(container.add())


# ------------------------------------------------------------------ near-valid messages

Path = tuple[object, ...]  # field names and repeated indices from the root


def _paths(msg: Message, prefix: Path = (), depth: int = 0) -> list[tuple[Path, Any]]:
    """Every field reachable in ``msg`` (set or not; repeated message elements that exist)."""
    out: list[tuple[Path, Any]] = []
    for field in msg.DESCRIPTOR.fields:
        path = (*prefix, field.name)
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        out.append((path, field))
        if field.type != FieldDescriptor.TYPE_MESSAGE or is_map or depth >= 3:
            continue
        if _repeated(field):
            for i, item in enumerate(getattr(msg, field.name)):
                out.extend(_paths(item, (*path, i), depth + 1))
        else:
            out.extend(_paths(getattr(msg, field.name), path, depth + 1))
    return out


def _resolve(root: Message, path: Path) -> tuple[Message, str]:
    node: Any = root
    for step in path[:-1]:
        node = node[step] if isinstance(step, int) else getattr(node, str(step))
    return node, str(path[-1])


def near(base: Message) -> st.SearchStrategy[Message]:
    """Messages one or two hostile edits away from the valid ``base``: a field set to an
    out-of-range, oversize or otherwise hostile value, a repeated field grown to 2,000
    items, a map given hostile entries, a sub-message cleared."""
    paths = _paths(base)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = type(base)()
        msg.CopyFrom(base)
        for _ in range(draw(st.integers(1, 2))):
            path, field = draw(st.sampled_from(paths))
            try:
                parent, name = _resolve(msg, path)
            except IndexError:  # an earlier edit emptied the repeated field on the way
                continue
            is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
            if is_map:
                key_f = field.message_type.fields_by_name["key"]
                val_f = field.message_type.fields_by_name["value"]
                if val_f.type != FieldDescriptor.TYPE_MESSAGE:
                    target = getattr(parent, name)
                    for k, v in draw(st.dictionaries(_scalar(key_f, False), _scalar(val_f, False), max_size=5)).items():
                        target[k] = v
            elif _repeated(field):
                container = getattr(parent, name)
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    if len(container) and draw(st.booleans()):
                        first = type(container[0])()
                        first.CopyFrom(container[0])
                        for _ in range(draw(st.sampled_from([2, 50, 2000]))):
                            container.add().CopyFrom(first)
                    else:
                        del container[:]
                else:
                    container.extend(draw(st.lists(_scalar(field, False), min_size=1, max_size=2000)))
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                parent.ClearField(name)
            else:
                setattr(parent, name, draw(_scalar(field, True)))
        return msg

    return build()
