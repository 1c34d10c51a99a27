"""Freeze rules: volatile segments of the shared leading content become stable placeholders, their values given after it."""

from __future__ import annotations

import json

from prefix_routing.rules.constants import (
    FREEZE_LINE_RE,
    PLACEHOLDER_PARTS_RE,
    PLACEHOLDER_RE,
    FREEZE_HEADER,
    SYSTEM_ROLES,
)
from prefix_routing.rules.notes import Notes
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings
from prefix_routing.rules.text import text_rules


class _FreezeState:
    """Placeholder assignments of one body (or one completion prompt string)."""

    __slots__ = ("by_value", "next_index", "new_lines", "counts")

    def __init__(self) -> None:
        self.by_value: dict[tuple[str, str], str] = {}
        self.next_index: dict[str, int] = {}
        self.new_lines: list[str] = []
        self.counts: dict[str, int] = {}

    def learn_text(self, text: str) -> None:
        """Existing placeholders (from an earlier normalization) reserve their numbers."""
        if "⟦" in text:
            for name, number in PLACEHOLDER_PARTS_RE.findall(text):
                self.next_index[name] = max(self.next_index.get(name, 1), int(number) + 1)

    def learn_block(self, block: str) -> None:
        for line in block.split("\n")[1:]:
            match = FREEZE_LINE_RE.fullmatch(line)
            if not match:
                continue
            try:
                value = json.loads(match.group(2))
            except ValueError:
                continue
            if isinstance(value, str):
                name, _, _ = match.group(1)[1:-1].partition(":")
                self.by_value.setdefault((name, value), match.group(1))
        self.learn_text(block)

    def placeholder(self, name: str, value: str) -> str:
        self.counts[name] = self.counts.get(name, 0) + 1
        key = (name, value)
        found = self.by_value.get(key)
        if found is None:
            number = self.next_index.get(name, 1)
            self.next_index[name] = number + 1
            found = f"⟦{name}:{number}⟧"
            self.by_value[key] = found
            self.new_lines.append(f"{found} = {json.dumps(value, ensure_ascii=False)}")
        return found


def _freeze_text(text: str, rules: tuple[FreezeRule, ...], state: _FreezeState, system: bool) -> str:
    """Replace the rules' matches by placeholders (never inside an existing placeholder), to a fixpoint."""
    for _ in range(64):
        before = text
        for rule in rules:
            pieces = PLACEHOLDER_RE.split(text)
            changed = False
            for index in range(0, len(pieces), 2):  # even indexes: plain text between placeholders
                piece = pieces[index]
                if not piece:
                    continue

                def substitute(match, name=rule.name):
                    value = match.group(0)
                    return state.placeholder(name, value) if value else value

                replaced = rule._regex.sub(substitute, piece)
                if replaced != piece:
                    pieces[index] = replaced
                    changed = True
            if changed:
                text = "".join(pieces)
        if text == before:
            return text
        text = text_rules(text, system, None, "")
    return text


def _render_block(lines: list[str]) -> str:
    return "\n".join([FREEZE_HEADER, *lines])


def _freeze_note(state: _FreezeState, where: str, target: str) -> str:
    counts = ", ".join(f"{name} ×{count}" for name, count in sorted(state.counts.items()))
    return f"freeze: {counts} in {where} replaced by placeholders; values in {target}"


def _is_values_message(message: dict) -> bool:
    """A system message that an earlier normalization added to carry the values of frozen segments."""
    content = message.get("content")
    return message["role"] in SYSTEM_ROLES and isinstance(content, str) and content.startswith(FREEZE_HEADER)


