"""Make this folder's helpers (harness, rspdriver) importable by the tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
