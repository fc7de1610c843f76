"""Tests for `ppo_async.core.losses`: hand-computed values, reference loops, clipping properties,
numerical robustness at extreme ratios, jit/traced hyperparameters, batching and shape checks.

Hand-computed literals are float64 values (worked out in the comments, checked with numpy);
the functions run in float32, hence the tolerances.
"""

from __future__ import annotations

import functools
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async.core import losses

# Every public function of `losses`, called through `jax.jit`: this checks that all of them
# trace (hyperparameters such as clip_eps / gamma become traced values; None stays static) and
# is much faster on CPU than op-by-op eager dispatch. `TestJitAndBatching` compares against the
# eager functions (`losses.*`) with plain Python-float hyperparameters.
L = types.SimpleNamespace(**{
    name: jax.jit(getattr(losses, name))
    for name in [
        "gaussian_log_prob", "gaussian_entropy", "gaussian_sample", "categorical_log_prob",
        "categorical_entropy", "categorical_sample", "gae", "vtrace_advantages",
        "ppo_clip_objective", "ppo_clip_loss", "dual_clip_ppo_objective", "dual_clip_ppo_loss",
        "value_loss", "approx_kl", "ratio_stats", "normalize_advantages",
    ]
})

RTOL = 1e-5
ATOL = 1e-6
LN2 = math.log(2.0)
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)  # 0.9189385332046727


def close(actual, expected, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def f32(x):
    return jnp.asarray(x, jnp.float32)


# --------------------------------------------------------------------------------------
# Shared fixtures: an 8-sample minibatch whose PPO objectives are worked out by hand.
# --------------------------------------------------------------------------------------

# ratios r and advantages A; eps = 0.2 (clip range [0.8, 1.2]), dual clip c = 3.
#   r    A   r*A   clip(r)*A   ppo=min      dual (A<0: max(ppo, 3A))
#  0.5   1   0.5     0.8        0.5          0.5
#  0.9   2   1.8     1.8        1.8          1.8
#  1.0  -1  -1.0    -1.0       -1.0         -1.0
#  1.5   1   1.5     1.2        1.2          1.2
#  1.5  -2  -3.0    -2.4       -3.0         max(-3, -6) = -3.0
#  0.5  -1  -0.5    -0.8       -0.8         max(-0.8, -3) = -0.8
#  5.0  -1  -5.0    -1.2       -5.0         max(-5, -3) = -3.0   <- dual clip active
#  5.0   1   5.0     1.2        1.2          1.2 (A >= 0: no dual clip)
# sum(ppo) = -5.1 -> loss 0.6375;  sum(dual) = -3.1 -> loss 0.3875.
RATIOS = np.array([0.5, 0.9, 1.0, 1.5, 1.5, 0.5, 5.0, 5.0])
ADVS = np.array([1.0, 2.0, -1.0, 1.0, -2.0, -1.0, -1.0, 1.0])
EPS, DUAL = 0.2, 3.0
PPO_OBJ = np.array([0.5, 1.8, -1.0, 1.2, -3.0, -0.8, -5.0, 1.2])
DUAL_OBJ = np.array([0.5, 1.8, -1.0, 1.2, -3.0, -0.8, -3.0, 1.2])
# mask keeps samples 0, 1, 2, 3, 6: ppo (0.5 + 1.8 - 1 + 1.2 - 5) / 5 = -0.5; dual (... - 3) / 5 = -0.1
MASK = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])


def batch():
    """(log_prob, behavior_log_prob, advantages) realising RATIOS with a non-trivial behaviour."""
    behavior = np.linspace(-2.0, -0.5, RATIOS.size)
    return f32(behavior + np.log(RATIOS)), f32(behavior), f32(ADVS)


# --------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------