def freeze_chat(messages: list[dict], settings: NormalizerSettings, notes: Notes) -> None:
    block_end = 0
    while block_end < len(messages) and messages[block_end]["role"] in SYSTEM_ROLES and not _is_values_message(
        messages[block_end]
    ):
        block_end += 1
    if block_end == 0:
        return
    rules = settings.freeze_rules
    state = _FreezeState()
    # Where an earlier normalization put the values, if it did.
    existing_message = block_end < len(messages) and _is_values_message(messages[block_end])
    user = messages[block_end] if block_end < len(messages) and messages[block_end]["role"] == "user" else None
    existing_user_part = False
    if existing_message:
        state.learn_block(messages[block_end]["content"])
    elif user is not None:
        content = user.get("content")
        if isinstance(content, str) and content.startswith(FREEZE_HEADER):
            state.learn_block(content.split("\n\n", 1)[0])
            existing_user_part = True
        elif (isinstance(content, list) and content and content[0].get("type") == "text"
              and isinstance(content[0].get("text"), str) and content[0]["text"].startswith(FREEZE_HEADER)):
            state.learn_block(content[0]["text"])
            existing_user_part = True
    for message in messages[:block_end]:
        content = message.get("content")
        if isinstance(content, str):
            state.learn_text(content)
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    state.learn_text(part["text"])
    where = []
    for index, message in enumerate(messages[:block_end]):
        content = message.get("content")
        if isinstance(content, str):
            frozen = _freeze_text(content, rules, state, True)
            if frozen != content:
                message["content"] = frozen
                where.append(f"messages[{index}].content")
        elif isinstance(content, list):
            for part_index, part in enumerate(content):
                if part.get("type") == "text":
                    frozen = _freeze_text(part["text"], rules, state, True)
                    if frozen != part["text"]:
                        part["text"] = frozen
                        where.append(f"messages[{index}].content[{part_index}].text")
    if not state.new_lines:
        return
    where_text = ", ".join(where)
    if existing_message:
        target = messages[block_end]
        target["content"] = text_rules(target["content"] + "\n" + "\n".join(state.new_lines), True, None, "")
        notes.other.append(_freeze_note(state, where_text, f"messages[{block_end}] (appended)"))
        return
    if settings.freeze_placement == "first_user_message" and user is not None and (
        isinstance(user.get("content"), (str, list))
    ):
        content = user["content"]
        if isinstance(content, str):
            if existing_user_part:
                head, sep, rest = content.partition("\n\n")
                content = head + "\n" + "\n".join(state.new_lines) + sep + rest
            else:
                content = _render_block(state.new_lines) + ("\n\n" + content if content else "")
            user["content"] = text_rules(content, False, None, "")
        elif existing_user_part:
            content[0]["text"] = text_rules(content[0]["text"] + "\n" + "\n".join(state.new_lines), False, None, "")
        else:
            content.insert(0, {"type": "text", "text": text_rules(_render_block(state.new_lines), False, None, "")})
        notes.other.append(_freeze_note(state, where_text, f"the start of messages[{block_end}] (first user message)"))
        return
    role = messages[block_end - 1]["role"]
    messages.insert(block_end, {"role": role, "content": text_rules(_render_block(state.new_lines), True, None, "")})
    notes.other.append(_freeze_note(state, where_text, f"a new {role} message messages[{block_end}]"))


def freeze_prompt(text: str, settings: NormalizerSettings, notes: Notes, path: str) -> str:
    """Completion / LMI prompt: the shared head is everything before the last blank line."""
    state = _FreezeState()
    marker = text.find("\n\n" + FREEZE_HEADER)
    if marker >= 0:
        head, rest = text[:marker], text[marker + 2:]
        block, sep, tail = rest.partition("\n\n")
        state.learn_block(block)
    else:
        cut = text.rfind("\n\n")
        if cut <= 0:  # no blank line: no head to share, nothing is frozen (documented)
            return text
        head, block, sep, tail = text[:cut], "", "\n\n", text[cut + 2:]
    state.learn_text(head)
    frozen = _freeze_text(head, settings.freeze_rules, state, False)
    if not state.new_lines:
        return text
    block = block + "\n" + "\n".join(state.new_lines) if block else _render_block(state.new_lines)
    notes.other.append(_freeze_note(state, path + " (before its last blank line)", f"{path} before its last paragraph"))
    return text_rules(frozen + "\n\n" + block + (sep or "\n\n") + tail, False, None, "")
