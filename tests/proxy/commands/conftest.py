import sys
from pathlib import Path

# the event builder and hand-built inventory are shared with the engine tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "graph"))