class TestGaussian:
    """Diagonal Gaussian log-density, entropy and sampling."""

    def test_log_prob_scalar_dims(self):
        # a=1, mu=0, sigma=1: -0.5 - 0.5 log(2 pi) = -1.4189385332046727
        close(L.gaussian_log_prob(f32([0.0]), f32([0.0]), f32([1.0])), -1.4189385332046727)
        # a=2, mu=1, sigma=2: z=0.5 -> -0.125 - log 2 - 0.9189385332 = -1.737085713764618
        close(L.gaussian_log_prob(f32([1.0]), f32([LN2]), f32([2.0])), -1.737085713764618)

    def test_log_prob_sums_over_action_axis(self):
        # the two 1-D cases above as one 2-D action: -1.4189385332 - 1.7370857138
        out = L.gaussian_log_prob(f32([0.0, 1.0]), f32([0.0, LN2]), f32([1.0, 2.0]))
        assert out.shape == ()
        close(out, -3.1560242469692907)

    def test_log_std_broadcast_over_batch(self):
        # log_std of shape [A] = [0, log 2] shared by a batch of 3 rows:
        #   row 0: mu=[0,1], a=[1,2]  -> -3.1560242469692907 (above)
        #   row 1: mu=[0,1], a=[0,1]  -> z=0: -0.9189385332 + (-log 2 - 0.9189385332) = -2.5310242470
        #   row 2: mu=[1,0], a=[3,-4] -> z=[2,-2]: (-2 - 0.9189385332) + (-2 - log 2 - 0.9189385332)
        #                                         = -6.5310242470
        mean = f32([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
        action = f32([[1.0, 2.0], [0.0, 1.0], [3.0, -4.0]])
        out = L.gaussian_log_prob(mean, f32([0.0, LN2]), action)
        assert out.shape == (3,)
        close(out, [-3.1560242469692907, -2.5310242469692907, -6.5310242469692907])
        # identical to passing the explicitly broadcast [3, 2] log_std
        full = L.gaussian_log_prob(mean, jnp.broadcast_to(f32([0.0, LN2]), (3, 2)), action)
        close(out, np.asarray(full))

    def test_log_std_clamped(self):
        # log_std = 5 is clamped to 2: z = e^-2 = 0.1353352832, -0.5 z^2 = -0.0091578194,
        # -> -0.0091578194 - 2 - 0.9189385332 = -2.92809635264904
        hi = L.gaussian_log_prob(f32([0.0]), f32([5.0]), f32([1.0]))
        close(hi, -2.92809635264904)
        close(hi, np.asarray(L.gaussian_log_prob(f32([0.0]), f32([2.0]), f32([1.0]))))
        # log_std = -25 is clamped to -20: a = 1e-9, z = 1e-9 e^20 = 0.4851651954,
        # -0.5 z^2 + 20 - 0.9189385332 = 18.963368833376816
        close(L.gaussian_log_prob(f32([0.0]), f32([-25.0]), f32([1e-9])), 18.963368833376816)

    def test_entropy(self):
        # H = sum(log_std) + A (1 + log 2 pi) / 2;  0.5 (1 + log 2 pi) = 1.4189385332046727
        # [0, log 2]: 2 * 1.4189385332 + 0.6931471806 = 3.5310242469692907
        close(L.gaussian_entropy(f32([0.0, LN2])), 3.5310242469692907)
        # clamped: 5 -> 2 gives 3.4189385332046727; -30 -> -20 gives -18.581061466795326
        close(L.gaussian_entropy(f32([[5.0], [-30.0]])), [3.4189385332046727, -18.581061466795326])

    def test_entropy_is_minus_expected_log_prob(self):
        """H = -E[log p(a)]: Monte-Carlo check with samples from gaussian_sample."""
        mean, log_std = f32([0.3, -1.0]), f32([0.5, -0.7])
        actions = L.gaussian_sample(jax.random.PRNGKey(0), jnp.broadcast_to(mean, (20000, 2)), log_std)
        mc = -jnp.mean(L.gaussian_log_prob(jnp.broadcast_to(mean, actions.shape), log_std, actions))
        close(mc, float(L.gaussian_entropy(log_std)), rtol=0, atol=0.03)

    def test_sample_moments_and_clamp(self):
        # log_std = 5 is clamped to 2: empirical std ~ e^2 = 7.389
        samples = L.gaussian_sample(jax.random.PRNGKey(1), jnp.full((40000, 1), 3.0), f32([5.0]))
        assert samples.shape == (40000, 1)
        close(jnp.mean(samples), 3.0, rtol=0, atol=0.15)
        close(jnp.std(samples), math.exp(2.0), rtol=0.02)


class TestCategorical:
    """Categorical log-probability, entropy and sampling."""

    # logits log([1, 2, 3]) -> p = [1/6, 1/3, 1/2]
    LOGITS = [0.0, LN2, math.log(3.0)]

    def test_log_prob(self):
        # log(1/6) = -1.791759469228055, log(1/3) = -1.0986122886681098, log(1/2) = -0.6931471805599453
        logits = f32([self.LOGITS] * 3)
        out = L.categorical_log_prob(logits, jnp.array([0, 1, 2]))
        close(out, [-1.791759469228055, -1.0986122886681098, -0.6931471805599453])
        # shift invariance of unnormalised logits
        close(L.categorical_log_prob(logits + 7.0, jnp.array([0, 1, 2])), np.asarray(out))

    def test_log_prob_batched_time_major(self):
        # [T=2, N=2, K=3] logits, [T, N] actions
        logits = f32([[self.LOGITS, [0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0], self.LOGITS]])
        out = L.categorical_log_prob(logits, jnp.array([[2, 1], [0, 0]]))
        # uniform over 3: log(1/3) = -1.0986122886681098
        close(out, [[-0.6931471805599453, -1.0986122886681098],
                    [-1.0986122886681098, -1.791759469228055]])

    def test_entropy(self):
        # -(1/6 log 1/6 + 1/3 log 1/3 + 1/2 log 1/2) = 0.2986265782 + 0.3662040962 + 0.3465735903
        #                                            = 1.0114042647073518
        # uniform over 4: log 4 = 1.3862943611198906
        close(L.categorical_entropy(f32([self.LOGITS + [-1e9], [1.0, 1.0, 1.0, 1.0]])),
              [1.0114042647073518, 1.3862943611198906])

    def test_sample_frequencies(self):
        logits = jnp.broadcast_to(f32(self.LOGITS), (30000, 3))
        samples = L.categorical_sample(jax.random.PRNGKey(2), logits)
        assert samples.dtype == jnp.int32 and samples.shape == (30000,)
        freqs = np.bincount(np.asarray(samples), minlength=3) / samples.size
        close(freqs, [1 / 6, 1 / 3, 1 / 2], rtol=0, atol=0.015)


# --------------------------------------------------------------------------------------
# Policy losses: hand-computed values
# --------------------------------------------------------------------------------------


class TestPolicyLossValues:
    """PPO clip and dual-clip objectives/losses on the hand-worked batch (see top of file)."""

    def test_ppo_objective_per_sample(self):
        close(L.ppo_clip_objective(*batch(), EPS), PPO_OBJ)

    def test_ppo_loss(self):
        close(L.ppo_clip_loss(*batch(), EPS), 0.6375)

    def test_ppo_loss_masked(self):
        close(L.ppo_clip_loss(*batch(), EPS, mask=f32(MASK)), 0.5)

    def test_dual_objective_per_sample(self):
        close(L.dual_clip_ppo_objective(*batch(), EPS, DUAL), DUAL_OBJ)

    def test_dual_loss(self):
        close(L.dual_clip_ppo_loss(*batch(), EPS, DUAL), 0.3875)

    def test_dual_loss_masked(self):
        close(L.dual_clip_ppo_loss(*batch(), EPS, DUAL, mask=f32(MASK)), 0.1)

    def test_all_zero_mask_gives_zero(self):
        zeros = jnp.zeros(RATIOS.size)
        assert float(L.ppo_clip_loss(*batch(), EPS, mask=zeros)) == 0.0
        assert float(L.dual_clip_ppo_loss(*batch(), EPS, DUAL, mask=zeros)) == 0.0

    def test_on_policy_gradient_is_minus_mean_advantage(self):
        # at r = 1 no clip is active: d/dlogp (-mean(r A)) = -A / n
        lp = f32([-1.0, -2.0, -0.5])
        adv = f32([1.0, -2.0, 0.5])
        for loss in (functools.partial(L.ppo_clip_loss, clip_eps=EPS),
                     functools.partial(L.dual_clip_ppo_loss, clip_eps=EPS, dual_clip=DUAL)):
            grad = jax.grad(lambda x: loss(x, lp, adv))(lp)
            close(grad, [-1 / 3, 2 / 3, -0.5 / 3])


# --------------------------------------------------------------------------------------
# Value loss, approx KL, ratio stats, advantage normalisation
# --------------------------------------------------------------------------------------


class TestValueLoss:
    """Unclipped and PPO2-style clipped squared error."""

    # V = [1, 2, 3, 4], R = [1.5, 1, 3, 6], V_b = [1, 1.5, 3.5, 3.7], eps = 0.2
    V, R, VB = [1.0, 2.0, 3.0, 4.0], [1.5, 1.0, 3.0, 6.0], [1.0, 1.5, 3.5, 3.7]

    def test_unclipped(self):
        # (V - R)^2 = [0.25, 1, 0, 4]; 0.5 * mean = 0.5 * 5.25 / 4 = 0.65625
        close(L.value_loss(f32(self.V), f32(self.R)), 0.65625)

    def test_clipped(self):
        # V - V_b = [0, 0.5, -0.5, 0.3] -> clip +-0.2 -> V_clip = [1, 1.7, 3.3, 3.9]
        # (V_clip - R)^2 = [0.25, 0.49, 0.09, 4.41]; max with [0.25, 1, 0, 4] = [0.25, 1, 0.09, 4.41]
        # 0.5 * 5.75 / 4 = 0.71875
        close(L.value_loss(f32(self.V), f32(self.R), f32(self.VB), clip_eps=0.2), 0.71875)

    def test_masked(self):
        # unclipped, keep [0, 2, 3]: 0.5 * (0.25 + 0 + 4) / 3 = 0.7083333333
        close(L.value_loss(f32(self.V), f32(self.R), mask=f32([1, 0, 1, 1])), 0.7083333333333334)
        # clipped, keep [0, 2, 3]: 0.5 * (0.25 + 0.09 + 4.41) / 3 = 0.7916666667
        close(L.value_loss(f32(self.V), f32(self.R), f32(self.VB), 0.2, mask=f32([1, 0, 1, 1])),
              0.7916666666666666)

    def test_clip_without_behavior_values_raises(self):
        with pytest.raises(ValueError):
            L.value_loss(f32(self.V), f32(self.R), clip_eps=0.2)

    def test_clipped_gradient(self):
        # d/dV of 0.5 mean(max(...)) = (winning term's V - R) / 4 if V moves it, else 0:
        #   sample 0: V = V_b, both terms equal with equal slopes -> (1 - 1.5) / 4 = -0.125
        #   sample 1: unclipped term wins -> (2 - 1) / 4 = 0.25
        #   sample 2: clipped term wins, V - V_b = -0.5 outside the clip range -> 0
        #   sample 3: clipped term wins, V - V_b = 0.3 outside the clip range -> 0
        grad = jax.grad(lambda v: L.value_loss(v, f32(self.R), f32(self.VB), 0.2))(f32(self.V))
        close(grad[1:], [0.25, 0.0, 0.0])
        close(grad[0], -0.125)


class TestApproxKL:
    """k3 estimator mean((r - 1) - log r)."""

    def test_values(self):
        # log r = [log 2, -log 2, 0, 1]:
        #   (2 - 1) - log 2 = 0.3068528194, (0.5 - 1) + log 2 = 0.1931471806, 0,
        #   (e - 1) - 1 = 0.7182818285
        # mean = 1.2182818285 / 4 = 0.30457045711476133; masked to first two: 0.5 / 2 = 0.25
        log_r = f32([LN2, -LN2, 0.0, 1.0])
        base = f32([-1.0, -0.3, -2.0, -4.0])
        close(L.approx_kl(base + log_r, base), 0.30457045711476133)
        close(L.approx_kl(base + log_r, base, mask=f32([1, 1, 0, 0])), 0.25)

    def test_non_negative_and_zero_on_policy(self):
        x = jax.random.uniform(jax.random.PRNGKey(3), (1000,), minval=-5.0, maxval=5.0)
        per_sample = jax.vmap(lambda xi: L.approx_kl(xi[None], jnp.zeros(1)))(x)
        assert np.all(np.asarray(per_sample) > 0.0)
        assert float(L.approx_kl(x, x)) == 0.0


class TestRatioStats:
    """Clip fractions and ratio moments on the hand-worked batch."""

    def test_unmasked(self):
        stats = L.ratio_stats(*batch(), EPS, DUAL)
        # |r - 1| > 0.2: all except r = 0.9 and r = 1.0 -> 6 / 8
        close(stats.clip_fraction, 0.75)
        # A < 0 and r > 3: only sample 6 -> 1 / 8
        close(stats.dual_clip_fraction, 0.125)
        # mean = 15.9 / 8 = 1.9875; population std = 1.7751320373425747; max = 5
        close(stats.ratio_mean, 1.9875)
        close(stats.ratio_std, 1.7751320373425747)
        close(stats.ratio_max, 5.0)

    def test_no_dual_clip(self):
        stats = L.ratio_stats(*batch(), EPS, None)
        assert float(stats.dual_clip_fraction) == 0.0
        close(stats.clip_fraction, 0.75)

    def test_masked(self):
        # keep the first four: r = [0.5, 0.9, 1.0, 1.5]; clipped [1, 0, 0, 1] -> 0.5; no dual;
        # mean 0.975; var = (0.475^2 + 0.075^2 + 0.025^2 + 0.525^2) / 4 = 0.126875,
        # std = 0.3561951712193752; max 1.5 (the masked r = 5 is ignored)
        stats = L.ratio_stats(*batch(), EPS, DUAL, mask=f32([1, 1, 1, 1, 0, 0, 0, 0]))
        close(stats.clip_fraction, 0.5)
        close(stats.dual_clip_fraction, 0.0)
        close(stats.ratio_mean, 0.975)
        close(stats.ratio_std, 0.3561951712193752)
        close(stats.ratio_max, 1.5)


class TestNormalizeAdvantages:
    """(A - mean) / (std + eps), optionally masked."""

    def test_unmasked(self):
        # mean 2.5, std sqrt(1.25) = 1.118033988749895
        out = L.normalize_advantages(f32([[1.0, 2.0], [3.0, 4.0]]))
        assert out.shape == (2, 2)
        close(out, [[-1.3416407864998738, -0.4472135954999579],
                    [0.4472135954999579, 1.3416407864998738]])

    def test_masked(self):
        # statistics over [1, 3, 5] only: mean 3, std sqrt(8/3) = 1.632993161855452;
        # the masked 100 is still transformed: 97 / 1.632993161855452 = 59.40012626
        out = L.normalize_advantages(f32([1.0, 3.0, 100.0, 5.0]), mask=f32([1, 1, 0, 1]))
        close(out, [-1.224744871391589, 0.0, 59.40012625743448, 1.224744871391589])

    def test_constant_input_is_finite(self):
        out = L.normalize_advantages(jnp.full((5,), 3.0))
        close(out, np.zeros(5))

    def test_moments_hand_values_and_pooling_equal_the_whole(self):
        # [1, 3, 5] kept (100 masked): n 3, mean 3, M2 = 4 + 0 + 4 = 8
        close(losses.weighted_moments(f32([1.0, 3.0, 100.0, 5.0]), f32([1, 1, 0, 1])), [3.0, 3.0, 8.0])
        # shards [1, 3] (n 2, mean 2, M2 2) and [5, 9, 10] (n 3, mean 8, M2 9 + 1 + 4 = 14):
        # n 5, mean (4 + 24) / 5 = 5.6, M2 = 2 + 14 + 2 * 3.6^2 + 3 * 2.4^2 = 16 + 25.92 + 17.28 = 59.2
        shards = jnp.stack([losses.weighted_moments(f32([1.0, 3.0, 0.0]), f32([1, 1, 0])),
                            losses.weighted_moments(f32([5.0, 9.0, 10.0]))])
        close(losses.pooled_moments(shards), [5.0, 5.6, 59.2], rtol=1e-6)
        rng = np.random.default_rng(0)
        values, keep = rng.normal(40.0, 3.0, (4, 3, 50)), rng.random((4, 3, 50)) > 0.3  # 4 shards x 3 minibatches
        pooled = losses.pooled_moments(losses.weighted_moments(f32(values), f32(keep)))
        for m in range(3):
            kept = values[:, m][keep[:, m]]
            close(pooled[m], [kept.size, kept.mean(), np.sum((kept - kept.mean()) ** 2)], rtol=1e-5)

    def test_gathered_moments_over_an_axis_equal_the_whole(self):
        adv = jax.random.normal(jax.random.PRNGKey(0), (4, 2, 16)) * 5.0 + 3.0
        local = jax.vmap(losses.weighted_moments)(adv)
        gathered = jax.vmap(lambda m: losses.gathered_moments(m, "dev"), axis_name="dev")(local)
        close(gathered[2], losses.weighted_moments(jnp.moveaxis(adv, 0, 1).reshape(2, -1)), rtol=1e-5)


class TestFoldedCollectives:
    def test_a_folded_psum_and_pmax_equal_per_leaf_ones_with_dtypes_kept(self):
        # (one collective each: counted in the program by test_data_parallel)
        from ppo_async.core import collectives

        tree = {"counts": jnp.arange(12, dtype=jnp.int32).reshape(4, 3), "mean": f32([0.5, 1.5, -2.0, 4.0]),
                "vector": jnp.arange(8, dtype=jnp.float32).reshape(4, 2)}
        summed = jax.vmap(lambda t: collectives.folded_psum(t, "dev"), axis_name="dev")(tree)
        assert summed["counts"].dtype == jnp.int32
        np.testing.assert_array_equal(summed["counts"][1], [18, 22, 26])
        close(summed["mean"][3], 4.0)
        close(summed["vector"][0], [12.0, 16.0])
        top = jax.vmap(lambda t: collectives.folded_pmax(t, "dev"), axis_name="dev")(tree)
        np.testing.assert_array_equal(top["counts"][0], [9, 10, 11])
        close(top["mean"][0], 4.0)


# --------------------------------------------------------------------------------------
# GAE and V-trace against plain Python reference loops
# --------------------------------------------------------------------------------------


def gae_reference(rewards, values, dones, last_value, gamma, lam):
    """Plain numpy GAE with an explicit backward loop over time."""
    T = rewards.shape[0]
    adv = np.zeros_like(values)
    next_adv = np.zeros_like(last_value)
    for t in reversed(range(T)):
        next_value = last_value if t == T - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * not_done * next_value - values[t]
        next_adv = delta + gamma * lam * not_done * next_adv
        adv[t] = next_adv
    return adv, adv + values


def vtrace_reference(rewards, values, dones, last_value, log_rho, gamma, lam, rho_bar, c_bar):
    """Plain numpy V-trace recursion v_s - V_s = delta_s + gamma (1 - d_s) c_s (v_{s+1} - V_{s+1})."""
    T = rewards.shape[0]
    rho = np.exp(log_rho)
    targets = np.zeros_like(values)
    next_diff = np.zeros_like(last_value)  # v_T - V(s_T) = 0
    for t in reversed(range(T)):
        next_value = last_value if t == T - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = np.minimum(rho_bar, rho[t]) * (rewards[t] + gamma * not_done * next_value - values[t])
        next_diff = delta + gamma * not_done * lam * np.minimum(c_bar, rho[t]) * next_diff
        targets[t] = values[t] + next_diff
    adv = np.zeros_like(values)
    for t in range(T):
        next_target = last_value if t == T - 1 else targets[t + 1]
        adv[t] = rewards[t] + gamma * (1.0 - dones[t]) * next_target - values[t]
    return adv, targets


def random_rollout(seed, T=7, N=3):
    """Random [T, N] rollout with several episode ends mid-trajectory (including t = T-1)."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    last_value = rng.normal(size=(N,))
    dones = np.zeros((T, N))
    dones[[1, 4], 0] = 1.0
    dones[2, 1] = 1.0
    dones[[0, 3, 6], 2] = 1.0
    return rewards, values, dones, last_value


def as_f32(*arrays):
    return tuple(f32(a) for a in arrays)


class TestGAE:
    """`gae` against the reference loop and closed forms."""

    def test_hand_computed(self):
        # T=3: r=[1, 0, 2], V=[0.5, 1, 1.5], d=[0, 1, 0], V_T=2, gamma=lambda=0.5
        #   delta_2 = 2 + 0.5*2 - 1.5 = 1.5                 A_2 = 1.5
        #   delta_1 = 0 + 0 - 1 = -1 (done: no bootstrap)   A_1 = -1
        #   delta_0 = 1 + 0.5*1 - 0.5 = 1                   A_0 = 1 + 0.25*(-1) = 0.75
        adv, ret = L.gae(f32([1.0, 0.0, 2.0]), f32([0.5, 1.0, 1.5]), f32([0.0, 1.0, 0.0]),
                         f32(2.0), 0.5, 0.5)
        close(adv, [0.75, -1.0, 1.5])
        close(ret, [1.25, 0.0, 3.0])

    @pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.5), (0.7, 1.0)])
    def test_matches_reference_loop(self, gamma, lam):
        r, v, d, lv = random_rollout(0)
        ref_adv, ref_ret = gae_reference(r, v, d, lv, gamma, lam)
        adv, ret = L.gae(*as_f32(r, v, d, lv), gamma, lam)
        assert adv.shape == ret.shape == (7, 3)
        close(adv, ref_adv)
        close(ret, ref_ret)
        close(ret, np.asarray(adv) + v)

    def test_bool_dones(self):
        r, v, d, lv = random_rollout(1)
        adv, _ = L.gae(f32(r), f32(v), jnp.asarray(d, bool), f32(lv), 0.99, 0.95)
        close(adv, gae_reference(r, v, d, lv, 0.99, 0.95)[0])

    def test_lambda_one_is_discounted_return_minus_value(self):
        r, v, _, lv = random_rollout(2)
        gamma, T = 0.9, r.shape[0]
        # A_t = sum_{k>=t} gamma^(k-t) r_k + gamma^(T-t) V_T - V_t (explicit sums, no recursion)
        expected = np.stack([
            sum(gamma ** (k - t) * r[k] for k in range(t, T)) + gamma ** (T - t) * lv - v[t]
            for t in range(T)
        ])
        adv, _ = L.gae(*as_f32(r, v, np.zeros_like(r), lv), gamma, 1.0)
        close(adv, expected)

    def test_lambda_zero_is_td_error(self):
        r, v, d, lv = random_rollout(3)
        gamma = 0.95
        next_v = np.concatenate([v[1:], lv[None]], axis=0)
        adv, _ = L.gae(*as_f32(r, v, d, lv), gamma, 0.0)
        close(adv, r + gamma * (1.0 - d) * next_v - v)

    def test_done_cuts_the_trace(self):
        """Changing anything after a done (including V_T) leaves earlier advantages unchanged."""
        r, v, d, lv = random_rollout(4)
        adv, _ = L.gae(*as_f32(r, v, d, lv), 0.99, 0.95)
        r2, v2 = r.copy(), v.copy()
        r2[5:, 0] += 10.0  # env 0 is done at t=4
        v2[5:, 0] -= 3.0
        adv2, _ = L.gae(*as_f32(r2, v2, d, lv + 5.0), 0.99, 0.95)
        close(adv2[:5, 0], np.asarray(adv)[:5, 0])
        # env 2 is done at t=6 (last step): V_T is never used for it
        close(adv2[:, 2], np.asarray(adv)[:, 2])


class TestVTrace:
    """`vtrace_advantages` against GAE (on-policy) and the reference recursion (off-policy)."""

    @pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.8, 0.0)])
    @pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 1.5)])
    def test_on_policy_equals_gae(self, gamma, lam, rho_bar, c_bar):
        r, v, d, lv = random_rollout(5)
        adv, targets = L.vtrace_advantages(*as_f32(r, v, d, lv), jnp.zeros((7, 3)), gamma, lam,
                                           rho_bar, c_bar)
        _, gae_returns = L.gae(*as_f32(r, v, d, lv), gamma, lam)
        close(targets, np.asarray(gae_returns))
        # the policy-gradient advantage bootstraps from the next value target
        next_t = np.concatenate([np.asarray(targets)[1:], lv[None]], axis=0)
        close(adv, r + gamma * (1.0 - d) * next_t - v)

    @pytest.mark.parametrize("rho_bar,c_bar,lam", [(1.0, 1.0, 0.95), (1.5, 0.8, 1.0), (1.0, 1.0, 0.5)])
    def test_matches_reference_with_truncation(self, rho_bar, c_bar, lam):
        r, v, d, lv = random_rollout(6)
        log_rho = np.random.default_rng(7).uniform(-1.5, 1.5, size=(7, 3))
        rho = np.exp(log_rho)
        assert (rho > max(rho_bar, 1.0)).sum() >= 5 and (rho < min(c_bar, 1.0)).sum() >= 5
        gamma = 0.97
        ref_adv, ref_targets = vtrace_reference(r, v, d, lv, log_rho, gamma, lam, rho_bar, c_bar)
        adv, targets = L.vtrace_advantages(*as_f32(r, v, d, lv, log_rho), gamma, lam, rho_bar, c_bar)
        close(targets, ref_targets)
        close(adv, ref_adv)
        # truncation matters: untruncated weights give a different answer
        _, untruncated = vtrace_reference(r, v, d, lv, log_rho, gamma, lam, np.inf, np.inf)
        assert np.max(np.abs(untruncated - ref_targets)) > 0.1

    def test_no_gradient_through_log_rho(self):
        r, v, d, lv = random_rollout(8)
        log_rho = f32(np.random.default_rng(9).uniform(-1, 1, size=(7, 3)))

        def f(lr):
            adv, targets = L.vtrace_advantages(*as_f32(r, v, d, lv), lr, 0.99, 0.95)
            return jnp.sum(adv) + jnp.sum(targets)

        close(jax.grad(f)(log_rho), np.zeros((7, 3)), atol=0)


# --------------------------------------------------------------------------------------
# Clipping properties on random inputs
# --------------------------------------------------------------------------------------


def random_policy_batch(seed=0, n=4000):
    """log ratios ~ U[-3, 3] (r in [0.05, 20]) and advantages of both signs, away from the
    clip boundaries (|r - (1 +- eps)|, |r - c| > 1e-3) so that no sample sits on a kink."""
    rng = np.random.default_rng(seed)
    log_ratio = rng.uniform(-3.0, 3.0, size=n)
    r = np.exp(log_ratio)
    keep = np.min(np.abs(r[:, None] - np.array([1 - EPS, 1 + EPS, DUAL])[None]), axis=1) > 1e-3
    adv = rng.normal(scale=2.0, size=n)
    behavior = rng.normal(scale=3.0, size=n)
    return (f32((behavior + log_ratio)[keep]), f32(behavior[keep]), f32(adv[keep]))


def grad_per_sample(objective, lp, blp, adv):
    return np.asarray(jax.jit(jax.grad(lambda x: jnp.sum(objective(x, blp, adv))))(lp))


def regimes(lp, blp, adv):
    r = np.exp(np.asarray(lp, np.float64) - np.asarray(blp, np.float64))
    a = np.asarray(adv)
    ppo_active = ((a > 0) & (r > 1 + EPS)) | ((a < 0) & (r < 1 - EPS))
    dual_active = (a < 0) & (r > DUAL)
    return r, a, ppo_active, dual_active


class TestClipProperties:
    """Dual-clip vs PPO clip objectives and where their gradients vanish."""

    def test_every_regime_is_populated(self):
        _, a, ppo_active, dual_active = regimes(*random_policy_batch())
        assert (a > 0).sum() > 1000 and (a < 0).sum() > 1000
        assert ppo_active.sum() > 500 and dual_active.sum() > 300
        assert ((a < 0) & ~ppo_active & ~dual_active).sum() > 300

    def test_dual_equals_ppo_for_non_negative_advantages(self):
        lp, blp, adv = random_policy_batch()
        ppo = np.asarray(L.ppo_clip_objective(lp, blp, adv, EPS))
        dual = np.asarray(L.dual_clip_ppo_objective(lp, blp, adv, EPS, DUAL))
        pos = np.asarray(adv) >= 0
        np.testing.assert_array_equal(dual[pos], ppo[pos])
        # A = 0 exactly: both objectives are 0
        zero = jnp.zeros(3)
        np.testing.assert_array_equal(L.dual_clip_ppo_objective(lp[:3], blp[:3], zero, EPS, DUAL), 0.0)

    def test_dual_bounded_below_for_negative_advantages(self):
        lp, blp, adv = random_policy_batch()
        dual = np.asarray(L.dual_clip_ppo_objective(lp, blp, adv, EPS, DUAL))
        ppo = np.asarray(L.ppo_clip_objective(lp, blp, adv, EPS))
        a = np.asarray(adv)
        neg = a < 0
        assert np.all(dual[neg] >= DUAL * a[neg])
        assert np.all(dual >= ppo)  # the outer max can only raise the objective
        _, _, _, dual_active = regimes(lp, blp, adv)
        close(dual[dual_active], DUAL * a[dual_active])
        assert np.all(ppo[dual_active] < DUAL * a[dual_active])  # ... where PPO alone is unbounded

    def test_ppo_gradient_zero_exactly_where_clipped(self):
        lp, blp, adv = random_policy_batch()
        r, a, ppo_active, _ = regimes(lp, blp, adv)
        g = grad_per_sample(functools.partial(L.ppo_clip_objective, clip_eps=EPS), lp, blp, adv)
        assert np.all(g[ppo_active] == 0.0)
        assert np.all(g[~ppo_active] != 0.0)
        close(g[~ppo_active], (r * a)[~ppo_active], rtol=1e-4)  # d(r A)/dlogp = r A

    def test_dual_gradient_zero_exactly_where_clipped(self):
        lp, blp, adv = random_policy_batch()
        r, a, ppo_active, dual_active = regimes(lp, blp, adv)
        active = ppo_active | dual_active
        g = grad_per_sample(
            functools.partial(L.dual_clip_ppo_objective, clip_eps=EPS, dual_clip=DUAL), lp, blp, adv)
        assert np.all(g[active] == 0.0)
        assert np.all(g[~active] != 0.0)
        close(g[~active], (r * a)[~active], rtol=1e-4)

    def test_per_sample_grad_via_vmap_matches_sum_grad(self):
        lp, blp, adv = random_policy_batch(n=300)
        g_sum = grad_per_sample(
            functools.partial(L.dual_clip_ppo_objective, clip_eps=EPS, dual_clip=DUAL), lp, blp, adv)
        g_vmap = jax.jit(jax.vmap(jax.grad(
            lambda x, b, a: L.dual_clip_ppo_objective(x, b, a, EPS, DUAL))))(lp, blp, adv)
        close(g_vmap, g_sum)

    @pytest.mark.parametrize("use_dual", [False, True])
    def test_loss_gradient_zero_exactly_where_clipped(self, use_dual):
        lp, blp, adv = random_policy_batch(seed=1)
        r, a, ppo_active, dual_active = regimes(lp, blp, adv)
        if use_dual:
            loss = lambda x: L.dual_clip_ppo_loss(x, blp, adv, EPS, DUAL)  # noqa: E731
            active = ppo_active | dual_active
        else:
            loss = lambda x: L.ppo_clip_loss(x, blp, adv, EPS)  # noqa: E731
            active = ppo_active
        g = np.asarray(jax.jit(jax.grad(loss))(lp))
        assert np.all(g[active] == 0.0)
        assert np.all(g[~active] != 0.0)
        close(g[~active], -(r * a)[~active] / a.size, rtol=1e-4)


# --------------------------------------------------------------------------------------
# Numerical robustness at extreme ratios (float32)
# --------------------------------------------------------------------------------------


class TestExtremeRatios:
    """Finite losses and gradients when log_prob - behavior_log_prob is huge."""

    # each log ratio with a positive and a negative advantage
    LOG_RATIOS = [-80.0, -80.0, -50.0, -50.0, 50.0, 50.0, 80.0, 80.0]
    ADV = [1.0, -1.0] * 4

    def inputs(self, log_ratios=None, adv=None):
        log_ratios = self.LOG_RATIOS if log_ratios is None else log_ratios
        adv = self.ADV if adv is None else adv
        blp = f32(np.linspace(-3.0, -1.0, len(log_ratios)))
        return blp + f32(log_ratios), blp, f32(adv)

    @pytest.mark.parametrize("mod", ["eager", "jit"])
    @pytest.mark.parametrize("name", ["ppo", "dual", "kl"])
    def test_finite_values_and_gradients(self, name, mod):
        M = losses if mod == "eager" else L
        lp, blp, adv = self.inputs()
        assert lp.dtype == jnp.float32
        fns = {
            "ppo": lambda x: M.ppo_clip_loss(x, blp, adv, EPS),
            "dual": lambda x: M.dual_clip_ppo_loss(x, blp, adv, EPS, DUAL),
            "kl": lambda x: M.approx_kl(x, blp),
        }
        value, grad = jax.value_and_grad(fns[name])(lp)
        assert np.isfinite(float(value))
        assert np.all(np.isfinite(np.asarray(grad)))

    def test_clipped_samples_have_zero_gradient(self):
        lp, blp, adv = self.inputs()
        g_ppo = np.asarray(jax.grad(lambda x: L.ppo_clip_loss(x, blp, adv, EPS))(lp))
        g_dual = np.asarray(jax.grad(lambda x: L.dual_clip_ppo_loss(x, blp, adv, EPS, DUAL))(lp))
        # PPO clip active: A > 0 with r >> 1 (idx 4, 6), A < 0 with r << 1 (idx 1, 3)
        assert np.all(g_ppo[[1, 3, 4, 6]] == 0.0)
        # dual clip additionally zeroes A < 0 with r >> c (idx 5, 7)
        assert np.all(g_dual[[1, 3, 4, 5, 6, 7]] == 0.0)
        # objective values: dual-clipped samples contribute exactly c * A
        obj = np.asarray(L.dual_clip_ppo_objective(lp, blp, adv, EPS, DUAL))
        close(obj[[5, 7]], [-DUAL, -DUAL])
        close(obj[[1, 3, 4, 6]], [-(1 - EPS), -(1 - EPS), 1 + EPS, 1 + EPS])

    @pytest.mark.parametrize("mod", ["eager", "jit"])
    def test_beyond_float32_exp_range(self, mod):
        """log ratio >= 88.73 overflows exp in float32; clipped samples must still give 0, not NaN."""
        M = losses if mod == "eager" else L
        lp, blp, adv = self.inputs([100.0, 100.0, 200.0, 0.1], [1.0, -1.0, -1.0, 1.0])
        g_ppo = np.asarray(jax.grad(lambda x: M.ppo_clip_loss(x, blp, adv, EPS))(lp))
        g_dual = np.asarray(jax.grad(lambda x: M.dual_clip_ppo_loss(x, blp, adv, EPS, DUAL))(lp))
        assert np.all(np.isfinite(g_ppo)) and np.all(np.isfinite(g_dual))
        assert g_ppo[0] == 0.0 and np.all(g_dual[:3] == 0.0)
        # the unclipped sample (r = e^0.1) keeps its gradient -r A / n
        close(g_dual[3], -math.exp(0.1) / 4, rtol=1e-5)
        close(M.dual_clip_ppo_loss(lp, blp, adv, EPS, DUAL), -(1.2 - 3 - 3 + math.exp(0.1)) / 4)

    def test_approx_kl_no_overflow(self):
        # one sample at log ratio 100, or 10^4 samples at 80, would overflow the float32 mean;
        # the log ratio is capped at 20: (e^20 - 1) - 20 = 485165174.40979
        close(L.approx_kl(f32([100.0]), f32([0.0])), 485165174.40979, rtol=1e-6)
        big = jnp.full((10_000,), 80.0)
        close(L.approx_kl(big, jnp.zeros_like(big)), 485165174.40979, rtol=1e-5)
        # the large negative side is linear, not capped: (e^-80 - 1) + 80 = 79
        close(L.approx_kl(f32([-80.0]), f32([0.0])), 79.0)


# --------------------------------------------------------------------------------------
# jit, traced hyperparameters, batching
# --------------------------------------------------------------------------------------


def all_losses(rollout, policy, clip_eps, dual_clip, gamma, gae_lambda):
    """The eager `losses` functions with hyperparameters as arguments (traced under jit)."""
    r, v, d, lv, log_rho = rollout
    lp, blp = policy
    adv, ret = losses.gae(r, v, d, lv, gamma, gae_lambda)
    vadv, vt = losses.vtrace_advantages(r, v, d, lv, log_rho, gamma, gae_lambda)
    stats = losses.ratio_stats(lp, blp, adv, clip_eps, dual_clip)
    return dict(
        adv=adv, ret=ret, vadv=vadv, vt=vt,
        ppo=losses.ppo_clip_loss(lp, blp, adv, clip_eps),
        dual=losses.dual_clip_ppo_loss(lp, blp, adv, clip_eps, dual_clip),
        vloss=losses.value_loss(v + 0.3, ret, v, clip_eps),
        kl=losses.approx_kl(lp, blp),
        clipfrac=stats.clip_fraction, dualfrac=stats.dual_clip_fraction,
        ratio_std=stats.ratio_std,
        norm=losses.normalize_advantages(adv),
        # distributions with a traced log_std / traced-array-derived actions
        logp=losses.gaussian_log_prob(lp[..., None], clip_eps + 0.0 * lp[..., None], blp[..., None]),
        cat=losses.categorical_log_prob(jnp.stack([lp, blp], -1), (lp > blp).astype(jnp.int32)),
    )


class TestJitAndBatching:
    """Jitted with traced hyperparameters == eager with Python floats; [T, N] batching."""

    def rollout_and_policy(self):
        r, v, d, lv = random_rollout(10)
        rng = np.random.default_rng(11)
        log_rho = rng.uniform(-1.0, 1.0, size=(7, 3))
        blp = rng.normal(size=(7, 3))
        lp = blp + rng.uniform(-2.0, 2.0, size=(7, 3))
        return as_f32(r, v, d, lv, log_rho), as_f32(lp, blp)

    def test_jit_with_traced_hyperparameters(self):
        rollout, policy = self.rollout_and_policy()
        eager = all_losses(rollout, policy, 0.2, 3.0, 0.99, 0.95)
        jitted = jax.jit(all_losses)(rollout, policy, f32(0.2), f32(3.0), f32(0.99), f32(0.95))
        assert set(eager) == set(jitted)
        for key in eager:
            close(jitted[key], np.asarray(eager[key]))
        # a sanity check that the values are non-trivial
        assert 0.0 < float(eager["clipfrac"]) < 1.0 and float(eager["dualfrac"]) > 0.0

    def test_jit_grad_of_policy_loss(self):
        _, (lp, blp) = self.rollout_and_policy()
        adv = f32(np.random.default_rng(12).normal(size=(7, 3)))
        grad_fn = jax.jit(jax.grad(losses.dual_clip_ppo_loss))
        eager = jax.grad(losses.dual_clip_ppo_loss)(lp, blp, adv, 0.2, 3.0)
        close(grad_fn(lp, blp, adv, f32(0.2), f32(3.0)), np.asarray(eager))

    def test_vmap_over_hyperparameters(self):
        """A sweep can vmap over clip_eps / gamma."""
        (r, v, d, lv, _), (lp, blp) = self.rollout_and_policy()
        adv = f32(np.random.default_rng(13).normal(size=(7, 3)))
        eps = f32([0.1, 0.2, 0.3])
        swept = jax.vmap(lambda e: L.ppo_clip_loss(lp, blp, adv, e))(eps)
        close(swept, [float(L.ppo_clip_loss(lp, blp, adv, float(e))) for e in eps])
        gammas = f32([0.9, 0.99])
        swept_adv, _ = jax.vmap(lambda g: L.gae(r, v, d, lv, g, 0.95))(gammas)
        for i, g in enumerate([0.9, 0.99]):
            close(swept_adv[i], gae_reference(*map(np.asarray, (r, v, d, lv)), g, 0.95)[0])

    def test_gae_and_vtrace_columns_independent(self):
        """[T, N] results equal running each env column [T] separately."""
        (r, v, d, lv, log_rho), _ = self.rollout_and_policy()
        adv, ret = L.gae(r, v, d, lv, 0.99, 0.95)
        vadv, vt = L.vtrace_advantages(r, v, d, lv, log_rho, 0.99, 0.95)
        for n in range(3):
            a_n, r_n = L.gae(r[:, n], v[:, n], d[:, n], lv[n], 0.99, 0.95)
            va_n, vt_n = L.vtrace_advantages(r[:, n], v[:, n], d[:, n], lv[n], log_rho[:, n], 0.99, 0.95)
            close(adv[:, n], np.asarray(a_n))
            close(ret[:, n], np.asarray(r_n))
            close(vadv[:, n], np.asarray(va_n))
            close(vt[:, n], np.asarray(vt_n))

    def test_gae_trailing_dims(self):
        """Extra trailing dims (e.g. [T, N, heads]) are handled elementwise."""
        r, v, d, lv = random_rollout(14)
        r3 = np.stack([r, 2 * r], -1)
        v3 = np.stack([v, -v], -1)
        d3 = np.stack([d, d], -1)
        lv3 = np.stack([lv, lv], -1)
        adv, _ = L.gae(*as_f32(r3, v3, d3, lv3), 0.9, 0.8)
        assert adv.shape == (7, 3, 2)
        close(adv[..., 1], gae_reference(2 * r, -v, d, lv, 0.9, 0.8)[0])

    def test_policy_losses_over_time_major_batch(self):
        """Losses over [T, N] equal the same losses over the flattened batch."""
        _, (lp, blp) = self.rollout_and_policy()
        adv = f32(np.random.default_rng(15).normal(size=(7, 3)))
        mask = f32(np.random.default_rng(16).uniform(size=(7, 3)) > 0.3)
        fl = [x.reshape(-1) for x in (lp, blp, adv, mask)]
        calls = [
            lambda x, b, a, m: L.ppo_clip_loss(x, b, a, 0.2, m),
            lambda x, b, a, m: L.dual_clip_ppo_loss(x, b, a, 0.2, 3.0, m),
            lambda x, b, a, m: L.approx_kl(x, b, m),
            lambda x, b, a, m: L.value_loss(x, b, a, 0.2, m),
            lambda x, b, a, m: L.ratio_stats(x, b, a, 0.2, 3.0, m),
        ]
        for call in calls:
            batched, flattened = call(lp, blp, adv, mask), call(*fl)
            for u, w in zip(jax.tree_util.tree_leaves(batched), jax.tree_util.tree_leaves(flattened)):
                close(u, float(w))

    def test_gaussian_log_prob_time_major(self):
        """[T, N, A] log-densities equal the numpy formula element by element."""
        rng = np.random.default_rng(17)
        mean, action = rng.normal(size=(2, 7, 3, 4))
        log_std = rng.uniform(-1.0, 1.0, size=(4,))
        out = L.gaussian_log_prob(f32(mean), f32(log_std), f32(action))
        assert out.shape == (7, 3)
        z = (action - mean) / np.exp(log_std)
        close(out, np.sum(-0.5 * z**2 - log_std - HALF_LOG_2PI, axis=-1))


# --------------------------------------------------------------------------------------
# Shape errors
# --------------------------------------------------------------------------------------


class TestShapeErrors:
    """Mismatched shapes raise instead of silently broadcasting."""

    def test_gaussian(self):
        with pytest.raises(AssertionError):
            L.gaussian_log_prob(jnp.zeros((2, 3)), jnp.zeros(3), jnp.zeros((2, 4)))
        with pytest.raises((AssertionError, ValueError, TypeError)):
            L.gaussian_log_prob(jnp.zeros((2, 3)), jnp.zeros(4), jnp.zeros((2, 3)))

    def test_categorical(self):
        with pytest.raises(AssertionError):  # wrong rank
            L.categorical_log_prob(jnp.zeros((3, 4)), jnp.zeros((3, 2), jnp.int32))
        with pytest.raises(AssertionError):  # right rank, mismatched batch (would broadcast)
            L.categorical_log_prob(jnp.zeros((3, 4)), jnp.zeros((1,), jnp.int32))
        with pytest.raises(AssertionError):
            L.categorical_log_prob(jnp.zeros((1, 4)), jnp.zeros((3,), jnp.int32))

    @pytest.mark.parametrize("fn", [
        lambda a, b, c: L.ppo_clip_objective(a, b, c, 0.2),
        lambda a, b, c: L.ppo_clip_loss(a, b, c, 0.2),
        lambda a, b, c: L.dual_clip_ppo_objective(a, b, c, 0.2, 3.0),
        lambda a, b, c: L.dual_clip_ppo_loss(a, b, c, 0.2, 3.0),
        lambda a, b, c: L.ratio_stats(a, b, c, 0.2, 3.0),
    ])
    @pytest.mark.parametrize("bad", [0, 1, 2])
    def test_policy_losses(self, fn, bad):
        args = [jnp.zeros((4, 3)) for _ in range(3)]
        args[bad] = jnp.zeros((4, 1))  # broadcastable, so only the shape check can catch it
        with pytest.raises(AssertionError):
            fn(*args)

    def test_approx_kl_and_value_loss(self):
        with pytest.raises(AssertionError):
            L.approx_kl(jnp.zeros((4, 3)), jnp.zeros((4, 1)))
        with pytest.raises(AssertionError):
            L.value_loss(jnp.zeros((4, 3)), jnp.zeros((3,)))
        with pytest.raises(AssertionError):
            L.value_loss(jnp.zeros((4, 3)), jnp.zeros((4, 3)), jnp.zeros((1, 3)), 0.2)

    def test_advantage_estimators(self):
        z = jnp.zeros((7, 3))
        with pytest.raises(AssertionError):
            L.gae(z, z, jnp.zeros((7, 1)), jnp.zeros(3), 0.99, 0.95)
        with pytest.raises(AssertionError):
            L.gae(z, z, z, jnp.zeros(1), 0.99, 0.95)
        with pytest.raises(AssertionError):
            L.gae(z, jnp.zeros((6, 3)), z, jnp.zeros(3), 0.99, 0.95)
        with pytest.raises(AssertionError):
            L.vtrace_advantages(z, z, z, jnp.zeros(3), jnp.zeros((7, 1)), 0.99, 0.95)
        with pytest.raises(AssertionError):
            L.vtrace_advantages(z, z, z, jnp.zeros((1,)), z, 0.99, 0.95)


# --------------------------------------------------------------------------------------
# Decoupled PPO (Hilton et al. 2021) and the effective sample size
# --------------------------------------------------------------------------------------

# The hand-worked batch again, now with a proximal policy between pi_theta and mu: pi / pi_prox
# is RATIOS (the clipped ratio) and pi_prox / mu = PROX_W (the importance weight), truncated at
# is_clip = 2. Per sample w * ppo_obj and w * dual_obj, w = min(PROX_W, 2):
#   PROX_W  w    ppo_obj  w*ppo     dual_obj  w*dual
#   1.0    1.0    0.5     0.5        0.5       0.5
#   0.5    0.5    1.8     0.9        1.8       0.9
#   2.0    2.0   -1.0    -2.0       -1.0      -2.0
#   4.0    2.0    1.2     2.4        1.2       2.4     <- truncated
#   1.0    1.0   -3.0    -3.0       -3.0      -3.0
#   0.25   0.25  -0.8    -0.2       -0.8      -0.2
#   1.0    1.0   -5.0    -5.0       -3.0      -3.0
#   3.0    2.0    1.2     2.4        1.2       2.4     <- truncated
# sum(w*ppo) = -4.0 -> loss 0.5; sum(w*dual) = -2.0 -> loss 0.25.
# Untruncated (is_clip = inf): w = PROX_W: sum(w*ppo) = 0.5+0.9-2+4.8-3-0.2-5+3.6 = -0.4 -> loss 0.05.
PROX_W = np.array([1.0, 0.5, 2.0, 4.0, 1.0, 0.25, 1.0, 3.0])
IS_CLIP = 2.0


def decoupled_batch():
    """(log_prob, prox_log_prob, behavior_log_prob, advantages) realising RATIOS and PROX_W."""
    behavior = np.linspace(-2.0, -0.5, RATIOS.size)
    prox = behavior + np.log(PROX_W)
    return f32(prox + np.log(RATIOS)), f32(prox), f32(behavior), f32(ADVS)


def reference_decoupled(lp, plp, blp, adv, eps, c, is_clip):
    """A float64 loop over samples, written from the paper's equation (dual clip where A < 0)."""
    out = []
    for x, p, b, a in zip(*(np.asarray(v, np.float64) for v in (lp, plp, blp, adv))):
        r, w = math.exp(x - p), min(math.exp(p - b), is_clip)
        obj = min(r * a, min(max(r, 1 - eps), 1 + eps) * a)
        if a < 0:
            obj = max(obj, c * a)
        out.append(w * obj)
    return np.array(out)


class TestDecoupled:
    def test_hand_values(self):
        lp, plp, blp, adv = decoupled_batch()
        f = jax.jit(losses.decoupled_ppo_loss)
        close(f(lp, plp, blp, adv, EPS, math.inf, IS_CLIP), 0.5)
        close(f(lp, plp, blp, adv, EPS, DUAL, IS_CLIP), 0.25)
        close(f(lp, plp, blp, adv, EPS, math.inf, math.inf), 0.05)
        # mask keeps 0, 1, 2, 3, 6: (0.5 + 0.9 - 2 + 2.4 - 5) / 5 = -0.64
        close(f(lp, plp, blp, adv, EPS, math.inf, IS_CLIP, f32(MASK)), 0.64)
        close(losses.proximal_weight(plp, blp, IS_CLIP), np.minimum(PROX_W, IS_CLIP))

    def test_matches_a_reference_loop(self):
        lp, blp, adv = random_policy_batch(seed=3, n=500)
        plp = blp + f32(np.random.default_rng(4).normal(scale=1.0, size=blp.shape))
        for c, is_clip in ((math.inf, 2.0), (DUAL, 2.0), (DUAL, math.inf), (math.inf, 1.0)):
            got = jax.jit(losses.decoupled_ppo_objective)(lp, plp, blp, adv, EPS, c, is_clip)
            close(got, reference_decoupled(lp, plp, blp, adv, EPS, c, is_clip), rtol=1e-4, atol=1e-5)

    def test_equals_ppo_exactly_when_the_proximal_policy_is_the_behaviour(self):
        lp, blp, adv = random_policy_batch(seed=5)
        mask = f32(np.random.default_rng(6).random(blp.shape) < 0.8)
        for c in (math.inf, DUAL):
            for is_clip in (1.0, IS_CLIP, math.inf):
                dec = jax.jit(lambda x: losses.decoupled_ppo_loss(x, blp, blp, adv, EPS, c, is_clip, mask))  # noqa: B023
                ppo = jax.jit(lambda x: losses.dual_clip_ppo_loss(x, blp, adv, EPS, c, mask))  # noqa: B023
                assert float(dec(lp)) == float(ppo(lp))
                np.testing.assert_array_equal(np.asarray(jax.grad(dec)(lp)), np.asarray(jax.grad(ppo)(lp)))

    def test_gradient_is_the_weighted_ppo_gradient_and_zero_where_clipped(self):
        lp, blp, adv = random_policy_batch(seed=7)
        plp = blp + f32(np.random.default_rng(8).uniform(-1.5, 1.5, size=blp.shape))
        r, a, ppo_active, _ = regimes(lp, plp, adv)  # the clip is relative to pi_prox
        w = np.minimum(np.exp(np.asarray(plp, np.float64) - np.asarray(blp, np.float64)), IS_CLIP)
        g = np.asarray(jax.jit(jax.grad(lambda x: losses.decoupled_ppo_loss(x, plp, blp, adv, EPS, math.inf, IS_CLIP)))(lp))
        assert np.all(g[ppo_active] == 0.0) and np.all(g[~ppo_active] != 0.0)
        close(g[~ppo_active], -(w * r * a)[~ppo_active] / a.size, rtol=1e-4)
        # no gradient flows into the proximal or behaviour log-probs (both constants)
        g_prox = jax.grad(lambda p: losses.decoupled_ppo_loss(lp, p, blp, adv, EPS, math.inf, IS_CLIP))(plp)
        g_beh = jax.grad(lambda b: losses.decoupled_ppo_loss(lp, plp, b, adv, EPS, math.inf, IS_CLIP))(blp)
        # (pi_prox enters r's denominator, but the weight is a constant, so d/d prox is through r only)
        assert np.all(np.asarray(g_beh) == 0.0)
        assert np.isfinite(np.asarray(g_prox)).all()

    def test_huge_stale_weights_stay_finite(self):
        lp = f32([0.0, -1.0])
        plp, blp, adv = f32([0.0, -1.0]), f32([-200.0, -150.0]), f32([1.0, -1.0])  # pi_prox / mu = e^200
        out = jax.jit(losses.decoupled_ppo_loss)(lp, plp, blp, adv, EPS, DUAL, math.inf)
        assert np.isfinite(float(out))
        close(jax.jit(losses.decoupled_ppo_loss)(lp, plp, blp, adv, EPS, DUAL, IS_CLIP), -(2.0 * 1.0 + 2.0 * -1.0) / 2)


class TestEss:
    def test_hand_values_and_extremes(self):
        # w = [1, 1, 2, 4]: (8)^2 / (4 * 22) = 0.727272...
        f = jax.jit(losses.ess_fraction, static_argnames="num_segments")
        close(f(f32(np.log([1.0, 1.0, 2.0, 4.0]))), [64 / 88])
        close(f(f32([0.3, 0.3, 0.3])), [1.0])  # equal weights: every sample counts
        close(f(f32([0.0, -80.0, -80.0, -80.0])), [0.25], rtol=1e-4)  # one sample holds all the weight: 1/n
        close(f(f32([500.0, 499.0])), [(1 + math.exp(-1)) ** 2 / (2 * (1 + math.exp(-2)))])  # no overflow
        # masked samples take no part; segments are separate; an empty segment is NaN
        log_w = f32(np.log([1.0, 1.0, 2.0, 4.0, 9.0]))
        close(f(log_w, mask=f32([1, 1, 1, 1, 0])), [64 / 88])
        per = np.asarray(f(log_w, segment_ids=jnp.array([0, 0, 1, 1, 1]), num_segments=3))
        close(per[:2], [1.0, (2 + 4 + 9) ** 2 / (3 * (4 + 16 + 81))])
        assert np.isnan(per[2])

    def test_is_scale_invariant_and_matches_numpy(self):
        log_w = np.random.default_rng(0).normal(scale=2.0, size=300)
        w = np.exp(log_w)
        expected = w.sum() ** 2 / (w.size * np.square(w).sum())
        close(losses.ess_fraction(f32(log_w)), [expected], rtol=1e-4)
        close(losses.ess_fraction(f32(log_w + 50.0)), [expected], rtol=1e-4)
