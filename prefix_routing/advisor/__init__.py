"""The routing advisor function: every hour, the lab on the last window of the request log.

``function.run_once`` reads the window (CloudWatch Logs, bounded), asks the inference component
how many copies serve now, runs ``prefix_routing.lab.advisor`` (no numpy, no plots), publishes the
advisor metrics, keeps the notification rule's state in one SSM parameter and notifies the stage's
topic when the rule says so. ``lambda/advisor/handler.py`` is its thin handler.
"""

from prefix_routing.advisor.function import AdvisorConfig, Clients, run_once

__all__ = ["AdvisorConfig", "Clients", "run_once"]
