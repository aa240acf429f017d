"""The looping agent of ``examples/fastapi_app/agent.py``, pointed at the Flask app.

python examples/flask_app/agent.py                     # 10 s against http://127.0.0.1:5000
python examples/flask_app/agent.py --seconds 3 --url http://127.0.0.1:5001
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    if not any(arg == "--url" or arg.startswith("--url=") for arg in sys.argv[1:]):
        sys.argv[1:1] = ["--url", "http://127.0.0.1:5000"]
    runpy.run_path(str(Path(__file__).parents[1] / "fastapi_app" / "agent.py"), run_name="__main__")
