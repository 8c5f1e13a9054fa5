"""`asyncrsp doctor`: what this host allows, one check a line, with what to do.

A sans-IO core and a thin reader: ``reader.py`` gathers the host's facts
(proxy/host/facts.HostFacts: files under /proc and /sys, ``--version`` of the
tools, one trial load of the BPF program), proxy/host/checks.py turns facts
into verdicts as pure functions, ``main.py`` prints them. The uprobe capture's own host
check (proxy/capture/uprobes/host.py) and ``asyncrsp run``'s refusal to start
a program that cannot be traced use the same checks, so the session's one-line
fallback notice and the doctor say the same thing.
"""
