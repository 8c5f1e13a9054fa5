"""Rust symbol demangling: legacy (``_ZN...17h<hash>E``) and v0 (``_R...``).

Written here rather than taken from PyPI: the maintained Rust demanglers on
PyPI are bindings to native code (``pyderust``, ``pycxxfilt``) or handle the
legacy scheme only (``rust-demangler``); this one is pure Python, small, and
tested against binutils' ``c++filt`` (libiberty's Rust demangler, which reads
both schemes) on every symbol of real binaries.

The output follows libiberty's text with the hashes left out, like
``rustc-demangle``'s alternate form: crate disambiguators (``core[c1f1...]``)
and the legacy ``::h<16 hex>`` suffix are not printed. rustup's std is
v0-mangled even inside a legacy-mangled program, so both appear in one binary.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_LEGACY_ESCAPES = {
    "SP": "@", "BP": "*", "RF": "&", "LT": "<", "GT": ">", "LP": "(", "RP": ")", "C": ",",
}
_HASH_RE = re.compile(r"^h[0-9a-f]{16}$")

_BASIC = {
    "a": "i8", "b": "bool", "c": "char", "d": "f64", "e": "str", "f": "f32", "h": "u8",
    "i": "isize", "j": "usize", "l": "i32", "m": "u32", "n": "i128", "o": "u128", "s": "i16",
    "t": "u16", "u": "()", "v": "...", "x": "i64", "y": "u64", "z": "!", "p": "_",
}
_B62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


class DemangleError(ValueError):
    pass


def demangle(symbol: str) -> str | None:
    """The demangled form of a Rust symbol, or None if it is not one."""
    sym = symbol.split("@", 1)[0]  # drop a "@GLIBC_2.2.5"-style version
    try:
        if sym.startswith("_R"):
            return _V0(sym[2:]).symbol()
        if sym.startswith("__R"):
            return _V0(sym[3:]).symbol()
        if sym.startswith("_ZN"):
            return _legacy(sym[3:])
    except (DemangleError, IndexError, ValueError, RecursionError):
        return None
    return None


def demangle_or_raw(symbol: str) -> str:
    return demangle(symbol) or symbol


# -- legacy -------------------------------------------------------------------


def _legacy(s: str) -> str:
    parts: list[str] = []
    pos = 0
    while pos < len(s) and s[pos] != "E":
        m = re.match(r"\d+", s[pos:])
        if not m:
            raise DemangleError("bad legacy length")
        n = int(m.group())
        pos += len(m.group())
        parts.append(s[pos : pos + n])
        if len(parts[-1]) != n:
            raise DemangleError("truncated legacy component")
        pos += n
    if pos >= len(s) or not parts:
        raise DemangleError("unterminated legacy symbol")
    if len(parts) > 1 and _HASH_RE.match(parts[-1]):
        parts.pop()
    elif not _looks_rust_legacy(parts):
        raise DemangleError("not a Rust legacy symbol")
    return "::".join(_legacy_component(p) for p in parts)


def _looks_rust_legacy(parts: list[str]) -> bool:
    return any("$" in p or ".." in p for p in parts)


def _legacy_component(p: str) -> str:
    if p.startswith("_$"):
        p = p[1:]
    out: list[str] = []
    i = 0
    while i < len(p):
        c = p[i]
        if c == "$":
            end = p.index("$", i + 1)
            code = p[i + 1 : end]
            if code in _LEGACY_ESCAPES:
                out.append(_LEGACY_ESCAPES[code])
            elif code.startswith("u"):
                out.append(chr(int(code[1:], 16)))
            else:
                raise DemangleError(f"unknown legacy escape ${code}$")
            i = end + 1
        elif p.startswith("..", i):
            out.append("::")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


# -- v0 -------------------------------------------------------------------------


class _V0:
    """Recursive-descent printer for the v0 grammar (RFC 2603)."""

    def __init__(self, s: str) -> None:
        self.s = s
        self.pos = 0
        self.depth = 0
        self.bound_lifetimes = 0

    # low-level readers
    def peek(self) -> str:
        return self.s[self.pos] if self.pos < len(self.s) else ""

    def eat(self, c: str) -> bool:
        if self.peek() == c:
            self.pos += 1
            return True
        return False

    def next(self) -> str:
        c = self.s[self.pos]
        self.pos += 1
        return c

    def base62(self) -> int:
        if self.eat("_"):
            return 0
        x = 0
        while True:
            c = self.next()
            if c == "_":
                return x + 1
            x = x * 62 + _B62.index(c)

    def opt_int62(self, tag: str) -> int:
        return self.base62() + 1 if self.eat(tag) else 0

    def decimal(self) -> int:
        start = self.pos
        if self.peek() == "0":
            self.pos += 1
            return 0
        while self.peek().isdigit():
            self.pos += 1
        if start == self.pos:
            raise DemangleError("expected a decimal number")
        return int(self.s[start : self.pos])

    def ident(self) -> str:
        punycode = self.eat("u")
        n = self.decimal()
        self.eat("_")
        text = self.s[self.pos : self.pos + n]
        if len(text) != n:
            raise DemangleError("truncated identifier")
        self.pos += n
        if punycode:
            return _punycode(text)
        return text

    def backref(self, fn: Callable[[], str]) -> str:
        target = self.base62()
        if target >= self.pos:
            raise DemangleError("forward backref")
        saved = self.pos
        self.pos = target
        self.enter()
        try:
            return fn()
        finally:
            self.depth -= 1
            self.pos = saved

    def enter(self) -> None:
        self.depth += 1
        if self.depth > 200:
            raise DemangleError("too deep")

    # grammar
    def symbol(self) -> str:
        if self.peek().isdigit():
            self.decimal()  # encoding version
        out = self.path(in_value=True)
        # the instantiating crate and vendor suffix are not printed
        return out

    def path(self, in_value: bool) -> str:
        self.enter()
        try:
            return self._path(in_value)
        finally:
            self.depth -= 1

    def _path(self, in_value: bool) -> str:
        tag = self.next()
        if tag == "C":
            self.opt_int62("s")
            return self.ident()
        if tag == "M":
            self.opt_int62("s")
            self.path(in_value=False)  # the impl's parent path is not printed
            return "<" + self.type() + ">"
        if tag == "X":
            self.opt_int62("s")
            self.path(in_value=False)
            ty = self.type()
            return "<" + ty + " as " + self.path(in_value=False) + ">"
        if tag == "Y":
            ty = self.type()
            return "<" + ty + " as " + self.path(in_value=False) + ">"
        if tag == "N":
            ns = self.next()
            prefix = self.path(in_value)
            dis = self.opt_int62("s")
            name = self.ident()
            if ns.isupper():
                kind = {"C": "closure", "S": "shim"}.get(ns, ns)
                label = f"{kind}:{name}" if name else kind
                return f"{prefix}::{{{label}#{dis}}}"
            return f"{prefix}::{name}" if name else prefix
        if tag == "I":
            prefix = self.path(in_value)
            args: list[str] = []
            while not self.eat("E"):
                args.append(self.generic_arg())
            sep = "::<" if in_value else "<"
            return prefix + sep + ", ".join(args) + ">"
        if tag == "B":
            return self.backref(lambda: self.path(in_value))
        raise DemangleError(f"bad path tag {tag!r}")

    def generic_arg(self) -> str:
        if self.eat("L"):
            return self.lifetime(self.base62())
        if self.eat("K"):
            return self.const()
        return self.type()

    def lifetime(self, idx: int) -> str:
        if idx == 0:
            return "'_"
        depth = self.bound_lifetimes - idx
        if depth < 0:
            raise DemangleError("lifetime out of range")
        return "'" + (chr(ord("a") + depth) if depth < 26 else f"_{depth}")

    def binder(self) -> str:
        if not self.eat("G"):
            return ""
        n = self.base62() + 1
        names = []
        for _ in range(n):
            self.bound_lifetimes += 1
            names.append(self.lifetime(1))
        return "for<" + ", ".join(names) + "> "

    def type(self) -> str:
        self.enter()
        try:
            return self._type()
        finally:
            self.depth -= 1

    def _type(self) -> str:
        c = self.next()
        if c in _BASIC:
            return _BASIC[c]
        if c == "A":
            ty = self.type()
            return f"[{ty}; {self.const(bare=True)}]"
        if c == "S":
            return f"[{self.type()}]"
        if c in "RQ":
            lt = ""
            if self.eat("L"):
                idx = self.base62()
                if idx:
                    lt = self.lifetime(idx) + " "
            mut = "mut " if c == "Q" else ""
            return f"&{lt}{mut}{self.type()}"
        if c == "P":
            return f"*const {self.type()}"
        if c == "O":
            return f"*mut {self.type()}"
        if c == "F":
            return self.fn_sig()
        if c == "D":
            return self.dyn_bounds()
        if c == "T":
            items: list[str] = []
            while not self.eat("E"):
                items.append(self.type())
            if len(items) == 1:
                return f"({items[0]},)"
            return "(" + ", ".join(items) + ")"
        if c == "B":
            return self.backref(self.type)
        self.pos -= 1
        return self.path(in_value=False)

    def fn_sig(self) -> str:
        saved = self.bound_lifetimes
        out = self.binder()
        if self.eat("U"):
            out += "unsafe "
        if self.eat("K"):
            abi = "C" if self.eat("C") else self.ident().replace("_", "-")
            out += f'extern "{abi}" '
        params: list[str] = []
        while not self.eat("E"):
            params.append(self.type())
        ret = self.type()
        out += "fn(" + ", ".join(params) + ")"
        if ret != "()":
            out += " -> " + ret
        self.bound_lifetimes = saved
        return out

    def dyn_bounds(self) -> str:
        saved = self.bound_lifetimes
        prefix = self.binder()
        traits: list[str] = []
        while not self.eat("E"):
            traits.append(self.dyn_trait())
        if self.eat("L"):
            self.base62()
        self.bound_lifetimes = saved
        return "dyn " + prefix + " + ".join(traits)

    def dyn_trait(self) -> str:
        path = self.path(in_value=False)
        assoc: list[str] = []
        while self.eat("p"):
            name = self.ident()
            assoc.append(f"{name} = {self.type()}")
        if not assoc:
            return path
        if path.endswith(">"):
            return path[:-1] + ", " + ", ".join(assoc) + ">"
        return path + "<" + ", ".join(assoc) + ">"

    def const(self, bare: bool = False) -> str:
        if self.eat("B"):
            return self.backref(lambda: self.const(bare))
        if self.eat("p"):
            return "_"
        ty = self.next()
        if ty not in _BASIC:
            raise DemangleError(f"unsupported const type {ty!r}")
        neg = self.eat("n")
        start = self.pos
        while self.peek() != "_":
            self.pos += 1
        digits = self.s[start : self.pos]
        self.pos += 1
        value = int(digits, 16) if digits else 0
        if ty == "b":
            return "true" if value else "false"
        if ty == "c":
            return repr(chr(value))
        text = f"-{value}" if neg else str(value)
        return text if bare else f"{text}: {_BASIC[ty]}"


def _punycode(text: str) -> str:
    # "<basic>_<encoded>" with the RFC 3492 "_" delimiter as rustc writes it
    if "_" in text:
        basic, _, enc = text.rpartition("_")
    else:
        basic, enc = "", text
    return (basic + "-" + enc).encode("ascii").decode("punycode")
