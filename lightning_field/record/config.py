"""The record's configuration: the shipped ``record`` Hydra group, composed with the user's overrides.

Conditions, the exposure ladder and the sign-off roles are data, not code, so a team can make an
advisory condition critical, tighten a maximum age or add a ladder level on the command line. The
composed configuration is validated here, once, so a typo names itself before any source is read,
and it is stored in the record so ``check`` re-evaluates with exactly what ``build`` used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightning_field.conf import compose_config
from lightning_field.record.conditions import CHECKS
from lightning_field.record.errors import RecordConfigError

__all__ = ["RecordConfig", "RecordConfigError", "load_record_config", "parse_record_config"]

SEVERITIES = ("critical", "advisory")
IDENTITY_GROUPS = ("code", "config", "data", "model")
VERIFY_CHOICES = ("newest", "all")
WANDB_LOG_CHOICES = ("auto", True, False)


@dataclass
class ConditionSpec:
    name: str
    check: str
    severity: str
    max_age_hours: float | None
    compare_identity: list[str]
    description: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def critical(self) -> bool:
        return self.severity == "critical"


@dataclass
class LadderLevel:
    name: str
    description: str
    requires: list[str]


@dataclass
class SignoffBundle:
    name: str
    roles: list[str]
    conditions: list[str]


@dataclass
class RecordConfig:
    config_keys: list[str]
    conditions: list[ConditionSpec]
    ladder: list[LadderLevel]
    roles: list[str]
    bundles: list[SignoffBundle]
    enforce_signoff: bool
    verify_checkpoints: str
    wandb_log: Any
    wandb_mode: str | None
    raw: dict[str, Any] = field(default_factory=dict)

    def condition(self, name: str) -> ConditionSpec | None:
        return next((c for c in self.conditions if c.name == name), None)

    def roles_for(self, condition: str) -> list[str]:
        """The roles that must sign for ``condition`` (through the bundles that name it)."""
        roles: list[str] = []
        for bundle in self.bundles:
            if condition in bundle.conditions:
                roles += [r for r in bundle.roles if r not in roles]
        return roles

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "raw"}


def compose_record_config(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The ``record`` group composed from the shipped configs with Hydra overrides, as plain data.

    Hydra's compose API, not ``@hydra.main``: ``field record`` is an argparse command whose
    overrides are one option among others, and it must not change the working directory or logging.
    """
    # No primary config lists the group, so choosing an option (record=strict) means adding it.
    chosen = [o for o in overrides if o.lstrip("+").split("=", 1)[0] == "record" and "=" in o]
    rest = [o for o in overrides if o not in chosen]
    group = ["+" + chosen[-1].lstrip("+")] if chosen else ["+record=default"]
    try:
        cfg = compose_config(None, [*group, *rest])
        data = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise RecordConfigError(f"record configuration: {err}") from None
    assert isinstance(data, dict)
    record = data.get("record")
    if not isinstance(record, dict):
        raise RecordConfigError("record configuration: the composed config has no `record` section")
    return record


