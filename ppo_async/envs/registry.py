"""The env registry: env names by family, the pip extra of each optional family, the names a
family registers and the backends of the physics families.

Names choose the family by prefix: gymnax names as they are, `brax/<name>`,
`playground/<name>`, `gymnasium/<id>`, `envpool/<id>` (EnvPool's C++ builds of Gymnasium's
MuJoCo tasks, e.g. `envpool/HalfCheetah-v5`). Family packages are imported lazily, only when their
names are asked for.
"""

from __future__ import annotations

import os

from ppo_async.envs.gymnax_import import import_gymnax
from ppo_async.errors import ConfigError


HOST_ENV_FAMILIES = ("gymnasium", "envpool")  # stepped on the host by each sampler thread: threaded mode only

# The pip extra that installs each optional family and the module it provides.
ENV_EXTRAS = {"brax": ("brax", "brax"), "playground": ("playground", "mujoco_playground"),
              "gymnasium": ("gymnasium", "gymnasium"), "envpool": ("envpool", "envpool")}

ENVPOOL_SUITE = "envpool.mujoco.gym"  # the EnvPool module of the tasks `envpool/<id>` accepts

FAMILY_NAMES = "gymnax names as they are; brax/<name>, playground/<name>, gymnasium/<id>, envpool/<id>"

def split_env_name(name: str) -> tuple[str, str]:
    """`"brax/ant"` -> `("brax", "ant")`; a name without a known prefix is gymnax's."""
    family, sep, task = name.partition("/")
    if sep and family in ENV_EXTRAS:
        return family, task
    return "gymnax", name

def require_env_family(family: str, field_name: str = "env") -> None:
    """ConfigError naming the pip extra when an optional env family is not installed."""
    if family not in ENV_EXTRAS:
        return
    import importlib.util

    extra, module = ENV_EXTRAS[family]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"{field_name} names a {family} environment, but {module!r} is not installed: "
            f"pip install -e \".[{extra}]\" (or \".[dev]\", which installs every env family)"
        )

def _brax_registry_from_source() -> tuple[str, ...] | None:
    """The keys of the `_envs = {...}` dict literal in the installed `brax/envs/__init__.py`,
    read without importing brax; None when brax or that literal is not found."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("brax")  # a top-level package: found, not imported
        path = os.path.join(os.path.dirname(spec.origin), "envs", "__init__.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (AttributeError, TypeError, OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["_envs"]
                and isinstance(node.value, ast.Dict)):
            keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            return tuple(keys) if len(keys) == len(node.value.keys) and keys else None
    return None


def known_env_names(family: str = "gymnax") -> tuple[str, ...]:
    """Names a family registers, read from the family's own registry (imported lazily;
    optional families must be installed)."""
    if family == "gymnax":
        gymnax = import_gymnax()
        return tuple(gymnax.registered_envs)  # public: listed in gymnax.__all__
    require_env_family(family)
    if family == "brax":
        # brax 0.14.2's `brax/envs/__init__.py` has no public accessor for the registered names
        # (only get_environment / register_environment / create), so read its registry dict:
        # from the module's source where it is a literal (importing brax takes seconds: MJX),
        # else from the imported module.
        names = _brax_registry_from_source()
        if names is None:
            from brax import envs as brax_envs

            names = tuple(brax_envs._envs)
        return tuple(sorted(names))
    if family == "playground":
        from mujoco_playground import dm_control_suite

        # public (mujoco_playground.__all__, also reached as registry.dm_control_suite): the DM
        # Control Suite tasks; `registry.ALL_ENVS` adds the locomotion and manipulation tasks,
        # which this package does not accept (checked against playground 0.2.0).
        return tuple(dm_control_suite.ALL_ENVS)
    if family == "envpool":
        from envpool.registration import registry

        # envpool 1.2.5 lists its ids publicly (`envpool.list_all_envs()`: 1,651 of them, Atari to
        # MyoSuite) but not their suites; its registry's `specs` maps each id to `(module, spec
        # class, kwargs)`, and the module says which are Gymnasium's MuJoCo tasks (checked
        # against envpool 1.2.5: 11 tasks, v2 to v5 as EnvPool registers them; every task has a v5).
        return tuple(sorted(task for task, entry in registry.specs.items() if entry[0] == ENVPOOL_SUITE))
    import gymnasium

    return tuple(sorted(gymnasium.registry))  # public: gymnasium.registry (gymnasium.__all__)

def check_env_name(name: str, field_name: str = "env") -> None:
    """Raises ConfigError listing the known environments of the name's family when `name`
    is not one of them (and naming the extra to install when the family is missing)."""
    family, task = split_env_name(name)
    require_env_family(family, field_name)
    known = known_env_names(family)
    if task not in known:
        prefix = "" if family == "gymnax" else f"{family}/"
        raise ConfigError(
            f"{field_name} = {name!r} is not a known {family} environment; known: "
            f"{', '.join(prefix + k for k in known)} (env families: {FAMILY_NAMES})"
        )

BRAX_BACKENDS = ("generalized", "positional", "spring", "mjx")

PLAYGROUND_BACKENDS = ("jax", "warp")
