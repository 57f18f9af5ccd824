"""The secret filter redacts secrets and only secrets, and a redacted value still takes part in the
resume check: a changed secret, like a changed tokenizer, refuses the resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import make_trainer

from lightning_field import ResumeMismatchError, read_manifest
from lightning_field.record.identity import project_config
from lightning_field.state.secrets import is_redacted, is_secret_key, redact, scrub_secrets
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor

SECRET_KEYS = [
    "api_key", "apikey", "apiKey", "API-KEY", "wandb_api_key", "password", "db_password", "passwd", "secret",
    "client_secret", "secret_name", "token", "TOKEN", "access_token", "hf_token", "HF_TOKEN", "authToken",
    "auth_token", "refresh-token", "access_key", "aws_access_key_id", "secret_access_key",
    "AWS_SECRET_ACCESS_KEY", "credentials", "gcp_credentials", "private_key", "ssh-private-key", "privateKey",
]  # fmt: skip
NOT_SECRET_KEYS = [
    "tokenizer", "tokenizer_name", "max_tokens", "maxTokens", "tokens", "num_tokens", "tokens_seen",
    "token_budget", "tokens_per_step", "pad_token", "eos_token", "bos_token_id", "max_token", "next_token",
    "author", "authority", "keyboard", "key", "monkey", "primary_key_column", "secretary_count", "vocab",
    "passage", "accessor", "lr", "batch_size",
]  # fmt: skip
SECRET_VALUES = [
    "0123456789abcdef0123456789abcdef01234567",  # a W&B API key
    "local-0123456789abcdef0123456789abcdef01234567",
    "sk-proj-Abcdefghijklmnopqrstuvwxyz012345",
    "sk-ant-api03-abcdefghijklmnopqrstuv",
    "AKIAIOSFODNN7EXAMPLE",
    "ASIAY34FZKBOKMUTVV7A",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "github_pat_11ABCDEFG0abcdefghijklmn_opqrstuvwxyz",
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
    "xoxb-1234567890-abcdefghij",
    "postgresql://trainer:hunter2@db.internal:5432/runs",
    "Bearer sk-abcdefghijklmnopqrstuvwxyz",
]
NOT_SECRET_VALUES = [
    "gpt2",
    "meta-llama/Llama-3.1-8B",
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",  # a SHA-256 digest, not a W&B key
    "sk-learn",
    "hf_hub_cache",
    "AKIA-not-a-key",
    "https://example.com/data/shard-0001.tar",
    "s3://bucket/run/ckpts",
    "<pad>",
    "token",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_a_key_that_names_a_secret_is_redacted(key: str) -> None:
    assert is_secret_key(key)
    scrubbed = scrub_secrets({"section": {key: "value-1"}})["section"][key]
    assert is_redacted(scrubbed) and "value-1" not in scrubbed


@pytest.mark.parametrize("key", NOT_SECRET_KEYS)
def test_a_key_that_only_contains_a_secret_word_is_kept_in_full(key: str) -> None:
    assert not is_secret_key(key)
    assert scrub_secrets({"section": {key: "value-1"}}) == {"section": {key: "value-1"}}


@pytest.mark.parametrize("value", SECRET_VALUES)
def test_a_value_that_looks_like_a_credential_is_redacted_under_any_key(value: str) -> None:
    scrubbed = scrub_secrets({"notes": value, "items": [value]})
    assert is_redacted(scrubbed["notes"]) and is_redacted(scrubbed["items"][0])
    assert value not in json.dumps(scrubbed)


@pytest.mark.parametrize("value", NOT_SECRET_VALUES)
def test_an_ordinary_value_is_kept_in_full(value: str) -> None:
    assert scrub_secrets({"notes": value}) == {"notes": value}


def test_the_marker_is_a_digest_that_changes_with_the_secret_and_is_stable() -> None:
    one, again, other = redact("hunter2"), redact("hunter2"), redact("hunter3")
    assert one == again != other and one.startswith("<redacted:pbkdf2:") and "hunter2" not in one
    # Scrubbing twice (the app, then the W&B logger) changes nothing; nor does a non-string secret leak.
    config = {"db": {"password": "hunter2", "port": 5432}, "credentials": {"user": "ann", "key": "k3y-v4lue"}}
    assert scrub_secrets(scrub_secrets(config)) == scrub_secrets(config)
    assert is_redacted(scrub_secrets(config)["credentials"]) and "k3y-v4lue" not in json.dumps(scrub_secrets(config))
    # An unset secret says so: None and flags hold nothing to hide.
    assert scrub_secrets({"api_key": None, "use_auth_token": True}) == {"api_key": None, "use_auth_token": True}


def test_the_record_projection_redacts_what_a_hydra_config_or_bundle_holds_in_full() -> None:
    resolved = {"model": {"hidden": 8}, "data": {"hf_token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"}, "seed": 1}
    projection = project_config(resolved, ["model", "data", "seed"])
    assert projection is not None and is_redacted(projection["data"]["hf_token"])
    # ... and compares equal to the manifest's view of the same config, which was scrubbed at save time.
    assert project_config(scrub_secrets(resolved), ["model", "data", "seed"]) == projection


# ---------------------------------------------------------------------------------------------- end to end
WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"


def _config(**data: Any) -> dict[str, Any]:
    base = {"tokenizer": "gpt2", "max_tokens": 128, "hf_token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"}
    return {"data": {**base, **data}, "logger": {"api_key": WANDB_KEY}}


def _fit(root: Path, steps: int, config: dict[str, Any], resume: bool = False) -> None:
    trainer = make_trainer(root, steps, config=config)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64), ckpt_path="last" if resume else None)


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    _fit(tmp_path, 2, _config())
    return tmp_path


def test_tokenizer_and_max_tokens_are_in_the_manifest_in_full_and_secrets_are_not(trained: Path) -> None:
    path = trained / "ckpts" / "epoch=0-step=2"
    text = (path / "manifest.json").read_text()
    resolved = read_manifest(path).provenance["config"]["resolved"]
    assert resolved["data"]["tokenizer"] == "gpt2" and resolved["data"]["max_tokens"] == 128
    assert is_redacted(resolved["data"]["hf_token"]) and is_redacted(resolved["logger"]["api_key"])
    assert WANDB_KEY not in text and "hf_AbCdEf" not in text


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"tokenizer": "llama"}, "config.resolved.data.tokenizer"),
        ({"max_tokens": 4096}, "config.resolved.data.max_tokens"),
        ({"hf_token": "hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa76543210"}, "config.resolved.data.hf_token"),
    ],
)
def test_a_changed_tokenizer_max_tokens_or_secret_refuses_the_resume(
    trained: Path, change: dict[str, Any], key: str
) -> None:
    with pytest.raises(ResumeMismatchError) as info:
        _fit(trained, 4, _config(**change), resume=True)
    message = str(info.value)
    assert key in message
    assert "hf_ZyXwVu" not in message and "hf_AbCdEf" not in message  # the refusal names, never shows, a secret


def test_the_same_config_with_the_same_secrets_resumes(trained: Path) -> None:
    _fit(trained, 4, _config(), resume=True)
    assert read_manifest(trained / "ckpts" / "epoch=0-step=4").step == 4


def test_a_secret_recorded_by_an_older_checkpoint_as_the_bare_marker_does_not_refuse_the_resume() -> None:
    from lightning_field.state.provenance_compare import diff_provenance

    saved = {"config": {"resolved": {"wandb": {"api_key": "<redacted>"}, "data": {"tokenizer": "<redacted>"}}}}
    current = {"config": {"resolved": scrub_secrets({"wandb": {"api_key": "abc"}, "data": {"tokenizer": "gpt2"}})}}
    # The secret matches; the wrongly redacted tokenizer is still a visible difference.
    assert list(diff_provenance(saved, current)) == ["config.resolved.data.tokenizer"]


def test_an_override_with_a_secret_key_or_a_credential_value_is_redacted_and_the_others_kept() -> None:
    from lightning_field.state.secrets import replace_secrets, scrub_override, secret_values

    overrides = [f"+logger.api_key={WANDB_KEY}", "data.url='https://u:hunter2hunter2@host/x'", "trainer.max_steps=4",
                 "+data.tokenizer=gpt2", "~callbacks.drill", "db_password=short"]  # fmt: skip
    scrubbed = [scrub_override(o) for o in overrides]
    assert scrubbed[0].startswith("+logger.api_key=<redacted:pbkdf2:") and scrubbed[1].startswith("data.url=<redacted")
    assert scrubbed[2:5] == overrides[2:5] and scrubbed[5].startswith("db_password=<redacted")
    assert [scrub_override(o) for o in scrubbed] == scrubbed  # idempotent

    found = secret_values({"wandb": {"api_key": WANDB_KEY}, "seed": 12345678}, overrides)
    assert WANDB_KEY in found and "short" not in found and "12345678" not in found  # too short to search for
    dirname = {"job": {"override_dirname": f"+logger.api_key={WANDB_KEY},trainer.max_steps=4"}}
    shown = str(replace_secrets(dirname, found))
    assert WANDB_KEY not in shown and "max_steps=4" in shown