def _names(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise RecordConfigError(f"{where} must be a list of names, got {value!r}")
    return list(value)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RecordConfigError(f"{where} must be a mapping, got {value!r}")
    return value


def parse_record_config(raw: Mapping[str, Any]) -> RecordConfig:
    """Validate a composed (or stored) ``record`` configuration; every error names its key."""
    raw = _mapping(raw, "record")
    conditions = []
    for name, entry in _mapping(raw.get("conditions") or {}, "record.conditions").items():
        where = f"record.conditions.{name}"
        entry = _mapping(entry, where)
        unknown = set(entry) - {"check", "severity", "max_age_hours", "compare_identity", "description", "params"}
        if unknown:
            raise RecordConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
        check = entry.get("check")
        if check not in CHECKS:
            raise RecordConfigError(f"{where}.check: {check!r} is not one of {sorted(CHECKS)}")
        severity = entry.get("severity")
        if severity not in SEVERITIES:
            raise RecordConfigError(f"{where}.severity: {severity!r} is not one of {list(SEVERITIES)}")
        age = entry.get("max_age_hours")
        if age is not None and (isinstance(age, bool) or not isinstance(age, (int, float)) or age <= 0):
            raise RecordConfigError(f"{where}.max_age_hours: {age!r} must be a positive number of hours or null")
        groups = _names(entry.get("compare_identity"), f"{where}.compare_identity")
        bad = sorted(set(groups) - set(IDENTITY_GROUPS))
        if bad:
            raise RecordConfigError(f"{where}.compare_identity: {bad} not among {list(IDENTITY_GROUPS)}")
        params = dict(_mapping(entry.get("params") or {}, f"{where}.params"))
        CHECKS[check].validate(params, f"{where}.params")
        conditions.append(
            ConditionSpec(
                name=str(name),
                check=str(check),
                severity=str(severity),
                max_age_hours=float(age) if age is not None else None,
                compare_identity=groups,
                description=str(entry.get("description") or ""),
                params=params,
            )
        )
    if not conditions:
        raise RecordConfigError("record.conditions is empty: a record with no conditions decides nothing")
    known = {c.name for c in conditions}
    ladder = []
    for name, entry in _mapping(raw.get("ladder") or {}, "record.ladder").items():
        entry = _mapping(entry, f"record.ladder.{name}")
        requires = _names(entry.get("requires"), f"record.ladder.{name}.requires")
        missing = sorted(set(requires) - known)
        if missing:
            raise RecordConfigError(f"record.ladder.{name}.requires names unknown condition(s) {missing}")
        ladder.append(LadderLevel(str(name), str(entry.get("description") or name), requires))
    signoff = _mapping(raw.get("signoff") or {}, "record.signoff")
    roles = _names(signoff.get("roles"), "record.signoff.roles")
    bundles = []
    for name, entry in _mapping(signoff.get("bundles") or {}, "record.signoff.bundles").items():
        entry = _mapping(entry, f"record.signoff.bundles.{name}")
        bundle_roles = _names(entry.get("roles"), f"record.signoff.bundles.{name}.roles")
        if set(bundle_roles) - set(roles):
            raise RecordConfigError(
                f"record.signoff.bundles.{name}.roles: {sorted(set(bundle_roles) - set(roles))} not in"
                f" record.signoff.roles {roles}"
            )
        named = _names(entry.get("conditions"), f"record.signoff.bundles.{name}.conditions")
        if set(named) - known:
            raise RecordConfigError(
                f"record.signoff.bundles.{name}.conditions names unknown condition(s) {sorted(set(named) - known)}"
            )
        bundles.append(SignoffBundle(str(name), bundle_roles, named))
    identity = _mapping(raw.get("identity") or {}, "record.identity")
    keys = _names(identity.get("config_keys"), "record.identity.config_keys")
    if not keys:
        raise RecordConfigError("record.identity.config_keys is empty: no configuration would be compared")
    verify = raw.get("verify_checkpoints", "newest")
    if verify not in VERIFY_CHOICES:
        raise RecordConfigError(f"record.verify_checkpoints: {verify!r} is not one of {list(VERIFY_CHOICES)}")
    wandb_cfg = _mapping(raw.get("wandb") or {}, "record.wandb")
    log = wandb_cfg.get("log", "auto")
    if log not in WANDB_LOG_CHOICES:
        raise RecordConfigError(f"record.wandb.log: {log!r} is not auto, true or false")
    mode = wandb_cfg.get("mode")
    if mode not in (None, "offline", "online"):
        raise RecordConfigError(f"record.wandb.mode: {mode!r} is not null, offline or online")
    enforce = signoff.get("enforce", False)
    if not isinstance(enforce, bool):
        raise RecordConfigError(f"record.signoff.enforce: {enforce!r} is not true or false")
    return RecordConfig(
        config_keys=keys,
        conditions=conditions,
        ladder=ladder,
        roles=roles,
        bundles=bundles,
        enforce_signoff=enforce,
        verify_checkpoints=str(verify),
        wandb_log=log,
        wandb_mode=mode,
        raw=dict(raw),
    )


def load_record_config(overrides: Sequence[str] = ()) -> RecordConfig:
    return parse_record_config(compose_record_config(overrides))
