"""Deterministic word-level tokenizer and chat template of the emulated replica.

Properties the prefix cache relies on (tested):
- Tokenisation is a pure function of the text, and a message's tokens depend only on that
  message, so a multi-turn conversation's prompt tokens are a prefix of the next turn's.
- Generated text re-tokenises to exactly the generated ids: output tokens are lexicon words,
  the first emitted bare and the rest with one leading space, which is how ``encode`` splits
  such text.

Token ids are ``stable_key(token_text) % (VOCAB_SIZE - N_SPECIAL) + N_SPECIAL`` (collisions are
harmless: they only make two different texts look alike to the cache, with negligible odds).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from services.sim.engine.tokens import VOCAB_SIZE, stable_key, synthetic_token_id

IM_START = 1
IM_END = 2
N_SPECIAL = 16

# A token is optional leading whitespace + a run of word characters, or optional leading
# whitespace + one other symbol, or a whitespace run at the end of the text.
_TOKEN_RE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70 syllables
LEXICON_SIZE = 4096


def _make_word(k: int) -> str:
    # Two or three syllables, a bijection of k in [0, 4096) onto pseudo-words.
    a, rest = k % 70, k // 70
    b, c = rest % 70, rest // 70
    return _SYLLABLES[a] + _SYLLABLES[b] + (_SYLLABLES[c] if c else "")


LEXICON: tuple[str, ...] = tuple(_make_word(k) for k in range(LEXICON_SIZE))


@lru_cache(maxsize=1 << 18)
def token_id(text: str) -> int:
    return stable_key(text) % (VOCAB_SIZE - N_SPECIAL) + N_SPECIAL


def encode(text: str) -> list[int]:
    return [token_id(t) for t in _TOKEN_RE.findall(text)]


def split(text: str) -> list[str]:
    """The token texts of ``text`` (``encode``'s pieces; joined they give ``text`` back)."""
    return list(_TOKEN_RE.findall(text))


def output_piece(word_index: int, position_in_output: int) -> str:
    """Text of one generated token (first bare, later ones space-prefixed)."""
    word = LEXICON[word_index % LEXICON_SIZE]
    return word if position_in_output == 0 else " " + word


def plan_text_output(seed: int, n: int) -> list[str]:
    """The ``n`` generated pieces of a text-mode request (deterministic in ``seed``)."""
    return [output_piece(stable_key(f"{seed}:{j}"), j) for j in range(n)]


def plan_synthetic_output(session_id: str, prompt_tokens: int, n: int) -> list[str]:
    """Pieces for contract-B output: word of token ``prompt_tokens + j`` of the session."""
    return [output_piece(synthetic_token_id(session_id, prompt_tokens + j), j) for j in range(n)]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                parts.append(json.dumps(part, sort_keys=True, separators=(",", ":")))
        return "".join(parts)
    return json.dumps(content, sort_keys=True, separators=(",", ":"))


def _message_tokens(message: dict[str, Any]) -> list[int]:
    role = str(message.get("role", "user"))
    toks = [IM_START, token_id(role), token_id("\n")]
    if message.get("name"):
        toks += encode(f"name: {message['name']}\n")
    toks += encode(_content_text(message.get("content")))
    if message.get("tool_calls"):
        toks += encode(json.dumps(message["tool_calls"], sort_keys=True, separators=(",", ":")))
    if message.get("tool_call_id"):
        toks += encode(f"\ntool_call_id: {message['tool_call_id']}")
    toks += [IM_END, token_id("\n")]
    return toks


def apply_chat_template(
    messages: list[dict[str, Any]], tools: list[Any] | None = None, add_generation_prompt: bool = True
) -> list[int]:
    """ChatML-like template: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message.

    Tools (if any) come first as their own block, so they do not disturb later prefixes.
    """
    toks: list[int] = []
    if tools:
        toks += [IM_START, token_id("tools"), token_id("\n")]
        toks += encode(json.dumps(tools, sort_keys=True, separators=(",", ":")))
        toks += [IM_END, token_id("\n")]
    for m in messages:
        toks += _message_tokens(m)
    if add_generation_prompt:
        toks += [IM_START, token_id("assistant"), token_id("\n")]
    return toks
