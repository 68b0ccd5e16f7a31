"""jax-metrics-manager: T5X-quality training metrics for any JAX loop.

Device side (inside jit): metric types, merging, losses and base metrics.
Host side: the duration timer, the background summary worker and the
`MetricsManager` that sends values to pluggable `writers`.
"""

__all__: list[str] = []
