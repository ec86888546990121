"""``clawrl users list`` and ``clawrl sessions list --user`` on a store file; the console line
names the user."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawrl.cli import main
from clawrl.cli.serve import request_line
from clawrl.errors import StoreError
from clawrl.store import SessionSource, Store, TurnRecord
from clawrl.store.db import open_database
from clawrl.store.migrations import migrate


def _record(db: str, session: str, user: str) -> TurnRecord:
    with Store(db) as store:
        store.get_or_create_session(session, SessionSource.HEADER)
        turn = TurnRecord(session_id=session, prompt_ids=[1, 2], completion_ids=[3],
                          sampling_logprobs=[-0.1], user_id=user)  # fmt: skip
        store.record_turn(turn)
    return turn


def test_users_list_and_the_sessions_of_one_user(tmp_path, capsys):
    db = str(tmp_path / "u.db")
    Store(db).close()
    assert main(["users", "list", "--store", db]) == 0
    assert "no turns recorded yet" in capsys.readouterr().out
    turn = _record(db, "sess-alice", "alice")
    _record(db, "sess-bob", "bob")
    _record(db, "sess-anon", "")
    assert main(["users", "list", "--store", db]) == 0
    out = capsys.readouterr().out
    assert "users: 3" in out and "alice" in out and "bob" in out and "(none)" in out
    assert main(["users", "list", "--json", "--store", db]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["user_id"]: r["turns"] for r in rows} == {"alice": 1, "bob": 1, "": 1}
    assert main(["sessions", "list", "--user", "alice", "--store", db]) == 0
    out = capsys.readouterr().out
    assert "sess-alice" in out and "sess-bob" not in out and "sess-anon" not in out
    assert " user alice turn " in request_line([turn])


def test_a_store_from_before_users_is_migrated_or_says_how(tmp_path, capsys):
    db = str(tmp_path / "old.db")
    old = open_database(db)
    try:
        assert migrate(old, target=7) == 7
    finally:
        old.close()
    with Store(db, read_only=True) as store:  # read-only: never migrated
        with pytest.raises(StoreError, match=r"schema version 7.*clawrl store migrate"):
            store.users()
        assert [s.session.id for s in store.list_sessions(user="")] == []
    assert main(["users", "list", "--store", db]) == 0  # an older file is migrated on open
    assert "no turns recorded yet" in capsys.readouterr().out
    with Store(db, read_only=True) as store:
        assert store.schema_version == 8


def test_users_adapter_records_a_snapshot_of_an_adapter_that_fits(tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    from clawrl.models import tiny_policy

    db = str(tmp_path / "u.db")
    _record(db, "sess-alice", "alice")
    tiny = tiny_policy(seed=1).model
    tiny.config.save_pretrained(str(tmp_path / "tiny"))  # the served model (its config)
    model = get_peft_model(tiny, LoraConfig(r=2, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))  # fmt: skip
    model.save_pretrained(str(tmp_path / "ad"))
    args = ["--model", str(tmp_path / "tiny"), "--into", str(tmp_path / "into"), "--store", db]
    for want in (1, 2):
        assert main(["users", "adapter", "alice", str(tmp_path / "ad"), *args]) == 0
        assert f"user alice: adapter v{want} = {tmp_path / 'into'}" in capsys.readouterr().out
    with Store(db) as store:
        versions = store.user_adapter_versions("alice")
    assert [r.version for r in versions] == [1, 2]
    assert all(r.weights.startswith(str(tmp_path / "into")) for r in versions)
    (tmp_path / "ad" / "adapter_model.safetensors").write_bytes(b"rewritten")
    assert (Path(versions[0].weights) / "adapter_model.safetensors").stat().st_size > 100
    assert main(["users", "list", "--store", db]) == 0
    assert " v2 " in capsys.readouterr().out
    # what the engine could not serve is refused when it is recorded, saying why
    assert main(["users", "adapter", "alice", str(tmp_path / "nothing"), *args]) == 1
    err = capsys.readouterr().err
    assert "is not a plain PEFT LoRA adapter directory" in err and "save_pretrained" in err
    model.save_pretrained(str(tmp_path / "ad"))
    assert main(["users", "adapter", "alice", str(tmp_path / "ad"), "--store", db]) == 1
    err = capsys.readouterr().err  # an adapter of the tiny model, against smollm2-135m
    assert "is not an adapter of smollm2-135m" in err and "do not fit" in err
    assert main(["users", "adapter", "a\nb", str(tmp_path / "ad"), *args]) == 1
    assert "control character" in capsys.readouterr().err
    with Store(db) as store:
        assert [r.version for r in store.user_adapter_versions("alice")] == [1, 2]


def test_user_settings_are_checked_with_a_reason():
    from clawrl.config import load_config
    from clawrl.errors import ConfigError

    assert load_config(None, ['server.user_from=["key"]']).server.user_from == ["key"]
    with pytest.raises(ConfigError, match="names a source twice"):
        load_config(None, ['server.user_from=["key", "key"]'])
    with pytest.raises(ConfigError, match="'header', 'body' or 'key'"):
        load_config(None, ['server.user_from=["ip"]'])
    cfg = load_config(None, ["server.per_user_adapters=true", 'engine.backend="vllm"'])
    assert cfg.server.per_user_adapters  # vLLM serves them too
    with pytest.raises(ConfigError, match="clawrl train trains the shared policy only") as e:
        load_config(None, ["server.per_user_adapters=true", "server.external_trainer=true",
                           'trainer.method="rl"'])  # fmt: skip
    assert "Value error" not in str(e.value)
