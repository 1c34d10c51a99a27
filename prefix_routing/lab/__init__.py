"""The routing lab: analyze a trace, simulate an endpoint over it, tune PrefixLength and threshold.

- ``analyze(trace)``: how much prefix reuse there is and how routing keys of each PrefixLength
  would group the requests (no fleet involved).
- ``simulate(trace, config)``: drives :class:`Fleet` over the trace in simulated time (arrivals
  from the trace, divided by ``speed``) and reports hit rate, TTFT percentiles, throughput and load
  per instance. ``simulate_many`` runs several strategies side by side.
- ``tune(trace, config, prefix_lengths, thresholds)``: the PREFIX_AWARE grid, the frontier, a
  recommendation and the stage-config snippet.
- ``long_context_workload()``: a reconstruction of the workload of AWS's long-context benchmark.
- ``plot_*``: PNGs (matplotlib, Agg backend, imported only when plotting).

Progress bars (tqdm, stderr) appear only for runs that last more than two seconds.

The modules: trace readers (:mod:`.traces`, their result :mod:`.trace_data` and the bounds on
what they accept, :mod:`.input_bounds`), request bodies (:mod:`.bodies`), workloads (:mod:`.workloads`);
whether a modelled fleet keeps up (:mod:`.overload`); the fleet model (:mod:`.fleet`, with
:mod:`.routing`, :mod:`.fleet_config`, :mod:`.latency`, :mod:`.engine_model`, :mod:`.fleet_stats`), pure
computation without I/O; the passes over it (:mod:`.analyze`, :mod:`.simulate`, :mod:`.tune`) and :mod:`.plots`. The lab imports
:mod:`prefix_routing.rules` and :mod:`prefix_routing.stage`, never the emulator or the load tester.
"""

from prefix_routing.lab.analyze import analyze, key_groups
from prefix_routing.lab.grids import CANDIDATE_PREFIX_LENGTHS, CANDIDATE_THRESHOLDS, REUSE_CRITERION
from prefix_routing.lab.fleet import Fleet, Placement, Request
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.fleet_stats import CopyStats
from prefix_routing.lab.latency import LatencyModel
from prefix_routing.lab.plots import plot_simulation, plot_tune
from prefix_routing.lab.routing import (
    CONCURRENCY_THRESHOLD_RANGE,
    PREFIX_LENGTH_RANGE,
    Strategy,
    key_blocks,
    routing_key,
)
from prefix_routing.lab.simulate import SimResult, Simulator, config_for_trace, simulate, simulate_many
from prefix_routing.lab.trace_keys import trace_keys
from prefix_routing.lab.traces import Trace, load_trace
from prefix_routing.lab.tune import config_snippet, tune
from prefix_routing.lab.workloads import WORKLOADS, LongContextSpec, long_context_workload

__all__ = [
    "CANDIDATE_PREFIX_LENGTHS",
    "CANDIDATE_THRESHOLDS",
    "CONCURRENCY_THRESHOLD_RANGE",
    "PREFIX_LENGTH_RANGE",
    "REUSE_CRITERION",
    "WORKLOADS",
    "CopyStats",
    "Fleet",
    "FleetConfig",
    "LatencyModel",
    "LongContextSpec",
    "Placement",
    "Request",
    "SimResult",
    "Simulator",
    "Strategy",
    "Trace",
    "analyze",
    "config_for_trace",
    "config_snippet",
    "key_blocks",
    "key_groups",
    "load_trace",
    "long_context_workload",
    "plot_simulation",
    "plot_tune",
    "routing_key",
    "simulate",
    "simulate_many",
    "trace_keys",
    "tune",
]
