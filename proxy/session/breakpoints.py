"""Who owns which breakpoint (DESIGN.md §3 rule 1).

Theory of operation: the client and the proxy each keep their own set of
breakpoints keyed by (type, address, kind). The stub sees the union: a `Z`
goes upstream only when the union gains an entry, a `z` only when it loses
one; every other insert/remove is answered `OK` locally. gdbserver keeps one
breakpoint per address for all users (a second `Z0` is a no-op and a single
`z0` removes it), which is why the union must be kept here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BpKey = tuple[int, int, int]  # (type, addr, kind)
COMMANDS_LOST = ("the client's breakpoint at %#x carries target-side commands (a dprintf in agent style); "
                 "the proxy has its own breakpoint there, so the stub holds it without them and their "
                 "output is lost (dprintf-style gdb, or a breakpoint elsewhere, keeps it)")


@dataclass(slots=True)
class BreakpointTable:
    client: dict[BpKey, bytes] = field(default_factory=dict)  # key -> raw cond/cmd list
    proxy: set[BpKey] = field(default_factory=set)
    lingering: dict[BpKey, bytes] = field(default_factory=dict)  # removed by the client, still in the stub
    # addresses of proxy breakpoints taken out of the stub since the client last saw a stop:
    # a thread that trapped there before may still report it (`late_trap`)
    gone: set[int] = field(default_factory=set)
    version: int = 0  # changes with the union (the keeper's plan is rebuilt then)
    commands_said: set[int] = field(default_factory=set)  # addresses told COMMANDS_LOST

    def _in_union(self, key: BpKey) -> bool:
        return key in self.client or key in self.proxy or key in self.lingering

    def linger(self, key: BpKey) -> None:
        """The client removes `key`; the stub keeps it until `take_lingering` (the union,
        and so `version`, is the same: gdb's z0/Z0 around each step rebuild no plan)."""
        self.lingering[key] = self.client.pop(key)

    def back_in(self, key: BpKey, conditions: bytes) -> bool:
        """The client puts a lingering breakpoint back as it was: True (nothing for the stub)."""
        if self.lingering.get(key) != conditions:
            return False
        self.client[key] = self.lingering.pop(key)
        return True

    def take_lingering(self) -> list[BpKey]:
        """The lingering breakpoints, now to be removed from the stub."""
        if not self.lingering:
            return []
        self.version += 1
        keys = sorted(self.lingering)
        self.lingering.clear()
        return keys

    def client_insert(self, key: BpKey, conditions: bytes = b"") -> bool:
        """Record a client insert; True when the stub must be told: the union gains it, or
        the client's target-side conditions changed where the proxy has no breakpoint (a
        `Z0` with conditions replaces the stub's list for that breakpoint)."""
        self.version += 1
        new = not self._in_union(key) or (key in self.client and self.client[key] != conditions
                                           and key not in self.proxy)
        self.client[key] = conditions
        return new

    def strip_conditions(self, key: BpKey) -> bool:
        """Must the client's `Z` at `key` reach the stub without its conditions? Where the
        proxy has a breakpoint of that type at that address: gdbserver keeps one breakpoint
        for both, and a false client condition would skip the proxy's hit. Every hit then
        reaches the client, and gdb evaluates the condition again itself (it does so for
        each breakpoint stop, target-side evaluation or not)."""
        return any(k[0] == key[0] and k[1] == key[1] for k in self.proxy)

    def client_remove(self, key: BpKey) -> bool:
        """Record a client remove; True when the stub must be told. Answered
        locally only when the proxy still needs the stub's breakpoint there:
        a `z` for a key this table does not know (a fork child's breakpoint,
        a selection the stub refused) goes to the stub - an unknown remove
        answered OK here would leave its int3 in the program."""
        self.version += 1
        self.client.pop(key, None)
        return key not in self.proxy

    def commands_lost(self, key: BpKey) -> bool:
        """Is this the first time the client's breakpoint at `key`, carrying target-side
        commands (gdb's dprintf in agent style: `;cmds:`), meets a proxy breakpoint there? They
        cannot stay in the stub (gdbserver runs them and reports no stop: the proxy's hit would
        be lost), and gdb does not run agent commands itself at a stop it is shown: their output
        is lost there. Once an address (gdb inserts its breakpoints again at every stop)."""
        if b";cmds:" not in self.client.get(key, b"") or key[1] in self.commands_said:
            return False
        self.commands_said.add(key[1])
        return True

    def proxy_insert(self, key: BpKey) -> bool:
        """Record a proxy insert; True when the stub must be told: the union gains it, or
        the client's breakpoint there carries target-side conditions (the proxy's plain `Z`
        replaces them in the stub, strip_conditions)."""
        self.version += 1
        new = not self._in_union(key) or bool(self.client.get(key))
        self.proxy.add(key)
        return new

    def proxy_remove(self, key: BpKey) -> bool:
        self.version += 1
        had = key in self.proxy
        self.proxy.discard(key)
        if had and key not in self.client and key[0] in (0, 1):
            self.gone.add(key[1])
        return had and key not in self.client

    def late_trap(self, addr: int) -> bool:
        """A breakpoint of the proxy's was at `addr` since the client last saw a stop, and
        none is there now, neither the proxy's nor the client's."""
        return addr in self.gone and self.proxy_key_at(addr) is None and not self.client_owns(addr)

    def client_stopped(self) -> None:
        """The client is shown a stop: what was taken out before is old news."""
        self.gone.clear()

    def proxy_key_at(self, addr: int) -> BpKey | None:
        for key in self.proxy:
            if key[1] == addr:
                return key
        return None

    def client_owns(self, addr: int) -> bool:
        return any(k[1] == addr and k[0] in (0, 1) for k in self.client)

    def proxy_owns(self, addr: int) -> bool:
        return self.proxy_key_at(addr) is not None

    def proxy_only(self) -> list[BpKey]:
        """Proxy breakpoints the stub holds only for the proxy (to remove on leave)."""
        return sorted(k for k in self.proxy if k not in self.client)

    def forget_all(self) -> None:
        """The process is gone: nothing is planted any more."""
        self.version += 1
        self.client.clear()
        self.proxy.clear()
        self.lingering.clear()
        self.gone.clear()
        self.commands_said.clear()
