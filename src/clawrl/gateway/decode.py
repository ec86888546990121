"""From sampled token ids to the text the client sees, incrementally.

The client-visible text of a completion is the decoding of its sampled ids (special tokens kept,
so nothing the policy wrote disappears) without the final stop token (EOS or a requested stop
token id), cut before the first occurrence of any requested stop string (OpenAI semantics: the
stop sequence is not returned). The ids themselves are never changed: the turn keeps every
sampled id, stop token and stop-string tokens included.

:class:`TextAssembler` releases that text in deltas as tokens arrive, holding back
(a) an incomplete UTF-8 character (a byte-level token that decodes to ``"\\ufffd"`` so far) and
(b) a tail that could still grow into a stop string, so a streamed client never sees text that a
later stop string would have cut.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_REPLACEMENT = "\ufffd"


def decode(tokenizer: Any, ids: list[int]) -> str:
    """Decode ids exactly: special tokens kept, no clean-up of spaces."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def token_piece(tokenizer: Any, token_id: int) -> str:
    """The text of one token for ``logprobs`` entries (may be ``"\\ufffd"`` for a partial byte)."""
    return decode(tokenizer, [token_id])


class TextAssembler:
    """Incremental detokenizer with stop-string truncation.

    Args:
        tokenizer: the policy's tokenizer.
        stop_token_ids: ids that end a completion (EOS, requested stop ids); when such an id is
            the last sampled one it is not part of the text.
        stop_strings: requested stop strings; text is cut before the first one.
    """

    def __init__(
        self, tokenizer: Any, stop_token_ids: Iterable[int], stop_strings: Iterable[str] = ()
    ) -> None:
        self._tok = tokenizer
        self._stop_ids = frozenset(int(i) for i in stop_token_ids)
        self._stops = tuple(s for s in stop_strings if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._text = ""  # decoded so far (complete characters only)
        self._released = 0  # chars of _text already returned
        self._cut: int | None = None  # index of the first stop string in _text
        self.stop_string: str | None = None

    @property
    def text(self) -> str:
        """The client-visible text so far (released or not), cut at a stop string if one hit."""
        return self._text if self._cut is None else self._text[: self._cut]

    def push(self, token_id: int, *, last: bool = False) -> str:
        """Add one sampled id and return the text newly released to the client (maybe ``""``).

        Args:
            token_id: the sampled id.
            last: this is the completion's last token (then everything left is released).
        """
        if self._cut is None and not (last and token_id in self._stop_ids):
            self._ids.append(int(token_id))
            self._decode_new()
        if last:
            self._finish_decode()
        return self._release(final=last)

    def finish(self) -> str:
        """Release whatever is held back (call when the stream ended without a last token)."""
        self._finish_decode()
        return self._release(final=True)

    def _decode_new(self) -> None:
        prefix = decode(self._tok, self._ids[self._prefix_offset : self._read_offset])
        full = decode(self._tok, self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            self._text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)

    def _finish_decode(self) -> None:
        if self._read_offset < len(self._ids):
            prefix = decode(self._tok, self._ids[self._prefix_offset : self._read_offset])
            full = decode(self._tok, self._ids[self._prefix_offset :])
            self._text += full[len(prefix) :]
            self._prefix_offset = self._read_offset = len(self._ids)

    def _release(self, *, final: bool) -> str:
        if self._cut is None and self._stops:
            start = max(0, self._released - self._hold)
            hits = [(at, s) for s in self._stops if (at := self._text.find(s, start)) >= 0]
            if hits:
                self._cut, self.stop_string = min(hits)
        end = len(self._text) if self._cut is None else self._cut
        if self._cut is None and not final:
            end = max(self._released, end - self._hold)
        delta = self._text[self._released : end]
        self._released = max(self._released, end)
        return delta


def visible_text(
    tokenizer: Any, ids: list[int], stop_token_ids: Iterable[int], stop_strings: Iterable[str]
) -> tuple[str, str | None]:
    """The client-visible text of a whole completion and the stop string that cut it (if any).

    Same result as pushing every id through a :class:`TextAssembler`, in one decode.
    """
    stop_ids = frozenset(int(i) for i in stop_token_ids)
    body = ids[:-1] if ids and ids[-1] in stop_ids else ids
    text = decode(tokenizer, list(body))
    hits = [(at, s) for s in stop_strings if s and (at := text.find(s)) >= 0]
    if not hits:
        return text, None
    at, s = min(hits)
    return text[:at], s
