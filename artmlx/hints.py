"""Directive hints as text: where a hint goes in the teacher's context (`learner/distill.py` uses it).

An environment returns a hint in `info["hint"]`; an agent calls `set_directive_hint(trajectory, hint)`
(or `trajectory.set_directive_hint(hint)` on artmlx's own `Trajectory`). The rollout turns it into the
teacher's prompt with `hinted_messages`, so actors, the ART adapter and the learner build the same one.
"""

from __future__ import annotations

HINT_TEMPLATE = "\n\n[user's hint / instruction]\n{hint}"
"""Appended to the last user message of the episode's opening (OpenClaw-RL's `openclaw-opd/` form)."""
HINT_FORMS = ("instruction", "system", "demonstration")
"""Where the hint goes (`hint_form` in the config): `instruction` appends it to the last user message in
OpenClaw-RL's form; `system` puts it in the system message (after an existing one's text, or as a new first
message), so the conversation itself reads exactly as the student saw it; `demonstration` takes the hint as a
reply that would have been right: the teacher sees it as the assistant's answer to the last user message, which
is then asked again (the teacher has seen a good answer, as SDFT's demonstration-conditioned teacher)."""
MAX_HINT_CHARS = 2000
"""Longer hints are cut: the teacher prompt must stay within the run's episode length."""
HINT_KEY = "directive_hint"
"""Where an agent's trajectory carries its hint: `trajectory.metadata[HINT_KEY]`."""


def set_directive_hint(trajectory, hint: str) -> None:
    """Give an agent's trajectory (ART's `art.Trajectory` or artmlx's own) a directive hint: what should have
    been different, in words. The learner then trains each sampled token toward what a teacher that reads the
    hint would have sampled (`learner/distill.py`). Its metadata carries it, so ART's own backends ignore it."""
    trajectory.metadata[HINT_KEY] = _checked(hint)


def hinted_messages(messages: list[dict], hint: str, form: str = "instruction") -> list[dict]:
    """`messages` with the hint placed as `form` says (`HINT_FORMS`; a copy, the original is kept)."""
    hint = _checked(hint)[:MAX_HINT_CHARS]
    out = [dict(m) for m in messages]
    if form == "system":
        if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
            out[0]["content"] = f"{out[0]['content']}\n\n{hint}" if out[0]["content"] else hint
        else:
            out.insert(0, {"role": "system", "content": hint})
        return out
    if form not in ("instruction", "demonstration"):
        raise ValueError(f"hint form must be one of {', '.join(HINT_FORMS)}, got {form!r}")
    for index in range(len(out) - 1, -1, -1):
        message = out[index]
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            if form == "demonstration":
                asked_again = [{"role": "assistant", "content": hint}, dict(message)]
                return out[: index + 1] + asked_again + out[index + 1:]
            message["content"] = message["content"] + HINT_TEMPLATE.format(hint=hint)
            return out
    raise ValueError("a hint needs a user message with text content to append to")


def _checked(hint) -> str:
    if not isinstance(hint, str) or not hint.strip():
        raise ValueError(f"a hint must be a non-empty string, got {hint!r:.80}")
    return hint
