"""The old address of the Training page's per-rank part (``/Distributed?run=...``).

In the dashboard the navigation sends this address to the Training page with its URL
parameters; the file is here so that Streamlit knows the address on a first visit, and run on
its own it shows the Training page.
"""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).with_name("8_Training.py")), run_name="__main__")
