"""One debugged process (``Program``) and the facts of the stop it is looked at (``stops``)."""

from .program import Program
from .stops import ImageStop, SessionStop, Stop

__all__ = ["ImageStop", "Program", "SessionStop", "Stop"]
