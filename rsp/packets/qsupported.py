"""``qSupported``: the feature negotiation at the start of a connection.

Request: ``qSupported[:feature;feature...]`` (client's features). Reply:
``feature;feature...`` (stub's). A feature is ``name+``, ``name-``,
``name?`` or ``name=value``. Values may hold commas (lldb and gdb send
``xmlRegisters=i386,arm,mips``); only ``;`` separates features. Names may
hold colons (``qXfer:features:read+``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rsp.errors import LocalProtocolError, MalformedPacket

PREFIX = b"qSupported"


@dataclass(frozen=True, slots=True)
class Feature:
    name: str
    value: str  # '+', '-', '?' or the text after '='

    @property
    def supported(self) -> bool:
        return self.value != "-" and self.value != "?"

    def build(self) -> bytes:
        if not self.name or ";" in self.name or "=" in self.name:
            raise LocalProtocolError(f"bad qSupported feature name {self.name!r}")
        if ";" in self.value:
            raise LocalProtocolError(f"qSupported value {self.value!r} holds ';'")
        if self.value in ("+", "-", "?"):
            return (self.name + self.value).encode()
        return f"{self.name}={self.value}".encode()


def _parse_features(text: bytes, body: bytes) -> list[Feature]:
    features = []
    for item in text.split(b";"):
        if not item:
            continue  # tolerate a trailing ';' (several stubs send one)
        features.append(_parse_feature(item, body))
    return features


def _parse_feature(item: bytes, body: bytes) -> Feature:
    try:
        text = item.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedPacket(body, f"qSupported feature {item!r} is not ASCII") from None
    name, eq, value = text.partition("=")
    if eq:
        if not name:
            raise MalformedPacket(body, f"qSupported feature {text!r} has no name")
        return Feature(name, value)
    if len(text) >= 2 and text[-1] in "+-?":
        return Feature(text[:-1], text[-1])
    raise MalformedPacket(body, f"qSupported feature {text!r} has no +, -, ? or =value")


def parse_qsupported_request(body: bytes) -> list[Feature]:
    """The client's features from ``qSupported[:...]``."""
    if body == PREFIX:
        return []
    if not body.startswith(PREFIX + b":"):
        raise MalformedPacket(body, "not a qSupported request")
    return _parse_features(body[len(PREFIX) + 1 :], body)


def parse_qsupported_reply(body: bytes) -> list[Feature]:
    """The stub's features from its ``qSupported`` reply."""
    return _parse_features(body, body)


def build_qsupported_request(features: Iterable[Feature]) -> bytes:
    items = b";".join(f.build() for f in features)
    return PREFIX + b":" + items if items else PREFIX


def build_qsupported_reply(features: Iterable[Feature]) -> bytes:
    return b";".join(f.build() for f in features)


def get(features: Sequence[Feature], name: str) -> Feature | None:
    for feature in features:
        if feature.name == name:
            return feature
    return None


def with_feature(features: Sequence[Feature], feature: Feature) -> list[Feature]:
    """`features` with `feature` replacing the one of the same name (in
    place), or appended."""
    out = list(features)
    for i, old in enumerate(out):
        if old.name == feature.name:
            out[i] = feature
            return out
    out.append(feature)
    return out


def without(features: Sequence[Feature], name: str) -> list[Feature]:
    return [f for f in features if f.name != name]


def packet_size(features: Sequence[Feature]) -> int | None:
    """``PacketSize=`` (hex) of a reply, if present."""
    feature = get(features, "PacketSize")
    if feature is None:
        return None
    try:
        return int(feature.value, 16)
    except ValueError:
        return None
