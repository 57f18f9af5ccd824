"""What the ``field-*`` Hydra apps share: the shipped config directory, the checks that refuse an
unusable command line before anything runs, and how a run's status becomes the process's exit status."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightning_field.checkpoint.options import FLAT_NAMES
from lightning_field.conf import CONFIG_DIR, compose_config
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.integrations.hydra_configs import (
    TargetConfigError,
    apply_target_swaps,
    prepare_target_overrides,
    register_configs,
)
from lightning_field.state.secrets import replace_secrets, scrub_override, scrub_secrets, secret_values

EXIT_BAD_CONFIG = 2


def import_from_working_directory() -> None:
    """As with ``python -m``, modules in the current directory are importable by ``_target_`` (the
    child processes the apps start get it on their PYTHONPATH likewise)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def hydra_main(
    config_name: str,
    run: Callable[[DictConfig], int],
    app_name: str | None = None,
    validate: Callable[[DictConfig], str | None] | None = None,
) -> None:
    """Compose ``config_name`` from the shipped configs (type-checked) and exit with ``run``'s status.

    An unusable command line (an unknown key or group option, a swapped target that does not take
    the given keys, or what ``validate`` finds wrong in the composed config) exits 2 with a one-line
    cause before Hydra creates a run directory or ``run`` starts anything.
    """
    app_name = app_name or config_name.replace("_", "-")
    register_configs()
    import_from_working_directory()
    # Rewritten in sys.argv itself: Lightning's DDP launcher starts the other ranks from it.
    sys.argv[1:] = prepare_target_overrides(sys.argv[1:])
    problem = composition_problem(config_name, sys.argv[1:], validate)
    if problem:
        print(f"{app_name}: {problem}", file=sys.stderr)
        sys.exit(EXIT_BAD_CONFIG)

    @hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3")
    def app(cfg: DictConfig) -> None:
        try:
            apply_target_swaps(cfg, HydraConfig.get().overrides.task)
        except TargetConfigError as err:
            print(f"{app_name}: {err}", file=sys.stderr)
            sys.exit(EXIT_BAD_CONFIG)
        _rewrite_saved_config(cfg)
        code = run(cfg)
        if code:
            sys.exit(code)

    app()


def _rewrite_saved_config(cfg: DictConfig) -> None:
    """Hydra saved the composed config, its own config and the overrides (``.hydra/``) before the
    target swap, secrets and all: save what runs, with every secret redacted
    (:mod:`lightning_field.state.secrets`), before the run starts. ``cfg`` itself keeps them."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.output_subdir is None:
        return
    saved = Path(hydra_cfg.runtime.output_dir) / str(hydra_cfg.output_subdir)
    overrides = [str(o) for o in hydra_cfg.overrides.task]
    composed = OmegaConf.to_container(cfg, resolve=False)
    secrets = secret_values(composed, overrides)
    documents = {
        "config.yaml": replace_secrets(scrub_secrets(composed), secrets),
        "overrides.yaml": [scrub_override(o) for o in overrides],
    }
    if (saved / "hydra.yaml").is_file():
        documents["hydra.yaml"] = replace_secrets(OmegaConf.to_container(OmegaConf.load(saved / "hydra.yaml")), secrets)
    for name, document in documents.items():
        if (saved / name).is_file():
            atomic_write_bytes(saved / name, OmegaConf.to_yaml(OmegaConf.create(document)).encode())


def composition_problem(
    config_name: str, arguments: Sequence[str], validate: Callable[[DictConfig], str | None] | None = None
) -> str | None:
    """Why these overrides cannot compose into a runnable config, in one line, or None.

    Hydra would print the same errors itself, but as a traceback hint and with exit status 1, the
    status that means "the run failed". Command lines with Hydra's own flags (``-m``, ``--cfg``,
    ``--config-dir``) are left to Hydra, which alone knows what they change.
    """
    if any(a.startswith("-") for a in arguments):
        return None
    try:
        cfg = apply_target_swaps(compose_config(config_name, arguments), arguments)
        return validate(cfg) if validate is not None else None
    except TargetConfigError as err:
        return str(err)
    except (HydraException, OmegaConfBaseException) as err:
        unknown = re.search(r"Could not override '([^']+)'", str(err))
        if unknown:
            return _unknown_key(config_name, arguments, unknown.group(1))
        merging = re.match(r"Error merging override (\S+)", str(err))
        if merging and err.__cause__ is not None:  # a wrongly typed value: the cause says how
            return f"{merging.group(1)}: {str(err.__cause__).strip().splitlines()[0]}"
        return one_line(str(err))
    return None


def _unknown_key(config_name: str, arguments: Sequence[str], key: str) -> str:
    """``model.hiddn: no such key; model has features, hidden, ...``: the keys that do exist there.
    A flat checkpoint option of 0.x (``callbacks.checkpoint.snapshot_dir``) is named with its group's key."""
    parent, _, leaf = key.rpartition(".")
    if leaf in FLAT_NAMES and parent.rpartition(".")[2] == "checkpoint":  # the shipped callbacks.checkpoint
        group, field = FLAT_NAMES[leaf]
        return f"{key}: ManifestCheckpoint's options are grouped now; write {parent}.{group}.{field}=..."
    others = [a for a in arguments if a.split("=", 1)[0].lstrip("+~") != key]
    try:
        node = compose_config(config_name, others)
        for part in parent.split(".") if parent else []:
            node = node[part]
    except Exception:  # the rest of the command line has problems of its own: name this one only
        node = None
    known = f"; {parent or 'the config'} has {', '.join(map(str, node.keys()))}" if isinstance(node, DictConfig) else ""
    return f"{key}: no such key{known} (to add a new key on purpose: +{key}=...)"


def one_line(message: str) -> str:
    """A multi-line Hydra message as one line (``Available options in 'experiment': a, b``)."""
    # Hydra appends its config search path to a missing-option error: not the user's problem.
    message = message.split("Config search path", 1)[0]
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    text = " ".join(lines)
    listed = re.match(r"(.*Available options in '[^']+':) (.*)", text)
    return f"{listed.group(1)} {listed.group(2).replace(' ', ', ')}" if listed else text
