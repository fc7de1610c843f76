"""The pure PPO learner: `ppo_update(ctx, state, trajectory, key, hparams) -> (state, metrics)`.

`hyperparams` (what travels as arrays), `optimizer` (the optax chain), `context` (the static
learner and its batch), `diagnostics` (what an update reports) and `update` (targets, the loss,
SGD steps and epochs). Every public name is re-exported here: `learner.ppo_update`.
"""

from ppo_async.core.learner.hyperparams import (
    Hyperparams,
    TRACED_CONFIG_FIELDS,
    STATIC_WHEN_SET,
    SGD_SHAPE_FIELDS,
    hyperparams_from_config,
    without_traced_fields,
    SgdSlots,
    sgd_slots_of,
)
from ppo_async.core.learner.optimizer import (
    critic_mask,
    freeze_where,
    make_optimizer,
    with_step_hyperparams,
    adam_state,
)
from ppo_async.core.learner.context import (
    LearnerContext,
    make_learner_context,
    init_train_state,
    learning_rate_at,
    Batch,
    sample_lag,
    stale_weight,
)
from ppo_async.core.learner.diagnostics import (
    KlParts,
    kl_parts,
    minibatch_diagnostics,
    iteration_metrics,
    lag_metrics,
    explained_variance,
)
from ppo_async.core.learner.update import (
    updated_stats,
    learner_view,
    compute_targets,
    ppo_loss,
    anchor_log_prob,
    sgd_step,
    static_epochs,
    slotted_epochs,
    ppo_update,
)

__all__ = [
    "Hyperparams",
    "TRACED_CONFIG_FIELDS",
    "STATIC_WHEN_SET",
    "SGD_SHAPE_FIELDS",
    "hyperparams_from_config",
    "without_traced_fields",
    "SgdSlots",
    "sgd_slots_of",
    "critic_mask",
    "freeze_where",
    "make_optimizer",
    "with_step_hyperparams",
    "adam_state",
    "LearnerContext",
    "make_learner_context",
    "init_train_state",
    "learning_rate_at",
    "Batch",
    "sample_lag",
    "stale_weight",
    "KlParts",
    "kl_parts",
    "minibatch_diagnostics",
    "iteration_metrics",
    "lag_metrics",
    "explained_variance",
    "updated_stats",
    "learner_view",
    "compute_targets",
    "ppo_loss",
    "anchor_log_prob",
    "sgd_step",
    "static_epochs",
    "slotted_epochs",
    "ppo_update",
]
