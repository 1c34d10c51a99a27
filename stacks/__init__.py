"""The deployable units. One stack each; constructs in ``stacks/constructs`` do the work.

- ``EndpointStack``: the GPU endpoint, its inference component and copy autoscaling (slow, costly).
- ``NormalizerStack``: the Lambda front door (changes often, deploys in seconds).
- ``ObservabilityStack``: alarms, the dashboard, saved queries and contributor insights.

``build_stages`` composes them for one stage and registers the security gates.
"""
