"""The built-in task suite, generated: ``python -m clawrl.harness.suite DIR`` writes it to DIR.

Eleven kinds of small shell tasks, four variants each (44 tasks): the first variant of each kind
is held out, the other three are for training. Verifiers are Python scripts that give partial
credit (0.5 for the right file existing, 1.0 for the right content), so groups have reward
variance even when no rollout fully succeeds. The shipped copy lives in
``clawrl/harness/tasks``; a test checks that it equals this generator's output.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SHEBANG = "#!/usr/bin/env python3\n"
VERDICT = 'import json, os\n\ndef done(r):\n    print(json.dumps({"reward": r}))\n\n'


@dataclass
class Spec:
    """One generated task: instruction, starting files, the verifier's body."""

    id: str
    instruction: str
    verify: str
    files: dict[str, str] = field(default_factory=dict)


def _read(name: str) -> str:
    return (
        f"def read(p):\n    try:\n        return open(p).read()\n"
        f"    except OSError:\n        return None\n\ntext = read({name!r})\n"
    )


def create_file(i: int) -> Spec:
    name, word = [("hello.txt", "hello"), ("note.txt", "apple"), ("a.txt", "blue"),
                  ("out.txt", "seven")][i]  # fmt: skip
    body = _read(name) + (
        f"done(0.0 if text is None else 1.0 if text.strip() == {word!r} else 0.5)\n"
    )
    return Spec(f"create-file-{i}", f"Create a file named {name} containing the word {word}.", body)


def write_number(i: int) -> Spec:
    name, n = [("number.txt", 42), ("n.txt", 7), ("answer.txt", 100), ("x.txt", 3)][i]
    body = _read(name) + f"done(0.0 if text is None else 1.0 if text.strip() == '{n}' else 0.5)\n"
    return Spec(f"write-number-{i}", f"Write the number {n} into a file named {name}.", body)


def count_lines(i: int) -> Spec:
    lines = [3, 5, 8, 12][i]
    data = "".join(f"line {k + 1}\n" for k in range(lines))
    body = _read("count.txt") + (
        f"done(0.0 if text is None else 1.0 if text.strip() == '{lines}' else 0.5)\n"
    )
    instruction = "Count the lines in data.txt and write the number into count.txt."
    return Spec(f"count-lines-{i}", instruction, body, {"data.txt": data})


def find_word(i: int) -> Spec:
    word = ["banana", "rocket", "violet", "turtle"][i]
    owner = ["b.txt", "c.txt", "a.txt", "b.txt"][i]
    files = {n: "nothing to see here\n" for n in ("a.txt", "b.txt", "c.txt")}
    files[owner] = f"the {word} is here\n"
    body = _read("answer.txt") + (
        f"done(0.0 if text is None else 1.0 if text.strip() == {owner!r} else 0.5)\n"
    )
    instruction = f"Which file contains the word {word}? Write its file name into answer.txt."
    return Spec(f"find-word-{i}", instruction, body, files)


_BUGS = [
    ("add", "a - b", "a + b", "add(2, 3) == 5"),
    ("mul", "a + b", "a * b", "mul(2, 3) == 6"),
    ("sub", "a + b", "a - b", "sub(5, 3) == 2"),
    ("biggest", "min(a, b)", "max(a, b)", "biggest(2, 3) == 3"),
]


def fix_bug(i: int) -> Spec:
    fn, bad, good, check = _BUGS[i]
    calc = f"def {fn}(a, b):\n    return {bad}\n"
    check_py = f"from calc import {fn}\n\nassert {check}\nprint('OK')\n"
    body = (
        "import importlib.util, sys\n"
        "sys.path.insert(0, os.getcwd())\n"
        "if not os.path.exists('calc.py'):\n    done(0.0)\n    raise SystemExit\n"
        "try:\n    spec = importlib.util.spec_from_file_location('calc', 'calc.py')\n"
        "    mod = importlib.util.module_from_spec(spec)\n    spec.loader.exec_module(mod)\n"
        f"    want = lambda a, b: {good}\n"
        f"    ok = all(mod.{fn}(a, b) == want(a, b) for a, b in [(2, 3), (7, 4)])\n"
        "except Exception:\n    ok = False\n"
        "done(1.0 if ok else 0.0)\n"
    )
    instruction = (
        f"Fix the bug in calc.py so that python3 check.py prints OK. {fn} should return {good}."
    )
    return Spec(f"fix-bug-{i}", instruction, body, {"calc.py": calc, "check.py": check_py})


