"""Actor-critic networks (flax.linen) and the policy-distribution helpers the modes use.

`make_actor_critic(env, network_config)` returns an `ActorCritic` with pure `init` and
`apply`; `apply(params, obs) -> (dist, value)` where `dist` is a `GaussianDist` (continuous)
or `CategoricalDist` (discrete) and `value` is `[...]`. Orthogonal initialisation as in
the PPO implementation details (Huang et al. 2022, ICLR blog track) by default; `network.init =
"lecun"` gives Flax's default Dense init instead (the ablation's baseline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.core import losses
from ppo_async.config import ConfigError, NetworkConfig
from ppo_async.envs import Env
from ppo_async.core.types import CategoricalDist, Dist, GaussianDist

_ACTIVATIONS: dict[str, Callable[[chex.Array], chex.Array]] = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
}


def dense(features: int, gain: float, init: str = "orthogonal", **kwargs: Any) -> nn.Dense:
    """A Dense layer with zero biases and `init`'s kernels: orthogonal with `gain` (Huang et al.
    2022: sqrt(2) hidden, 0.01 policy head, 1 value head) or, for "lecun", Flax's default
    LeCun-normal (gain ignored). `kwargs` go to `nn.Dense` (name, bias_init)."""
    kernel_init = nn.initializers.orthogonal(gain) if init == "orthogonal" else nn.initializers.lecun_normal()
    return nn.Dense(features, kernel_init=kernel_init, **{"bias_init": nn.initializers.zeros, **kwargs})


class MLP(nn.Module):
    """Hidden layers only: `[..., D] -> [..., widths[-1]]`."""

    widths: Sequence[int]
    activation: str = "tanh"
    init: str = "orthogonal"

    @nn.compact
    def __call__(self, x: chex.Array) -> chex.Array:
        act = _ACTIVATIONS[self.activation]
        for width in self.widths:
            x = act(dense(width, float(np.sqrt(2.0)), self.init)(x))
        return x


class ActorCriticModule(nn.Module):
    """Separate (or shared-torso) actor and critic MLPs with a Gaussian or categorical head."""

    config: NetworkConfig
    discrete: bool
    action_dim: int  # K for discrete, A for continuous
    obs_ndim: int = 1  # rank of one observation; leading axes are batch
    action_bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # (low [A], high [A]) for bounded_mean

    @nn.compact
    def __call__(self, obs: chex.Array) -> tuple[Dist, chex.Array]:
        cfg = self.config
        x = obs.reshape(obs.shape[: obs.ndim - self.obs_ndim] + (-1,))
        actor_torso = MLP(cfg.actor_hidden, cfg.activation, cfg.init, name="actor_torso")
        actor_features = actor_torso(x)
        if cfg.shared_torso:
            critic_features = actor_features
        else:
            critic_features = MLP(cfg.critic_hidden, cfg.activation, cfg.init, name="critic_torso")(x)
        value = dense(1, 1.0, cfg.init, name="critic_head")(critic_features)[..., 0]

        if self.discrete:
            logits = dense(self.action_dim, 0.01, cfg.init, name="actor_head")(actor_features)
            return CategoricalDist(logits), value
        mean = dense(self.action_dim, 0.01, cfg.init, name="actor_head")(actor_features)
        if cfg.bounded_mean:
            mean = bounded(mean, *self.action_bounds)
        if cfg.state_dependent_std:
            log_std = dense(self.action_dim, 0.01, cfg.init, bias_init=nn.initializers.constant(cfg.init_log_std),
                            name="log_std_head")(actor_features)
        else:
            log_std = self.param(
                "log_std", nn.initializers.constant(cfg.init_log_std), (self.action_dim,)
            )
            log_std = jnp.broadcast_to(log_std, mean.shape)
        return GaussianDist(mean, losses.clamp_log_std(log_std)), value


def bounded(raw_mean: chex.Array, low: Sequence[float], high: Sequence[float]) -> chex.Array:
    """`[..., A]` -> centre + half_range * tanh(raw_mean): a Gaussian mean inside `[low, high]`.

    Only the mean is squashed; the policy is still the Gaussian N(mean, std) over unbounded
    actions (clipped to the bounds when stepping the env), so log-probs and importance ratios
    stay exact and a deterministic policy's action is always a valid one. At init (raw mean
    ~0) the mean is the centre of the bounds.
    """
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    return (high + low) / 2 + (high - low) / 2 * jnp.tanh(raw_mean)


def _action_bounds(env: Env, config: NetworkConfig) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The env's finite action bounds as tuples when `config.bounded_mean` (ConfigError when it
    cannot act: discrete actions or an unbounded dimension); None otherwise."""
    if not config.bounded_mean:
        return None
    if env.discrete:
        raise ConfigError(f"network.bounded_mean = True has no effect: {env.name} has discrete actions")
    low, high = np.ravel(env.action_low).astype(float), np.ravel(env.action_high).astype(float)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise ConfigError(f"network.bounded_mean = True is invalid for {env.name}: its action bounds "
                          f"[{low.tolist()}, {high.tolist()}] are not finite")
    return tuple(low.tolist()), tuple(high.tolist())


