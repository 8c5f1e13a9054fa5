import sys
from pathlib import Path

# pytest runs with --import-mode=importlib (no sys.path insertion): make the
# shared event builder `graphfix` importable for these tests and the commands tests
sys.path.insert(0, str(Path(__file__).resolve().parent))
