"""Compose a `Session` for a command line: probes, register safety, commands."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.analysis.inventory import build_inventory
from proxy.capture.breakpoints import BreakpointCapture
from proxy.regsafety import (
    UNKNOWN_STUB,
    RegisterPolicy,
    decide_policy,
    detect_stub_from_command,
    read_host_xsave_layout,
)
from proxy.session.core import Session, SessionConfig
from proxy.shell.upstream import UpstreamSpec
from proxy.symbols import resolve_probes

HELP = """\
asyncrsp monitor commands (everything else goes to the stub):
  monitor async help      this list
  monitor async stats     probe hits, hidden stops and the time spent in them
"""


def basic_monitor(text: str, session: Session) -> str:
    words = text.split()
    sub = words[1] if len(words) > 1 else "help"
    if sub == "stats":
        return "\n".join(session.stats_lines()) + "\n"
    if sub == "help":
        return HELP
    cap = session.config.capture
    eng = getattr(cap, "engine", None)
    if sub == "tasks" and eng is not None:
        return "\n".join(str(t) for t in eng.tasks()) + "\n"
    if sub == "bt" and eng is not None:
        return "\n".join(f"{th}: {eng.backtrace(th)}" for th in eng.threads()) + "\n"
    if sub == "edges" and eng is not None:
        return "\n".join(str(e) for e in eng.edges()) + "\n"
    return f"asyncrsp: unknown command 'async {sub}' (try 'monitor async help')\n"


def register_policy(upstream: UpstreamSpec, requested: str | None) -> RegisterPolicy:
    """DESIGN.md §3 rule 11: decide before the first qSupported goes upstream."""
    info = detect_stub_from_command(upstream.argv) if upstream.kind == "spawn" else UNKNOWN_STUB
    layout = read_host_xsave_layout() if upstream.is_local else None
    return decide_policy(
        requested=requested,
        stub_is_local=upstream.is_local,
        stub_kind=info.kind,
        stub_version=info.version,
        host_layout=layout,
    )


def make_capture(mode: str, only: str | None, exclude: str | None) -> BreakpointCapture | None:
    """The poll-capture backend for a mode (full: entries and rets; entry: entries only)."""
    if mode == "off":
        return None
    return BreakpointCapture(build_inventory, only=only, exclude=exclude, entry_only=mode == "entry")


def make_session(
    upstream: UpstreamSpec,
    *,
    probes: Sequence[str] = (),
    elf: str | None = None,
    registers: str | None = None,
    mode: str = "full",
    only: str | None = None,
    exclude: str | None = None,
) -> Session:
    policy = register_policy(upstream, registers)
    target_xml = None
    if policy.safe:
        try:
            from rsp.regs import amd64_linux_target_xml
        except ImportError:  # pragma: no cover - until rsp.regs lands
            pass
        else:
            target_xml = amd64_linux_target_xml()
    cfg = SessionConfig(
        registers_safe=policy.safe,
        resolve_probes=(lambda path, entry: resolve_probes(path, entry, probes)) if probes else None,
        elf_path=elf,
        monitor=basic_monitor,
        target_xml=target_xml,
        capture=make_capture(mode, only, exclude),
    )
    session = Session(cfg)
    session.register_notice = policy.notice()
    return session
