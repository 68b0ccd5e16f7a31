"""jax-metrics-manager: T5X-quality training metrics for any JAX loop.

Device side (inside jit): metric types (classification metrics in
`metrics_manager.classification`), merging, losses and base metrics.
Flax NNX-style stateful metrics and NNX interop: `metrics_manager.nnx`.
Host side: the `MetricsManager` facade that sends values to pluggable `writers`, behind
it the duration timer, the summary computation (`summary`) and the writers' isolation
(`isolation`); system metrics (`SystemMonitor`) and FLOPs/MFU (`step_flops`, `perf_values`).
"""

from metrics_manager.classification import AUROC, FBeta, Perplexity, Precision, Recall, TopKAccuracy
from metrics_manager.flops import peak_flops_per_device, perf_values, step_flops
from metrics_manager.isolation import Failure, MetricsManagerError
from metrics_manager.losses import (
    LOSS_NORMALIZING_FACTOR_KEY,
    SpecialLossNormalizingFactor,
    TokenLosses,
    compute_base_metrics,
    compute_loss_and_metrics,
    compute_token_losses,
    compute_weighted_cross_entropy,
    convert_special_loss_normalizing_factor_to_enum,
    count_packed_examples,
    cross_entropy_with_logits,
    get_loss_normalizing_factor_and_weights,
    with_loss_normalization,
)
from metrics_manager.manager import MetricsManager
from metrics_manager.merging import (
    accumulate_grads_microbatched,
    merge_metrics,
    merge_windows,
    validate_metrics,
)
from metrics_manager.metrics import (
    AveragePerStep,
    Max,
    MeanStd,
    MeanStdScalar,
    Min,
    Step,
    StepsPerTime,
    Sum,
    Time,
    TimeRate,
    Welford,
    WelfordScalar,
    compute_metric_values,
    create_metrics_dict,
    is_metric_obj,
    is_time_metric,
    set_step_metrics_num_steps,
    set_time_metrics_duration,
    set_time_rate_metrics_duration,
    shape_obj_to_defined_obj,
)
from metrics_manager.nnx import as_summary_metrics
from metrics_manager.packing import PackedMetrics
from metrics_manager.system import SystemMonitor

__all__: list[str] = [
    "AUROC",
    "AveragePerStep",
    "FBeta",
    "Failure",
    "LOSS_NORMALIZING_FACTOR_KEY",
    "Max",
    "MeanStd",
    "MeanStdScalar",
    "MetricsManager",
    "MetricsManagerError",
    "Min",
    "PackedMetrics",
    "Perplexity",
    "Precision",
    "Recall",
    "SpecialLossNormalizingFactor",
    "Step",
    "StepsPerTime",
    "Sum",
    "SystemMonitor",
    "Time",
    "TimeRate",
    "TokenLosses",
    "TopKAccuracy",
    "Welford",
    "WelfordScalar",
    "accumulate_grads_microbatched",
    "as_summary_metrics",
    "compute_base_metrics",
    "compute_loss_and_metrics",
    "compute_metric_values",
    "compute_token_losses",
    "compute_weighted_cross_entropy",
    "convert_special_loss_normalizing_factor_to_enum",
    "count_packed_examples",
    "create_metrics_dict",
    "cross_entropy_with_logits",
    "get_loss_normalizing_factor_and_weights",
    "is_metric_obj",
    "is_time_metric",
    "merge_metrics",
    "merge_windows",
    "peak_flops_per_device",
    "perf_values",
    "set_step_metrics_num_steps",
    "set_time_metrics_duration",
    "set_time_rate_metrics_duration",
    "shape_obj_to_defined_obj",
    "step_flops",
    "validate_metrics",
    "with_loss_normalization",
]