def make_dir(i: int) -> Spec:
    name = ["build", "logs", "data", "backup"][i]
    body = f"done(1.0 if os.path.isdir({name!r}) else 0.5 if os.path.exists({name!r}) else 0.0)\n"
    return Spec(f"make-dir-{i}", f"Create a directory named {name}.", body)


def copy_file(i: int) -> Spec:
    src, dst = [("source.txt", "copy.txt"), ("a.txt", "b.txt"), ("main.txt", "main.bak"),
                ("data.txt", "data2.txt")][i]  # fmt: skip
    content = f"content of {src}\n"
    body = _read(dst) + (
        f"ok_src = read({src!r}) == {content!r}\n"
        f"done(0.0 if text is None else 1.0 if text == {content!r} and ok_src else 0.5)\n"
    )
    return Spec(f"copy-file-{i}", f"Copy {src} to {dst}.", body, {src: content})


def rename_file(i: int) -> Spec:
    src, dst = [("old.txt", "new.txt"), ("draft.txt", "final.txt"), ("x.txt", "y.txt"),
                ("tmp.txt", "keep.txt")][i]  # fmt: skip
    content = f"content of {src}\n"
    body = _read(dst) + (
        f"gone = not os.path.exists({src!r})\n"
        f"done(0.0 if text is None else 1.0 if text == {content!r} and gone else 0.5)\n"
    )
    return Spec(f"rename-file-{i}", f"Rename {src} to {dst}.", body, {src: content})


def delete_file(i: int) -> Spec:
    name = ["junk.txt", "old.log", "temp.txt", "trash.txt"][i]
    body = (
        "keep = open('keep.txt').read() == 'keep me\\n' if os.path.exists('keep.txt') else False\n"
        f"gone = not os.path.exists({name!r})\n"
        "done(1.0 if gone and keep else 0.5 if gone else 0.0)\n"
    )
    files = {name: "delete me\n", "keep.txt": "keep me\n"}
    return Spec(f"delete-file-{i}", f"Delete the file {name}.", body, files)


def append_line(i: int) -> Spec:
    line = ["done", "bye", "end", "finished"][i]
    base = "first\nsecond\n"
    body = _read("notes.txt") + (
        "lines = (text or '').splitlines()\n"
        f"ok = lines[:2] == ['first', 'second'] and lines[-1:] == [{line!r}] and len(lines) == 3\n"
        f"done(1.0 if ok else 0.5 if {line!r} in (text or '') else 0.0)\n"
    )
    instruction = f"Add the line {line} to the end of notes.txt."
    return Spec(f"append-line-{i}", instruction, body, {"notes.txt": base})


def replace_word(i: int) -> Spec:
    word = ["moon", "there", "friend", "team"][i]
    body = _read("greeting.txt") + (
        f"t = (text or '').strip()\n"
        f"done(1.0 if t == 'hello {word}' else 0.5 if {word!r} in t else 0.0)\n"
    )
    instruction = f"In greeting.txt, replace the word world with {word}."
    return Spec(f"replace-word-{i}", instruction, body, {"greeting.txt": "hello world\n"})


KINDS: list[Callable[[int], Spec]] = [
    create_file, write_number, count_lines, find_word, fix_bug, make_dir, copy_file,
    rename_file, delete_file, append_line, replace_word,
]  # fmt: skip
VARIANTS = 4


def specs() -> list[Spec]:
    """Every task of the suite."""
    return [kind(i) for kind in KINDS for i in range(VARIANTS)]


def _toml(spec: Spec, split: str) -> str:
    return (
        f"id = {json.dumps(spec.id)}\ninstruction = {json.dumps(spec.instruction)}\n"
        f'time_limit_s = 300\nsplit = "{split}"\n\n[harness]\nmax_steps = 2\n'
    )


def write_suite(root: str | Path) -> list[str]:
    """Write the suite under ``root`` (replacing task folders of the same ids); returns ids."""
    root = Path(root)
    ids = []
    for spec in specs():
        folder = root / spec.id
        if folder.exists():
            shutil.rmtree(folder)
        (folder / "files").mkdir(parents=True)
        split = "heldout" if spec.id.endswith("-0") else "train"
        (folder / "task.toml").write_text(_toml(spec, split))
        for name, text in spec.files.items():
            (folder / "files" / name).write_text(text)
        verify = folder / "verify"
        verify.write_text(SHEBANG + VERDICT + spec.verify)
        os.chmod(verify, 0o755)
        ids.append(spec.id)
    return ids


if __name__ == "__main__":
    print(f"wrote {len(write_suite(sys.argv[1]))} tasks to {sys.argv[1]}")
