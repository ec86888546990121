"""The live dashboard: sessions, judgments, hints and training in a browser.

``clawrl serve`` and ``clawrl demo`` mount it on their gateway at ``/dashboard``; ``clawrl
dashboard --store ... --output-dir ...`` serves it alone, read-only, for a finished run or a
store in use. :mod:`clawrl.dashboard.data` builds the views from the store and the metrics,
:mod:`clawrl.dashboard.routes` serves them with the static pages.
"""

from clawrl.dashboard.data import DashboardSource, demo_view, load_demo_result
from clawrl.dashboard.routes import PREFIX, mount_dashboard

__all__ = ["PREFIX", "DashboardSource", "demo_view", "load_demo_result", "mount_dashboard"]
