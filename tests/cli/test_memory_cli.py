"""``clawrl memory list|show|add|edit|forget`` on a store file."""

from __future__ import annotations

import json

from clawrl.cli import main
from clawrl.store import Store


def test_memory_commands(tmp_path, capsys):
    db = str(tmp_path / "m.db")
    Store(db).close()
    assert main(["memory", "list", "--store", db]) == 0
    assert "no memory entries" in capsys.readouterr().out
    assert main(["memory", "add", "Keep it short.", "--store", db]) == 0
    added = capsys.readouterr().out
    assert added.startswith("added ")
    with Store(db) as store:
        (entry,) = store.memory_entries()
    eid = entry.id
    assert added.split()[1].rstrip(":") == eid[:12]
    assert main(["memory", "add", "keep it short please", "--store", db]) == 0
    assert capsys.readouterr().out.startswith(f"merged into {eid[:12]}")
    assert main(["memory", "list", "--json", "--store", db]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["support"] == 2 and row["text"] == "keep it short please"
    assert main(["memory", "edit", eid[:6], "--text", "Two sentences at most.", "--store", db]) == 0
    assert main(["memory", "show", eid[:6], "--store", db]) == 0
    shown = capsys.readouterr().out
    assert "Two sentences at most." in shown and "edited" in shown and "merged" in shown
    assert main(["memory", "edit", eid, "--off", "--store", db]) == 0
    capsys.readouterr()
    assert main(["memory", "list", "--store", db]) == 0
    assert "no memory entries" in capsys.readouterr().out
    assert main(["memory", "list", "--all", "--store", db]) == 0
    assert "disabled" in capsys.readouterr().out
    assert main(["memory", "forget", eid, "--store", db]) == 0
    assert main(["memory", "forget", eid, "--store", db]) == 1
    with Store(db) as store:
        assert "Two sentences" not in str(store.get_memory_entry(eid))
    capsys.readouterr()
    assert main(["memory", "show", "zz", "--store", db]) == 1
    assert "no memory entry starts with 'zz'" in capsys.readouterr().err
    assert main(["memory", "edit", eid, "--store", db]) == 1
    assert "nothing to change" in capsys.readouterr().err
    assert main(["memory", "add", "x" * 501, "--store", db]) == 1
    assert "at most 500 characters, got 501" in capsys.readouterr().err


def test_memory_list_piped_keeps_each_entry_on_one_line(tmp_path, capsys):
    """Piped (not a terminal), the table is as wide as the longest text: grep finds a whole
    entry on one line."""
    db = str(tmp_path / "m.db")
    Store(db).close()
    text = "Lead with the number, then two casual sentences, and never use headings or bold."
    assert main(["memory", "add", text, "--store", db]) == 0
    capsys.readouterr()
    assert main(["memory", "list", "--store", db]) == 0
    assert any(text in line for line in capsys.readouterr().out.splitlines())