@dataclass(frozen=True)
class ActorCritic:
    """Pure init/apply pair for one env's actor-critic.

    Attributes:
      module: the flax module.
      obs_shape: observation shape `O...`.
      discrete: categorical (True) or Gaussian (False) policy.
    """

    module: ActorCriticModule
    obs_shape: tuple[int, ...]
    discrete: bool

    def init(self, key: chex.PRNGKey) -> Any:
        """Fresh params for a single observation."""
        return self.module.init(key, jnp.zeros(self.obs_shape, jnp.float32))

    def apply(self, params: Any, obs: chex.Array) -> tuple[Dist, chex.Array]:
        """`obs [..., O...]` -> `(dist [..., A or K], value [...])`."""
        return self.module.apply(params, obs)


def make_actor_critic(env: Env, config: NetworkConfig) -> ActorCritic:
    """Actor-critic factory: Gaussian head for continuous envs, categorical for discrete."""
    action_dim = env.num_actions if env.discrete else int(np.prod(env.action_shape))
    module = ActorCriticModule(
        config=config,
        discrete=env.discrete,
        action_dim=action_dim,
        obs_ndim=len(env.obs_shape),
        action_bounds=_action_bounds(env, config),
    )
    return ActorCritic(module=module, obs_shape=env.obs_shape, discrete=env.discrete)


# --------------------------------------------------------------------------------------
# Distribution helpers (dispatch on the dist type at trace time)
# --------------------------------------------------------------------------------------


def sample_action(key: chex.PRNGKey, dist: Dist) -> chex.Array:
    """Samples actions: `[..., A]` float for Gaussian, `[...]` int32 for categorical."""
    if isinstance(dist, CategoricalDist):
        return losses.categorical_sample(key, dist.logits)
    return losses.gaussian_sample(key, dist.mean, dist.log_std)


def log_prob(dist: Dist, action: chex.Array) -> chex.Array:
    """log pi(action); `[...]`."""
    if isinstance(dist, CategoricalDist):
        return losses.categorical_log_prob(dist.logits, action)
    return losses.gaussian_log_prob(dist.mean, dist.log_std, action)


def entropy(dist: Dist) -> chex.Array:
    """Entropy; `[...]`."""
    if isinstance(dist, CategoricalDist):
        return losses.categorical_entropy(dist.logits)
    return losses.gaussian_entropy(dist.log_std)


def mode_action(dist: Dist) -> chex.Array:
    """The deterministic action (mean or argmax), for evaluation."""
    if isinstance(dist, CategoricalDist):
        return jnp.argmax(dist.logits, axis=-1).astype(jnp.int32)
    return dist.mean
