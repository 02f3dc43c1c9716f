"""What the dashboard needs from the library beyond the analyses themselves.

- :mod:`.scripts`: where the dashboard's scripts are and the ``streamlit run`` command line
  that starts them (``model-inspector serve``);
- :mod:`.responsive`: what may run as soon as a page opens on a big model, and cheap probes.
"""

from __future__ import annotations

from .responsive import quick_target_info, runs_at_once
from .scripts import config_options, dashboard_dir, streamlit_command

__all__ = ["config_options", "dashboard_dir", "quick_target_info", "runs_at_once", "streamlit_command"]
