"""clawrl's reference terminal agent: an OpenAI chat loop with one ``shell`` tool and a step limit.

Standard library only: it runs as a script inside the sandbox (``python reference_agent.py``),
configured by environment variables:

=========================  ===============================================================
``CLAWRL_BASE_URL``        the OpenAI base URL (``.../s/{rollout_id}/v1``)
``CLAWRL_MODEL``           the model name to send
``CLAWRL_INSTRUCTION``     the task (first user message)
``CLAWRL_MAX_STEPS``       model calls at most (default 2)
``CLAWRL_TEMPERATURE``     sampling temperature (default 0.7)
``CLAWRL_MAX_TOKENS``      completion tokens per call (default 64)
``CLAWRL_TOOLS``           ``1`` declares the ``shell`` tool; ``0`` (default) does not
``CLAWRL_FEW_SHOT``        ``1`` (default) sends :data:`EXAMPLES` as earlier turns
=========================  ===============================================================

Each step asks the model for the next action. A command is taken from, in order: the first
``shell`` tool call; else the first fenced code block (```bash / ```sh / ```); else a reply of
one line that starts like a shell command. The command runs with ``sh -c`` in the current
directory (the sandbox's work dir), its output (stdout+stderr, cut to 1,500 characters) goes
back as the tool result (or as a user message after a code block). A reply without a command
ends the run, as does the step limit. A JSON summary is printed last.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

SYSTEM = (
    "You are a shell agent in a Linux directory. Reply with one shell command in a ```bash "
    "block. When the task is done, reply DONE."
)
EXAMPLES = [
    ("Create a file named x.txt containing the word cat.", "echo cat > x.txt"),
    ("Delete the file a.log.", "rm a.log"),
    ("Count the lines in in.txt and write the number into n.txt.", "wc -l < in.txt > n.txt"),
    ("In pets.txt, replace the word cat with dog.", "sed -i 's/cat/dog/' pets.txt"),
]
"""Few-shot (task, command) pairs sent as earlier turns (small models need them): each is the
task, the command, its output (``(exit code 0)``) and the reply ``DONE``, so the model sees a
finished task end rather than a second command that undoes the first."""
SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command in the working directory and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command"}},
            "required": ["command"],
        },
    },
}
_FENCE = re.compile(r"```[ \t]*(?:bash|sh|shell|console)?[ \t]*\n(.*?)(?:```|\Z)", re.S)
_COMMAND_WORDS = (
    "echo", "printf", "cat", "sed", "wc", "grep", "ls", "mkdir", "cp", "mv", "rm", "touch",
    "python3", "head", "tail", "sort", "tr", "cut", "find", "awk",
)  # fmt: skip
MAX_OUTPUT = 1500


def extract_command(message: dict) -> tuple[str | None, str | None]:
    """The command of an assistant message and the tool-call id it came from (or None)."""
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        if fn.get("name") != "shell":
            continue
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            continue
        if isinstance(args, dict) and isinstance(args.get("command"), str) and args["command"]:
            return args["command"], call.get("id")
    text = message.get("content") or ""
    match = _FENCE.search(text)
    if match and match.group(1).strip():
        return match.group(1).strip(), None
    line = text.strip().strip("`").strip()
    if line and "\n" not in line and line.split()[0] in _COMMAND_WORDS:
        return line, None
    return None, None


def run_command(command: str) -> str:
    """Run ``command`` with ``sh -c``; its output and exit status, cut to ``MAX_OUTPUT``."""
    try:
        proc = subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, errors="replace", timeout=20
        )
        out = (proc.stdout + proc.stderr)[-MAX_OUTPUT:]
        return f"{out}\n(exit code {proc.returncode})" if out else f"(exit code {proc.returncode})"
    except subprocess.TimeoutExpired:
        return "(command timed out after 20s)"


def chat(base_url: str, body: dict, retries: int = 3) -> dict:
    """POST ``/chat/completions``; retries connection errors and 5xx with backoff."""
    data = json.dumps(body).encode()
    for attempt in range(retries + 1):
        req = urllib.request.Request(
            f"{base_url}/chat/completions",
            data=data,
            headers={"Content-Type": "application/json", "Authorization": "Bearer x"},
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            if e.code < 500 or attempt == retries:
                raise
        except (urllib.error.URLError, ConnectionError):
            if attempt == retries:
                raise
        time.sleep(0.5 * 2**attempt)
    raise RuntimeError("unreachable")


def main() -> int:
    """Run the loop; print a JSON summary; exit 0 unless the model could not be called."""
    base = os.environ["CLAWRL_BASE_URL"].rstrip("/")
    steps = int(os.environ.get("CLAWRL_MAX_STEPS", "2"))
    tools = os.environ.get("CLAWRL_TOOLS", "0") == "1"
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    if os.environ.get("CLAWRL_FEW_SHOT", "1") == "1":
        for task, example in EXAMPLES:
            messages.append({"role": "user", "content": task})
            messages.append({"role": "assistant", "content": f"```bash\n{example}\n```"})
            messages.append({"role": "user", "content": "Output:\n(exit code 0)"})
            messages.append({"role": "assistant", "content": "DONE"})
    messages.append({"role": "user", "content": os.environ["CLAWRL_INSTRUCTION"]})
    summary: dict[str, Any] = {"steps": 0, "commands": [], "stop": "step_limit"}
    for _ in range(steps):
        body = {
            "model": os.environ.get("CLAWRL_MODEL", "policy"),
            "messages": messages,
            "temperature": float(os.environ.get("CLAWRL_TEMPERATURE", "0.7")),
            "max_tokens": int(os.environ.get("CLAWRL_MAX_TOKENS", "64")),
        }
        if tools:
            body["tools"] = [SHELL_TOOL]
        try:
            reply = chat(base, body)
        except (urllib.error.URLError, ConnectionError) as e:
            summary["stop"] = f"model_error: {e}"
            print(json.dumps(summary))
            return 3
        summary["steps"] += 1
        message = reply["choices"][0]["message"]
        command, call_id = extract_command(message)
        assistant: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            assistant["tool_calls"] = message["tool_calls"]
        messages.append(assistant)
        if command is None:
            summary["stop"] = "done" if "DONE" in assistant["content"] else "no_command"
            break
        summary["commands"].append(command)
        output = run_command(command)
        if call_id is not None:
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
            for extra in message["tool_calls"][1:]:  # answer every call the model made
                messages.append({"role": "tool", "tool_call_id": extra.get("id"), "content": ""})
        else:
            messages.append({"role": "user", "content": f"Output:\n{output}"})
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
